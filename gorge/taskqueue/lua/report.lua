--! parts: packed_prelude helpers verdict insert followups archive_step fail_and_yield
-- KEYS: active (names the slot; every key comes from the base)
-- ARGV: [base, now, prune cutoff, lease owner ('' = unfenced), yield owner] as
--       JSON, then the reports as JSON [[member, step, value, followups?], ...]:
--       step as the report rule names it: complete (value: duration;
--       followups as insert_followups takes them, when there are some),
--       fail_permanent, fail_temporary (value: new expiry), yield (value:
--       new expiry)
-- Returns a JSON array, one answer per report: the task class ('' for a
-- yield), [task class, priority, children] for a complete that inserted
-- follow-ups, or '!conflict' / '!range' / '!notfound'.
local now, cutoff, owner, yield_owner = A[2], A[3], A[4], A[5]
local out = {}
for i, r in ipairs(cjson.decode(ARGV[2])) do
  local m, step, value = r[1], r[2], r[3]
  local key = task_key(m)
  local answer, children
  if step == 'complete' then
    answer, children = archive(key, m, step, value, now, cutoff, owner, r[4])
  elseif step == 'fail_permanent' then
    answer = archive(key, m, step, '0', now, cutoff, owner)
  elseif step == 'fail_temporary' then
    answer = fail_temporary(key, m, now, value, owner)
  else
    answer = yield_task(key, m, now, value, owner, yield_owner)
  end
  if type(answer) == 'table' and children and #children > 0 then
    out[i] = {answer['taskClass'] or '', answer['priority'], children}
  elseif type(answer) == 'table' then
    out[i] = answer['taskClass'] or ''
  elseif answer == 1 then
    out[i] = ''
  elseif answer then
    out[i] = answer
  else
    out[i] = '!notfound'
  end
end
return cjson.encode(out)
