-- The archive step (complete / permanent fail / cancel, ``step`` as the
-- report rule names them) of one task, for the single call and the batched
-- report.  Returns the archive row as a table (without the payload copy):
-- the one archived before for a replay, else the new one with the children
-- it inserted for ``followups`` (a list as insert_followups takes, or nil);
-- or what refused_answer gives for a refusal.  Every check and read comes
-- before the first write: Redis does not undo a script that fails, so a
-- refusal must leave nothing behind.  The children go in before the parent
-- leaves the active set, so a script the server stops half way can leave the
-- task to run again, never archived with its children lost.
local ARCHIVE_RESULTS = {archive_success = '0', archive_failure = '1', archive_cancelled = '2'}
local function archive(key, m, step, duration, now, cutoff, owner, followups)
  local archived_key, archived_idx = base .. 'archived:' .. id_of(m), base .. 'idx:archived'
  local counter_archived = base .. 'counter:archived'
  local verdict = report_verdict(step, key, m, owner)
  if verdict == 'replay' then
    local row = row_of(archived_key)
    row['data'] = nil
    return row
  end
  local result = ARCHIVE_RESULTS[verdict]
  if not result then return refused_answer(verdict) end
  local row = redis.call('HGETALL', key)
  local fields, failures, data_id, priority = {}, 0, nil, nil
  for i = 1, #row, 2 do
    local name, value = row[i], row[i + 1]
    if name == 'failureCount' then failures = tonumber(value) end
    if name == 'dataID' then data_id = value end
    if name == 'priority' then priority = value end
    -- The archive has no failureTime; dateModified is the archive time.
    if name ~= 'failureTime' and name ~= 'dateModified' then
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
  end
  for _, kv in ipairs({{'dateModified', now}, {'result', result},
                       {'duration', duration}, {'archivedEpoch', now}}) do
    fields[#fields + 1] = kv[1]
    fields[#fields + 1] = kv[2]
  end
  local data_key = base .. 'data:' .. (data_id or '')
  local payload = redis.call('GET', data_key) or ''
  local children = {}
  if followups and #followups > 0 then
    children = insert_followups(followups, priority, now)
  end
  redis.call('DEL', archived_key)
  redis.call('HSET', archived_key, 'data', payload, unpack(fields))
  redis.call('ZREM', base .. 'idx:active', m)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZREM', base .. 'idx:leased', m)
  redis.call('DEL', key)
  -- The archive record keeps the payload copy; the string would
  -- otherwise live forever.
  redis.call('DEL', data_key)
  redis.call('ZADD', archived_idx, now, m)
  redis.call('INCR', counter_archived)
  if failures > 0 then redis.call('DECR', base .. 'counter:failed') end
  -- Bounded retention: each archive call removes a few records older
  -- than the cutoff, which keeps up with any archive rate.
  if cutoff ~= '' then
    local old = redis.call('ZRANGEBYSCORE', archived_idx, '-inf', '(' .. cutoff, 'LIMIT', 0, 100)
    for _, o in ipairs(old) do
      redis.call('DEL', base .. 'archived:' .. id_of(o))
      redis.call('ZREM', archived_idx, o)
    end
    if #old > 0 then redis.call('DECRBY', counter_archived, #old) end
  end
  local archived = {}
  for i = 1, #fields, 2 do archived[fields[i]] = fields[i + 1] end
  return archived, children
end
