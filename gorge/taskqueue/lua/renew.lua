--! parts: prelude helpers
-- KEYS: leased, task...  (one task key per distinct id, in ARGV order)
-- ARGV: base, owner, exp, member...
-- Returns, per id, the lease expiry now stored, or '' when the lease is lost.
local owner, exp = ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'leaseOwner', 'leaseExpires')
  if f[1] == owner and owner ~= '' then
    local current = tonumber(f[2]) or 0
    if current < exp then
      redis.call('HSET', KEYS[i], 'leaseExpires', ARGV[3])
      redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i + 2])
      out[#out + 1] = ARGV[3]
    else
      out[#out + 1] = f[2]
    end
  else
    out[#out + 1] = ''
  end
end
return out
