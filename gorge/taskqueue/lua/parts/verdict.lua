-- The report rule (gorge/taskqueue/report_rule.py), read as a table: the
-- loader puts the verdict of every step, fence and kind of row in place of
-- the marker below, so the scripts decide exactly as the other backends do.
local REPORT_RULE = cjson.decode('@REPORT_RULE@')

-- The rule's verdict for ``step`` on the task under ``key`` (member ``m``),
-- fenced by ``owner`` unless it is ''.  The kind of row is what
-- report_rule.row_kind computes; only reads, so a refusal writes nothing.
local function report_verdict(step, key, m, owner)
  local fenced, kind = owner ~= '', nil
  if redis.call('EXISTS', key) == 1 then
    if not fenced or redis.call('HGET', key, 'leaseOwner') == owner then
      kind = 'active_held'
    else
      kind = 'active_other'
    end
  else
    local was = redis.call('HMGET', base .. 'archived:' .. id_of(m), 'result', 'leaseOwner')
    if not was[1] then
      kind = 'missing'
    elseif was[1] ~= '0' then
      kind = 'archived_unsuccessful'
    elseif not fenced or was[2] == owner then
      kind = 'archived_success_held'
    else
      kind = 'archived_success_other'
    end
  end
  local fence = 'unfenced'
  if fenced then fence = 'fenced' end
  return REPORT_RULE[step .. '/' .. fence .. '/' .. kind]
end

-- What a refusing verdict answers: the CONFLICT marker (redis_scripts.CONFLICT),
-- or false for a task that is not there.
local function refused_answer(verdict)
  if verdict == 'conflict' then return '!conflict' end
  return false
end
