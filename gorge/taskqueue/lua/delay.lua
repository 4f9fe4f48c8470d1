--! parts: prelude helpers active
-- KEYS: task, unleased, leased
-- ARGV: base, member, until, now
-- Returns the updated row as JSON, "archived", or nil.  A held or yielded
-- task loses its lease, as on free: its holder's next renewal answers lost.
local m = ARGV[2]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
redis.call('HSET', KEYS[1], 'leaseOwner', '', 'leaseExpires', ARGV[3], 'dateModified', ARGV[4])
redis.call('ZREM', KEYS[2], m)
redis.call('ZADD', KEYS[3], ARGV[3], m)
return cjson.encode((row_of(KEYS[1])))
