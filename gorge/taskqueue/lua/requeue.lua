--! parts: packed_prelude helpers
-- KEYS: archived record
-- ARGV: [base, member, now] as JSON
-- A new active task from an archived failure or cancel (the record stays);
-- returns the new task row as JSON, "active" / "succeeded" when refused, or
-- nil when the id is neither archived nor active.
local m, now = A[2], A[3]
local old, found = row_of(KEYS[1])
if not found then
  if redis.call('EXISTS', task_key(m)) == 1 then return 'active' end
  return false
end
if old['result'] == '0' then return 'succeeded' end
local data_id = redis.call('INCR', base .. 'next_data_id')
local task_id = redis.call('INCR', base .. 'next_task_id')
local n = string.format('%020d', task_id)
redis.call('SET', base .. 'data:' .. data_id, old['data'] or '')
local key = task_key(n)
redis.call('HSET', key,
  'id', id_of(n), 'taskClass', old['taskClass'], 'leaseOwner', '', 'leaseExpires', '',
  'failureCount', '0', 'dataID', data_id, 'failureTime', '', 'priority', old['priority'],
  'objectPHID', old['objectPHID'] or '', 'containerPHID', old['containerPHID'] or '',
  'dateCreated', now, 'dateModified', now)
redis.call('ZADD', base .. 'idx:active', old['priority'], n)
redis.call('ZADD', base .. 'idx:unleased', old['priority'], n)
return cjson.encode((row_of(key)))
