-- Operator verbs.  Shared check: nil when the task is active, "archived" when
-- only its archive record exists, false when neither.
local function not_active(m, key)
  if redis.call('EXISTS', key) == 1 then return nil end
  if redis.call('EXISTS', base .. 'archived:' .. id_of(m)) == 1 then return 'archived' end
  return false
end
