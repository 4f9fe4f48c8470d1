--! parts: prelude helpers
-- KEYS: active, leased, idx:archived, counter:failed
-- ARGV: base, now
local held = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf')) do
  local owner = redis.call('HGET', task_key(m), 'leaseOwner')
  if owner and owner ~= '' then held = held + 1 end
end
return {redis.call('ZCARD', KEYS[1]), held, redis.call('ZCARD', KEYS[3]),
        tonumber(redis.call('GET', KEYS[4]) or '0')}
