-- The key base, first of every script's arguments.
local base = ARGV[1]
