--! parts: packed_prelude helpers insert
-- KEYS: next_task_id
-- ARGV: [base, taskClass, priority, objectPHID, containerPHID,
--        delayUntil ('' = runnable now), now] as JSON, data
local data_id = redis.call('INCR', base .. 'next_data_id')
local task_id = redis.call('INCR', KEYS[1])
insert_task(task_id, data_id, A[2], A[3], A[4], A[5], A[6], A[7], ARGV[2])
return {task_id, data_id}
