--! parts: prelude helpers
-- KEYS: idx:archived
-- ARGV: base, first rank, page size, result ('' = any), class ('' = any), wanted
-- Reads one page of the archive, newest first (score = archive time, then id,
-- both descending), and returns {"next": rank to continue from or -1,
-- "rows": [matching records without the payload copy, at most `wanted`]}.
local start, count, wanted = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
local page = redis.call('ZREVRANGE', KEYS[1], start, start + count - 1)
local rows, scanned = {}, 0
for _, m in ipairs(page) do
  scanned = scanned + 1
  local key = base .. 'archived:' .. id_of(m)
  local f = redis.call('HMGET', key, 'result', 'taskClass')
  if f[1] and (ARGV[4] == '' or f[1] == ARGV[4]) and (ARGV[5] == '' or f[2] == ARGV[5]) then
    local row = row_of(key)
    row['data'] = nil
    rows[#rows + 1] = row
    if #rows >= wanted then break end
  end
end
local next_rank = start + scanned
if #rows < wanted and #page < count then next_rank = -1 end
local encoded = '[]'
if #rows > 0 then encoded = cjson.encode(rows) end
return '{"next":' .. next_rank .. ',"rows":' .. encoded .. '}'
