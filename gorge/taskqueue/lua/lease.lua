--! parts: packed_prelude helpers
-- KEYS: unleased
-- ARGV: [base, limit, owner, exp, now, batch, class...] as JSON
-- Returns a JSON array of the claimed rows, each with its payload as `data`.
local limit, owner, exp, now = tonumber(A[2]), A[3], A[4], A[5]
local batch = tonumber(A[6])
local leased = base .. 'idx:leased'
local allowed = nil
if #A > 6 then
  allowed = {}
  for i = 7, #A do allowed[A[i]] = true end
end
local picked, seen = {}, {}

-- Phase 1: never leased, in index order.  Read first, write after, so the
-- rank-based paging is not shifted by our own removals.
local start = 0
while #picked < limit do
  local page = redis.call('ZRANGE', KEYS[1], start, start + batch - 1)
  if #page == 0 then break end
  for _, m in ipairs(page) do
    local f = redis.call('HMGET', task_key(m), 'taskClass', 'leaseOwner', 'leaseExpires')
    if f[1] and (allowed == nil or allowed[f[1]]) and f[2] == '' and f[3] == '' then
      picked[#picked + 1] = m
      seen[m] = true
      if #picked >= limit then break end
    end
  end
  start = start + batch
end
for _, m in ipairs(picked) do
  redis.call('ZREM', KEYS[1], m)
end

-- Phase 2: expired strictly before now, by priority then id.
if #picked < limit then
  local expired = redis.call('ZRANGEBYSCORE', leased, '-inf', '(' .. now)
  local cands = {}
  for _, m in ipairs(expired) do
    if not seen[m] then
      local f = redis.call('HMGET', task_key(m), 'taskClass', 'priority', 'leaseExpires')
      if f[1] and (allowed == nil or allowed[f[1]]) and f[3] ~= ''
          and tonumber(f[3]) < tonumber(now) then
        cands[#cands + 1] = {tonumber(f[2]), m}
      end
    end
  end
  -- Padded members compare as strings in id order.
  table.sort(cands, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for i = 1, math.min(#cands, limit - #picked) do
    picked[#picked + 1] = cands[i][2]
  end
end

local out = {}
for _, m in ipairs(picked) do
  local key = task_key(m)
  redis.call('HSET', key, 'leaseOwner', owner, 'leaseExpires', exp)
  redis.call('ZADD', leased, exp, m)
  out[#out + 1] = with_payload(key)
end
if #out == 0 then return '[]' end
return cjson.encode(out)
