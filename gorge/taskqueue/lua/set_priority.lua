--! parts: prelude helpers active
-- KEYS: task, active, unleased
-- ARGV: base, member, priority, now
local m = ARGV[2]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
redis.call('HSET', KEYS[1], 'priority', ARGV[3], 'dateModified', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], m)
if redis.call('ZSCORE', KEYS[3], m) then redis.call('ZADD', KEYS[3], ARGV[3], m) end
return cjson.encode((row_of(KEYS[1])))
