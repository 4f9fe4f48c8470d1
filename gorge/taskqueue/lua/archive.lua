--! parts: packed_prelude helpers verdict insert followups archive_step
-- KEYS: task
-- ARGV: [base, member, step (complete, fail_permanent or cancel), duration,
--        now, prune cutoff ('' = keep archive records forever),
--        lease owner ('' = unfenced)] as JSON, then optionally the
--       follow-ups as JSON (as insert_followups takes them)
-- Returns the archive row as JSON (without the payload copy) or, with
-- follow-ups, [row, children] ({} for none: cjson's empty table); '!conflict'
-- when a fenced call finds the task held by someone else or archived, or nil
-- when the task is not active and no replay applies.
local followups = ARGV[2] and cjson.decode(ARGV[2])
local answer, children = archive(KEYS[1], A[2], A[3], A[4], A[5], A[6], A[7], followups)
if type(answer) == 'table' then
  if followups then return cjson.encode({answer, children or {}}) end
  return cjson.encode(answer)
end
return answer
