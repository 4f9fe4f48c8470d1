--! parts: prelude helpers
-- KEYS: active
-- ARGV: base, first rank, last rank
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3])) do
  local row, found = row_of(task_key(m))
  if found then out[#out + 1] = row end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
