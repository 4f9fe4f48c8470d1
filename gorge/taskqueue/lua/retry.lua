--! parts: packed_prelude helpers
-- KEYS: archived record
-- ARGV: [base, member, now, repeat ('1' or '0')] as JSON
-- Phorge's unarchiveTask(): the record becomes the active task again, its
-- payload copy the payload string.  Returns the row as JSON, "active",
-- "succeeded", or nil.
local m, now = A[2], A[3]
local key = task_key(m)
if redis.call('EXISTS', key) == 1 then return 'active' end
local old, found = row_of(KEYS[1])
if not found then return false end
if old['result'] == '0' and A[4] ~= '1' then return 'succeeded' end
redis.call('HSET', key,
  'id', id_of(m), 'taskClass', old['taskClass'], 'leaseOwner', '', 'leaseExpires', '0',
  'failureCount', '0', 'dataID', old['dataID'], 'failureTime', '', 'priority', old['priority'],
  'objectPHID', old['objectPHID'] or '', 'containerPHID', old['containerPHID'] or '',
  'dateCreated', old['dateCreated'], 'dateModified', now)
redis.call('SET', base .. 'data:' .. old['dataID'], old['data'] or '')
redis.call('ZADD', base .. 'idx:active', old['priority'], m)
redis.call('ZADD', base .. 'idx:leased', 0, m)
redis.call('DEL', KEYS[1])
redis.call('ZREM', base .. 'idx:archived', m)
redis.call('DECR', base .. 'counter:archived')
return cjson.encode((row_of(key)))
