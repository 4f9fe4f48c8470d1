-- The follow-ups of a complete, each [taskClass, priority ('' = the
-- parent's), objectPHID, containerPHID, delayUntil ('' = runnable now), data]:
-- inserted in order, answered as [[id, dataID], ...] (strings: cjson would
-- write a large number with an exponent).  Both ids are taken first, in one
-- step each, so a server that refuses the first write refuses everything.
local function insert_followups(followups, parent_priority, now)
  local n = #followups
  local last_task = redis.call('INCRBY', base .. 'next_task_id', n)
  local last_data = redis.call('INCRBY', base .. 'next_data_id', n)
  local children = {}
  for i, f in ipairs(followups) do
    local priority = f[2]
    if priority == '' then priority = parent_priority end
    local task_id, data_id = last_task - n + i, last_data - n + i
    insert_task(task_id, data_id, f[1], priority, f[3], f[4], f[5], now, f[6])
    children[i] = {string.format('%d', task_id), string.format('%d', data_id)}
  end
  return children
end
