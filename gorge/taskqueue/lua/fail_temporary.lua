--! parts: prelude helpers verdict fail_and_yield
-- KEYS: task
-- ARGV: base, member, now, expires, lease owner ('' = unfenced)
-- Returns the updated row as JSON, '!conflict', or nil when not active.
local answer = fail_temporary(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if type(answer) == 'table' then return cjson.encode(answer) end
return answer
