-- The hot scripts (enqueue, lease, archive, report) take their small
-- arguments as one JSON array of strings in ARGV[1] and one routing key,
-- deriving the other key names from the base: the client encodes every
-- argument in pure Python, and these calls run once per HTTP request.
local A = cjson.decode(ARGV[1])
local base = A[1]
