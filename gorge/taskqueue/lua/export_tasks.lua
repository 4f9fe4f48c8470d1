--! parts: prelude helpers
-- Moving tasks between backends.
-- KEYS: active
-- ARGV: base, member...
-- The active tasks among the members, with payloads, as one JSON array.
local out = {}
for i = 2, #ARGV do
  local key = task_key(ARGV[i])
  if redis.call('EXISTS', key) == 1 then out[#out + 1] = with_payload(key) end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
