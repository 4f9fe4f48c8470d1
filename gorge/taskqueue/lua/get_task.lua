--! parts: prelude helpers
-- KEYS: task
-- ARGV: base
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return cjson.encode(with_payload(KEYS[1]))
