-- KEYS: next_task_id, leased
-- ARGV: since, now
-- What held lease calls watch: the id sequence, and whether some task's
-- leaseExpires lies in [since, now).
local due = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '(' .. ARGV[2], 'LIMIT', 0, 1)
return {redis.call('GET', KEYS[1]) or '0', #due}
