--! parts: prelude helpers
-- KEYS: active
-- ARGV: base, member...
-- Removes the tasks (moved elsewhere) and their payloads; returns how many there were.
local gone = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  local key = task_key(m)
  local f = redis.call('HMGET', key, 'dataID', 'failureCount')
  if f[1] then
    redis.call('DEL', key)
    redis.call('DEL', base .. 'data:' .. f[1])
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', base .. 'idx:unleased', m)
    redis.call('ZREM', base .. 'idx:leased', m)
    if (tonumber(f[2]) or 0) > 0 then redis.call('DECR', base .. 'counter:failed') end
    gone = gone + 1
  end
end
return gone
