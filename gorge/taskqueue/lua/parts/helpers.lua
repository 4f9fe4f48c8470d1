-- Shared Lua helpers.  Index members are zero-padded ids; hash keys use the
-- plain id, recovered by stripping the padding (never via tonumber/tostring,
-- which would switch to exponent notation for large numbers).  Rows travel
-- back as one JSON string: the client parses RESP in pure Python, and one
-- bulk string per reply instead of one per field makes a 100-task lease
-- several times cheaper.
local function id_of(m)
  return (string.match(m, '^0*(%d+)$'))
end
local function task_key(m)
  return base .. 'task:' .. id_of(m)
end
local function row_of(key)
  local flat, row = redis.call('HGETALL', key), {}
  for i = 1, #flat, 2 do row[flat[i]] = flat[i + 1] end
  return row, #flat > 0
end
local function with_payload(key)
  local row = row_of(key)
  row['data'] = redis.call('GET', base .. 'data:' .. (row['dataID'] or '')) or ''
  return row
end
