--! parts: prelude helpers active
-- KEYS: task, unleased, leased
-- ARGV: base, member, now
local m, now = ARGV[2], ARGV[3]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
if redis.call('HGET', KEYS[1], 'leaseOwner') == '' then return 'not_leased' end
redis.call('HSET', KEYS[1], 'leaseOwner', '', 'leaseExpires', now, 'dateModified', now)
redis.call('ZREM', KEYS[2], m)
redis.call('ZADD', KEYS[3], now, m)
return cjson.encode((row_of(KEYS[1])))
