-- Temporary failure and yield of one task, for the single calls and the
-- batched report.  ``expires`` is OUT_OF_RANGE ('!range',
-- redis_scripts.OUT_OF_RANGE) when the computed expiry does not fit the
-- column: answered after the refusals, as the other backends do.
-- A temporary failure answers the updated row (a table), a yield 1.
local function fail_temporary(key, m, now, expires, owner)
  local verdict = report_verdict('fail_temporary', key, m, owner)
  if verdict ~= 'retry_later' then return refused_answer(verdict) end
  if expires == '!range' then return expires end
  local failures = tonumber(redis.call('HGET', key, 'failureCount')) or 0
  redis.call('HSET', key, 'failureCount', failures + 1, 'failureTime', now,
    'leaseOwner', '', 'leaseExpires', expires, 'dateModified', now)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZADD', base .. 'idx:leased', expires, m)
  if failures == 0 then redis.call('INCR', base .. 'counter:failed') end
  return (row_of(key))
end
local function yield_task(key, m, now, expires, owner, yield_owner)
  local verdict = report_verdict('yield', key, m, owner)
  if verdict ~= 'yield' then return refused_answer(verdict) end
  if expires == '!range' then return expires end
  redis.call('HSET', key, 'leaseOwner', yield_owner, 'leaseExpires', expires,
    'dateModified', now)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZADD', base .. 'idx:leased', expires, m)
  return 1
end
