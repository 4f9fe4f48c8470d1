-- A new active task under ids the caller took from the sequences, for
-- enqueue and for the follow-ups of a complete.  ``delay`` '' = runnable now.
local function insert_task(task_id, data_id, task_class, priority, object_phid,
                           container_phid, delay, now, data)
  local m = string.format('%020d', task_id)
  redis.call('SET', base .. 'data:' .. data_id, data)
  redis.call('HSET', task_key(m),
    'id', id_of(m), 'taskClass', task_class, 'leaseOwner', '', 'leaseExpires', delay,
    'failureCount', '0', 'dataID', data_id, 'failureTime', '', 'priority', priority,
    'objectPHID', object_phid, 'containerPHID', container_phid,
    'dateCreated', now, 'dateModified', now)
  redis.call('ZADD', base .. 'idx:active', priority, m)
  if delay == '' then
    redis.call('ZADD', base .. 'idx:unleased', priority, m)
  else
    redis.call('ZADD', base .. 'idx:leased', delay, m)
  end
end
