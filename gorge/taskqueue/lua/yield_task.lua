--! parts: prelude helpers verdict fail_and_yield
-- KEYS: task
-- ARGV: base, member, now, expires, lease owner ('' = unfenced), yield owner
return yield_task(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
