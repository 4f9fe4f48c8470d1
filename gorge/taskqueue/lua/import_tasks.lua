--! parts: prelude helpers
-- KEYS: next_task_id
-- ARGV: base, tasks as JSON [[taskClass, leaseOwner, leaseExpires, failureCount,
--       failureTime, priority, objectPHID, containerPHID, dateCreated,
--       dateModified, data], ...] (every value a string, NULL = ''),
--       ledger name, mark
-- New tasks with every column kept but id and dataID, and the ledger mark,
-- in one step.  Returns the new ids.
local ids = {}
for _, t in ipairs(cjson.decode(ARGV[2])) do
  local data_id = redis.call('INCR', base .. 'next_data_id')
  local m = string.format('%020d', redis.call('INCR', KEYS[1]))
  local key = task_key(m)
  redis.call('SET', base .. 'data:' .. data_id, t[11])
  redis.call('HSET', key,
    'id', id_of(m), 'taskClass', t[1], 'leaseOwner', t[2], 'leaseExpires', t[3],
    'failureCount', t[4], 'dataID', data_id, 'failureTime', t[5], 'priority', t[6],
    'objectPHID', t[7], 'containerPHID', t[8], 'dateCreated', t[9], 'dateModified', t[10])
  redis.call('ZADD', base .. 'idx:active', t[6], m)
  if t[2] == '' and t[3] == '' then
    redis.call('ZADD', base .. 'idx:unleased', t[6], m)
  elseif t[3] ~= '' then
    redis.call('ZADD', base .. 'idx:leased', t[3], m)
  end
  if tonumber(t[4]) > 0 then redis.call('INCR', base .. 'counter:failed') end
  ids[#ids + 1] = id_of(m)
end
redis.call('SET', base .. 'migrated:' .. ARGV[3], ARGV[4])
return ids
