--! parts: prelude helpers
-- KEYS: leased
-- ARGV: base, owner, leaseExpires, now, member...
-- A claim whose caller went away before the answer: break exactly the leases
-- it took (owner and expiry), as free.lua does.
local n = 0
for i = 5, #ARGV do
  local key = task_key(ARGV[i])
  local f = redis.call('HMGET', key, 'leaseOwner', 'leaseExpires')
  if f[1] == ARGV[2] and f[2] == ARGV[3] then
    redis.call('HSET', key, 'leaseOwner', '', 'leaseExpires', ARGV[4])
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[i])
    n = n + 1
  end
end
return n
