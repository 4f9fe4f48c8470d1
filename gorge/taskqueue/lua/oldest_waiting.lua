--! parts: prelude helpers
-- KEYS: unleased, leased
-- ARGV: base, now, head rows, most priorities
-- The heads of the queue (gorge/taskqueue/waiting.py): the first rows of each
-- priority never leased, then the first rows whose leaseExpires passed.
-- Returns a JSON array of [taskClass, priority, waiting since], as strings.
local now, rows, most = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local low = '-inf'
for _ = 1, most do
  local first = redis.call('ZRANGEBYSCORE', KEYS[1], low, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #first == 0 then break end
  local priority = first[2]
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], priority, priority,
                                'LIMIT', 0, rows)) do
    local f = redis.call('HMGET', task_key(m), 'taskClass', 'priority', 'dateCreated')
    if f[1] and f[3] and f[3] ~= '' then out[#out + 1] = f end
  end
  low = '(' .. priority
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. now,
                              'LIMIT', 0, rows)) do
  local f = redis.call('HMGET', task_key(m), 'taskClass', 'priority', 'leaseExpires',
                       'dateCreated')
  if f[1] and f[3] and f[3] ~= '' and tonumber(f[3]) < now then
    -- Waiting since the expiry, never since before the task was created: a
    -- retry (Phorge's unarchive) sets leaseExpires to 0.
    local since = math.max(tonumber(f[3]), tonumber(f[4]) or 0)
    out[#out + 1] = {f[1], f[2], tostring(since)}
  end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
