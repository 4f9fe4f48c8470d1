--! parts: prelude helpers
-- KEYS: leased, task...  (one task key per distinct id, in ARGV order)
-- ARGV: base, ago, yield owner, member...
local ago = ARGV[2]
local changed = 0
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'leaseOwner', 'leaseExpires', 'failureCount')
  if f[1] == ARGV[3] and f[2] and f[2] ~= '' and tonumber(f[2]) > tonumber(ago)
      and tonumber(f[3]) == 0 then
    redis.call('HSET', KEYS[i], 'leaseExpires', ago)
    -- Stays in the leased index: an awakened yield is taken in phase 2,
    -- exactly as in MySQL.
    redis.call('ZADD', KEYS[1], ago, ARGV[i + 2])
    changed = changed + 1
  end
end
return changed
