"""The Redis TaskStore: hashes, sorted sets and Lua.

Every change that touches more than one key runs as one Lua script, so a
concurrent caller never sees half of it.  "now" comes from the injected clock
and is passed to the scripts; Redis' own clock is never read.

Key layout, ``B`` being the key base derived from the prefix
(:func:`key_base`):

* ``B task:{id}`` hash, ``B data:{dataID}`` string, ``B archived:{id}`` hash;
* ``B idx:active`` / ``B idx:unleased`` (score = priority),
  ``B idx:leased`` (score = leaseExpires), ``B idx:archived``
  (score = archivedEpoch);
* ``B next_task_id``, ``B next_data_id``, ``B counter:archived``,
  ``B counter:failed``.

The prefix is used verbatim (``gorge:tq:task:17``), as in the reference, so
an existing single-instance queue keeps its keys.  On a Redis Cluster
the operator picks a prefix that is a hash tag (``{gorge:tq}:``): every key of
the queue then lies in one slot, and every script declares at least one key
so the Cluster can route it.

One deliberate departure from the reference layout:

* Index members are ids zero-padded to 20 digits and the score of
  ``idx:active``/``idx:unleased`` is the bare priority: Redis orders equal
  scores by member, so ``priority ASC, id ASC`` holds exactly for every
  unsigned 32-bit priority, where the reference's ``priority * 10^12 + id``
  double loses FIFO order above priority ~9000.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.config import ConfigError
from gorge.db import redis as gredis
from gorge.log.logger import Logger
from gorge.taskqueue.model import (
    ACTIVE_NOT_ARCHIVED,
    ARCHIVE_COLUMNS,
    ARCHIVED_NOT_ACTIVE,
    AWAKEN_WINDOW,
    LEASED,
    MIN_YIELD,
    NOT_LEASED,
    REPORT_COMPLETE,
    REPORT_FAIL,
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    SUCCEEDED,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
    Stats,
    Task,
    archived_from_columns,
    check_u32,
    sort_key,
    task_from_columns,
)
from gorge.taskqueue.store import (
    LeaseConflict,
    TaskNotFound,
    TaskStateError,
    log_handed_back,
    outliving_caller,
)

log = Logger()

DEFAULT_KEY_PREFIX = "gorge:tq:"
DEFAULT_OP_TIMEOUT = 10.0
MEMBER_WIDTH = 20
# A filtered phase 1 reads the unleased index in pages of this many ids.
SCAN_BATCH = 200
# Archive records read per script call when listing dead tasks.
ARCHIVE_PAGE = 500
_INT64_MAX = 2**63 - 1
# How long closing waits for leases being given back.
GIVE_BACK_BUDGET = 2.0


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes when it has a tag, else None.

    Redis' rule: the text between the first ``{`` and the first ``}`` after it,
    when that text is non-empty.
    """
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def key_base(prefix: str) -> str:
    """The string every key of this queue starts with: the prefix itself.

    Raises ValueError for a prefix whose first ``{`` does not open a non-empty
    tag closed inside the prefix: the operator meant a Cluster hash tag, but
    the keys' slot would then depend on the suffix and a script's keys could
    land on different Cluster nodes.
    """
    if "{" not in prefix:
        return prefix
    if hash_tag(prefix) is None:
        raise ValueError("the first '{' must open a non-empty hash tag closed by '}'")
    return prefix


def member(task_id: int) -> str:
    """Sorted-set member for an id: fixed width so equal scores sort by id."""
    return f"{task_id:0{MEMBER_WIDTH}d}"


class Keys:
    """Names of one queue's keys."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.base = key_base(prefix)
        b = self.base
        self.active = b + "idx:active"
        self.unleased = b + "idx:unleased"
        self.leased = b + "idx:leased"
        self.archived_idx = b + "idx:archived"
        self.next_task_id = b + "next_task_id"
        self.next_data_id = b + "next_data_id"
        self.counter_archived = b + "counter:archived"
        self.counter_failed = b + "counter:failed"

    def task(self, task_id: int) -> str:
        return f"{self.base}task:{task_id}"

    def data(self, data_id: int) -> str:
        return f"{self.base}data:{data_id}"

    def archived(self, task_id: int) -> str:
        return f"{self.base}archived:{task_id}"

    def migrated(self, ledger: str) -> str:
        """The watermark of a migration into this queue (docs/taskqueue.md)."""
        return f"{self.base}migrated:{ledger}"


# Shared Lua helpers.  Index members are zero-padded ids; hash keys use the
# plain id, recovered by stripping the padding (never via tonumber/tostring,
# which would switch to exponent notation for large numbers).  Rows travel
# back as one JSON string: the client parses RESP in pure Python, and one
# bulk string per reply instead of one per field makes a 100-task lease
# several times cheaper.
_LUA_HELPERS = """local function id_of(m)
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
"""

_LUA_PRELUDE = "\nlocal base = ARGV[1]\n" + _LUA_HELPERS

# A script's answer for a fenced call whose owner no longer holds the task.
CONFLICT = "!conflict"

# The hot scripts (enqueue, lease, archive) take their small arguments as one
# JSON array of strings in ARGV[1] and one routing key, deriving the other
# key names from the base: the client encodes every argument in pure
# Python, and these calls run once per HTTP request.
_LUA_PACKED_PRELUDE = "\nlocal A = cjson.decode(ARGV[1])\nlocal base = A[1]\n" + _LUA_HELPERS


# A new active task under ids the caller took from the sequences, for
# enqueue and for the follow-ups of a complete.  ``delay`` '' = runnable now.
_LUA_INSERT = """
local function insert_task(task_id, data_id, task_class, priority, object_phid,
                           container_phid, delay, now, data)
  local m = string.format('%020d', task_id)
  redis.call('SET', base .. 'data:' .. data_id, data)
  redis.call('HSET', task_key(m),
    'id', id_of(m), 'taskClass', task_class, 'leaseOwner', '', 'leaseExpires', delay,
    'failureCount', '0', 'dataID', data_id, 'failureTime', '', 'priority', priority,
    'objectPHID', object_phid, 'containerPHID', container_phid,
    'dateCreated', now, 'dateModified', now)
  redis.call('ZADD', base .. 'idx:active', priority, m)
  if delay == '' then
    redis.call('ZADD', base .. 'idx:unleased', priority, m)
  else
    redis.call('ZADD', base .. 'idx:leased', delay, m)
  end
end
"""

# KEYS: next_task_id
# ARGV: [base, taskClass, priority, objectPHID, containerPHID,
#        delayUntil ('' = runnable now), now] as JSON, data
ENQUEUE = (
    _LUA_PACKED_PRELUDE
    + _LUA_INSERT
    + """
local data_id = redis.call('INCR', base .. 'next_data_id')
local task_id = redis.call('INCR', KEYS[1])
insert_task(task_id, data_id, A[2], A[3], A[4], A[5], A[6], A[7], ARGV[2])
return {task_id, data_id}
"""
)

# KEYS: unleased
# ARGV: [base, limit, owner, exp, now, batch, class...] as JSON
# Returns a JSON array of the claimed rows, each with its payload as `data`.
LEASE = (
    _LUA_PACKED_PRELUDE
    + """
local limit, owner, exp, now = tonumber(A[2]), A[3], A[4], A[5]
local batch = tonumber(A[6])
local leased = base .. 'idx:leased'
local allowed = nil
if #A > 6 then
  allowed = {}
  for i = 7, #A do allowed[A[i]] = true end
end
local picked, seen = {}, {}

-- Phase 1: never leased, in index order.  Read first, write after, so the
-- rank-based paging is not shifted by our own removals.
local start = 0
while #picked < limit do
  local page = redis.call('ZRANGE', KEYS[1], start, start + batch - 1)
  if #page == 0 then break end
  for _, m in ipairs(page) do
    local f = redis.call('HMGET', task_key(m), 'taskClass', 'leaseOwner', 'leaseExpires')
    if f[1] and (allowed == nil or allowed[f[1]]) and f[2] == '' and f[3] == '' then
      picked[#picked + 1] = m
      seen[m] = true
      if #picked >= limit then break end
    end
  end
  start = start + batch
end
for _, m in ipairs(picked) do
  redis.call('ZREM', KEYS[1], m)
end

-- Phase 2: expired strictly before now, by priority then id.
if #picked < limit then
  local expired = redis.call('ZRANGEBYSCORE', leased, '-inf', '(' .. now)
  local cands = {}
  for _, m in ipairs(expired) do
    if not seen[m] then
      local f = redis.call('HMGET', task_key(m), 'taskClass', 'priority', 'leaseExpires')
      if f[1] and (allowed == nil or allowed[f[1]]) and f[3] ~= ''
          and tonumber(f[3]) < tonumber(now) then
        cands[#cands + 1] = {tonumber(f[2]), m}
      end
    end
  end
  -- Padded members compare as strings in id order.
  table.sort(cands, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for i = 1, math.min(#cands, limit - #picked) do
    picked[#picked + 1] = cands[i][2]
  end
end

local out = {}
for _, m in ipairs(picked) do
  local key = task_key(m)
  redis.call('HSET', key, 'leaseOwner', owner, 'leaseExpires', exp)
  redis.call('ZADD', leased, exp, m)
  out[#out + 1] = with_payload(key)
end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""
)

# A batched report's answer for a computed expiry out of range, and for an
# id that is not active (and no replay applies).
OUT_OF_RANGE = "!range"
NOT_FOUND = "!notfound"

# The follow-ups of a complete, each [taskClass, priority ('' = the
# parent's), objectPHID, containerPHID, delayUntil ('' = runnable now), data]:
# inserted in order, answered as [[id, dataID], ...] (strings: cjson would
# write a large number with an exponent).  Both ids are taken first, in one
# step each, so a server that refuses the first write refuses everything.
_LUA_FOLLOWUPS = (
    _LUA_INSERT
    + """
local function insert_followups(followups, parent_priority, now)
  local n = #followups
  local last_task = redis.call('INCRBY', base .. 'next_task_id', n)
  local last_data = redis.call('INCRBY', base .. 'next_data_id', n)
  local children = {}
  for i, f in ipairs(followups) do
    local priority = f[2]
    if priority == '' then priority = parent_priority end
    local task_id, data_id = last_task - n + i, last_data - n + i
    insert_task(task_id, data_id, f[1], priority, f[3], f[4], f[5], now, f[6])
    children[i] = {string.format('%d', task_id), string.format('%d', data_id)}
  end
  return children
end
"""
)

# The archive step (complete / permanent fail / cancel) of one task, for the
# single call and the batched report.  Returns the archive row as a table
# (without the payload copy), CONFLICT when a fenced call finds the task held
# by someone else or archived, or false when the task is not active and no
# replay applies; a fresh archive also returns the children it inserted for
# ``followups`` (a list as insert_followups takes, or nil).  Every check and
# read comes before the first write: Redis does not undo a script that
# fails, so a refusal must leave nothing behind.  The children go in before
# the parent leaves the active set, so a script the server stops half way
# can leave the task to run again, never archived with its children lost.
_LUA_ARCHIVE = (
    _LUA_FOLLOWUPS
    + """
local function archive(key, m, result, duration, now, replay, cutoff, owner, followups)
  local archived_key, archived_idx = base .. 'archived:' .. id_of(m), base .. 'idx:archived'
  local counter_archived = base .. 'counter:archived'
  if redis.call('EXISTS', key) == 0 then
    local was = redis.call('HMGET', archived_key, 'result', 'leaseOwner')
    if replay and was[1] == '0' and (owner == '' or was[2] == owner) then
      local row = row_of(archived_key)
      row['data'] = nil
      return row
    end
    if owner ~= '' and was[1] then return '"""
    + CONFLICT
    + """' end
    return false
  end
  if owner ~= '' and redis.call('HGET', key, 'leaseOwner') ~= owner then
    return '"""
    + CONFLICT
    + """'
  end
  local row = redis.call('HGETALL', key)
  local fields, failures, data_id, priority = {}, 0, nil, nil
  for i = 1, #row, 2 do
    local name, value = row[i], row[i + 1]
    if name == 'failureCount' then failures = tonumber(value) end
    if name == 'dataID' then data_id = value end
    if name == 'priority' then priority = value end
    -- The archive has no failureTime; dateModified is the archive time.
    if name ~= 'failureTime' and name ~= 'dateModified' then
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
  end
  for _, kv in ipairs({{'dateModified', now}, {'result', result},
                       {'duration', duration}, {'archivedEpoch', now}}) do
    fields[#fields + 1] = kv[1]
    fields[#fields + 1] = kv[2]
  end
  local data_key = base .. 'data:' .. (data_id or '')
  local payload = redis.call('GET', data_key) or ''
  local children = {}
  if followups and #followups > 0 then
    children = insert_followups(followups, priority, now)
  end
  redis.call('DEL', archived_key)
  redis.call('HSET', archived_key, 'data', payload, unpack(fields))
  redis.call('ZREM', base .. 'idx:active', m)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZREM', base .. 'idx:leased', m)
  redis.call('DEL', key)
  -- The archive record keeps the payload copy; the string would
  -- otherwise live forever.
  redis.call('DEL', data_key)
  redis.call('ZADD', archived_idx, now, m)
  redis.call('INCR', counter_archived)
  if failures > 0 then redis.call('DECR', base .. 'counter:failed') end
  -- Bounded retention: each archive call removes a few records older
  -- than the cutoff, which keeps up with any archive rate.
  if cutoff ~= '' then
    local old = redis.call('ZRANGEBYSCORE', archived_idx, '-inf', '(' .. cutoff, 'LIMIT', 0, 100)
    for _, o in ipairs(old) do
      redis.call('DEL', base .. 'archived:' .. id_of(o))
      redis.call('ZREM', archived_idx, o)
    end
    if #old > 0 then redis.call('DECRBY', counter_archived, #old) end
  end
  local archived = {}
  for i = 1, #fields, 2 do archived[fields[i]] = fields[i + 1] end
  return archived, children
end
"""
)

# KEYS: leased
# ARGV: base, owner, leaseExpires, now, member...
# A claim whose caller went away before the answer: break exactly the leases
# it took (owner and expiry), as FREE does.
GIVE_BACK = (
    _LUA_PRELUDE
    + """
local n = 0
for i = 5, #ARGV do
  local key = task_key(ARGV[i])
  local f = redis.call('HMGET', key, 'leaseOwner', 'leaseExpires')
  if f[1] == ARGV[2] and f[2] == ARGV[3] then
    redis.call('HSET', key, 'leaseOwner', '', 'leaseExpires', ARGV[4])
    redis.call('ZADD', KEYS[1], ARGV[4], ARGV[i])
    n = n + 1
  end
end
return n
"""
)

# KEYS: task
# ARGV: [base, member, result, duration, now, replay ('1' = complete),
#        prune cutoff ('' = keep archive records forever),
#        lease owner ('' = unfenced)] as JSON, then optionally the
#       follow-ups as JSON (see _LUA_FOLLOWUPS)
# Returns the archive row as JSON (without the payload copy) or, with
# follow-ups, [row, children] ({} for none: cjson's empty table); CONFLICT
# when a fenced call finds the task held by someone else or archived, or nil
# when the task is not active and no replay applies.
ARCHIVE = (
    _LUA_PACKED_PRELUDE
    + _LUA_ARCHIVE
    + """
local followups = ARGV[2] and cjson.decode(ARGV[2])
local answer, children = archive(KEYS[1], A[2], A[3], A[4], A[5], A[6] == '1', A[7], A[8],
                                 followups)
if type(answer) == 'table' then
  if followups then return cjson.encode({answer, children or {}}) end
  return cjson.encode(answer)
end
return answer
"""
)

# Shared by the fenced steps: nil when the task may change, false when it is
# not active and not fenced-archived, CONFLICT when fenced and not held by
# the owner.
_LUA_FENCE = (
    """
local function refused(m, task_key_name, owner)
  if redis.call('EXISTS', task_key_name) == 0 then
    if owner ~= '' and redis.call('EXISTS', base .. 'archived:' .. id_of(m)) == 1 then
      return '"""
    + CONFLICT
    + """'
    end
    return false
  end
  if owner ~= '' and redis.call('HGET', task_key_name, 'leaseOwner') ~= owner then
    return '"""
    + CONFLICT
    + """'
  end
  return nil
end
"""
)

# Temporary failure and yield of one task, for the single calls and the
# batched report.  ``expires`` is OUT_OF_RANGE when the computed expiry does
# not fit the column: answered after the refusals, as the other backends do.
# A temporary failure answers the updated row (a table), a yield 1.
_LUA_FAIL_AND_YIELD = (
    _LUA_FENCE
    + """
local function fail_temporary(key, m, now, expires, owner)
  local refusal = refused(m, key, owner)
  if refusal ~= nil then return refusal end
  if expires == '"""
    + OUT_OF_RANGE
    + """' then return expires end
  local failures = tonumber(redis.call('HGET', key, 'failureCount')) or 0
  redis.call('HSET', key, 'failureCount', failures + 1, 'failureTime', now,
    'leaseOwner', '', 'leaseExpires', expires, 'dateModified', now)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZADD', base .. 'idx:leased', expires, m)
  if failures == 0 then redis.call('INCR', base .. 'counter:failed') end
  return (row_of(key))
end
local function yield_task(key, m, now, expires, owner, yield_owner)
  local refusal = refused(m, key, owner)
  if refusal ~= nil then return refusal end
  if expires == '"""
    + OUT_OF_RANGE
    + """' then return expires end
  redis.call('HSET', key, 'leaseOwner', yield_owner, 'leaseExpires', expires,
    'dateModified', now)
  redis.call('ZREM', base .. 'idx:unleased', m)
  redis.call('ZADD', base .. 'idx:leased', expires, m)
  return 1
end
"""
)

# KEYS: task
# ARGV: base, member, now, expires, lease owner ('' = unfenced)
# Returns the updated row as JSON, CONFLICT, or nil when not active.
FAIL_TEMPORARY = (
    _LUA_PRELUDE
    + _LUA_FAIL_AND_YIELD
    + """
local answer = fail_temporary(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if type(answer) == 'table' then return cjson.encode(answer) end
return answer
"""
)

# KEYS: task
# ARGV: base, member, now, expires, lease owner ('' = unfenced), yield owner
YIELD = (
    _LUA_PRELUDE
    + _LUA_FAIL_AND_YIELD
    + """
return yield_task(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
"""
)

# KEYS: active (names the slot; every key comes from the base)
# ARGV: [base, now, prune cutoff, lease owner ('' = unfenced), yield owner] as
#       JSON, then the reports as JSON [[member, kind, value, followups?], ...]:
#       kind "c" complete (value: duration; followups as _LUA_FOLLOWUPS takes
#       them, when there are some), "p" permanent failure, "t" temporary
#       failure (value: new expiry), "y" yield (value: new expiry)
# Returns a JSON array, one answer per report: the task class ('' for a
# yield), [task class, priority, children] for a complete that inserted
# follow-ups,
# or CONFLICT / OUT_OF_RANGE / NOT_FOUND.
REPORT = (
    _LUA_PACKED_PRELUDE
    + _LUA_ARCHIVE
    + _LUA_FAIL_AND_YIELD
    + """
local now, cutoff, owner, yield_owner = A[2], A[3], A[4], A[5]
local out = {}
for i, r in ipairs(cjson.decode(ARGV[2])) do
  local m, kind, value = r[1], r[2], r[3]
  local key = task_key(m)
  local answer, children
  if kind == 'c' then
    answer, children = archive(key, m, '0', value, now, true, cutoff, owner, r[4])
  elseif kind == 'p' then
    answer = archive(key, m, '1', '0', now, false, cutoff, owner)
  elseif kind == 't' then
    answer = fail_temporary(key, m, now, value, owner)
  else
    answer = yield_task(key, m, now, value, owner, yield_owner)
  end
  if type(answer) == 'table' and children and #children > 0 then
    out[i] = {answer['taskClass'] or '', answer['priority'], children}
  elseif type(answer) == 'table' then
    out[i] = answer['taskClass'] or ''
  elseif answer == 1 then
    out[i] = ''
  elseif answer then
    out[i] = answer
  else
    out[i] = '"""
    + NOT_FOUND
    + """'
  end
end
return cjson.encode(out)
"""
)

# KEYS: leased, task...  (one task key per distinct id, in ARGV order)
# ARGV: base, ago, yield owner, member...
AWAKEN = (
    _LUA_PRELUDE
    + """
local ago = ARGV[2]
local changed = 0
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'leaseOwner', 'leaseExpires', 'failureCount')
  if f[1] == ARGV[3] and f[2] and f[2] ~= '' and tonumber(f[2]) > tonumber(ago)
      and tonumber(f[3]) == 0 then
    redis.call('HSET', KEYS[i], 'leaseExpires', ago)
    -- Stays in the leased index: an awakened yield is taken in phase 2,
    -- exactly as in MySQL.
    redis.call('ZADD', KEYS[1], ago, ARGV[i + 2])
    changed = changed + 1
  end
end
return changed
"""
)

# KEYS: leased, task...  (one task key per distinct id, in ARGV order)
# ARGV: base, owner, exp, member...
# Returns, per id, the lease expiry now stored, or '' when the lease is lost.
RENEW = (
    _LUA_PRELUDE
    + """
local owner, exp = ARGV[2], tonumber(ARGV[3])
local out = {}
for i = 2, #KEYS do
  local f = redis.call('HMGET', KEYS[i], 'leaseOwner', 'leaseExpires')
  if f[1] == owner and owner ~= '' then
    local current = tonumber(f[2]) or 0
    if current < exp then
      redis.call('HSET', KEYS[i], 'leaseExpires', ARGV[3])
      redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i + 2])
      out[#out + 1] = ARGV[3]
    else
      out[#out + 1] = f[2]
    end
  else
    out[#out + 1] = ''
  end
end
return out
"""
)

# KEYS: idx:archived
# ARGV: base, first rank, page size, result ('' = any), class ('' = any), wanted
# Reads one page of the archive, newest first (score = archive time, then id,
# both descending), and returns {"next": rank to continue from or -1,
# "rows": [matching records without the payload copy, at most `wanted`]}.
LIST_ARCHIVED = (
    _LUA_PRELUDE
    + """
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
"""
)

# KEYS: archived record
# ARGV: [base, member, now] as JSON
# A new active task from an archived failure or cancel (the record stays);
# returns the new task row as JSON, "active" / "succeeded" when refused, or
# nil when the id is neither archived nor active.
REQUEUE = (
    _LUA_PACKED_PRELUDE
    + """
local m, now = A[2], A[3]
local old, found = row_of(KEYS[1])
if not found then
  if redis.call('EXISTS', task_key(m)) == 1 then return 'active' end
  return false
end
if old['result'] == '0' then return 'succeeded' end
local data_id = redis.call('INCR', base .. 'next_data_id')
local task_id = redis.call('INCR', base .. 'next_task_id')
local n = string.format('%020d', task_id)
redis.call('SET', base .. 'data:' .. data_id, old['data'] or '')
local key = task_key(n)
redis.call('HSET', key,
  'id', id_of(n), 'taskClass', old['taskClass'], 'leaseOwner', '', 'leaseExpires', '',
  'failureCount', '0', 'dataID', data_id, 'failureTime', '', 'priority', old['priority'],
  'objectPHID', old['objectPHID'] or '', 'containerPHID', old['containerPHID'] or '',
  'dateCreated', now, 'dateModified', now)
redis.call('ZADD', base .. 'idx:active', old['priority'], n)
redis.call('ZADD', base .. 'idx:unleased', old['priority'], n)
return cjson.encode((row_of(key)))
"""
)

# Operator verbs.  Shared check: nil when the task is active, "archived" when
# only its archive record exists, false when neither.
_LUA_ACTIVE = """
local function not_active(m, key)
  if redis.call('EXISTS', key) == 1 then return nil end
  if redis.call('EXISTS', base .. 'archived:' .. id_of(m)) == 1 then return 'archived' end
  return false
end
"""

# KEYS: task, unleased, leased
# ARGV: base, member, until, now
# Returns the updated row as JSON, "archived", "leased", or nil.
DELAY = (
    _LUA_PRELUDE
    + _LUA_ACTIVE
    + """
local m = ARGV[2]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
if redis.call('HGET', KEYS[1], 'leaseOwner') ~= '' then return 'leased' end
redis.call('HSET', KEYS[1], 'leaseExpires', ARGV[3], 'dateModified', ARGV[4])
redis.call('ZREM', KEYS[2], m)
redis.call('ZADD', KEYS[3], ARGV[3], m)
return cjson.encode((row_of(KEYS[1])))
"""
)

# KEYS: task, active, unleased
# ARGV: base, member, priority, now
SET_PRIORITY = (
    _LUA_PRELUDE
    + _LUA_ACTIVE
    + """
local m = ARGV[2]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
redis.call('HSET', KEYS[1], 'priority', ARGV[3], 'dateModified', ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], m)
if redis.call('ZSCORE', KEYS[3], m) then redis.call('ZADD', KEYS[3], ARGV[3], m) end
return cjson.encode((row_of(KEYS[1])))
"""
)

# KEYS: task, unleased, leased
# ARGV: base, member, now
FREE = (
    _LUA_PRELUDE
    + _LUA_ACTIVE
    + """
local m, now = ARGV[2], ARGV[3]
local refusal = not_active(m, KEYS[1])
if refusal ~= nil then return refusal end
if redis.call('HGET', KEYS[1], 'leaseOwner') == '' then return 'not_leased' end
redis.call('HSET', KEYS[1], 'leaseOwner', '', 'leaseExpires', now, 'dateModified', now)
redis.call('ZREM', KEYS[2], m)
redis.call('ZADD', KEYS[3], now, m)
return cjson.encode((row_of(KEYS[1])))
"""
)

# KEYS: archived record
# ARGV: [base, member, now, repeat ('1' or '0')] as JSON
# Phorge's unarchiveTask(): the record becomes the active task again, its
# payload copy the payload string.  Returns the row as JSON, "active",
# "succeeded", or nil.
RETRY = (
    _LUA_PACKED_PRELUDE
    + """
local m, now = A[2], A[3]
local key = task_key(m)
if redis.call('EXISTS', key) == 1 then return 'active' end
local old, found = row_of(KEYS[1])
if not found then return false end
if old['result'] == '0' and A[4] ~= '1' then return 'succeeded' end
redis.call('HSET', key,
  'id', id_of(m), 'taskClass', old['taskClass'], 'leaseOwner', '', 'leaseExpires', '0',
  'failureCount', '0', 'dataID', old['dataID'], 'failureTime', '', 'priority', old['priority'],
  'objectPHID', old['objectPHID'] or '', 'containerPHID', old['containerPHID'] or '',
  'dateCreated', old['dateCreated'], 'dateModified', now)
redis.call('SET', base .. 'data:' .. old['dataID'], old['data'] or '')
redis.call('ZADD', base .. 'idx:active', old['priority'], m)
redis.call('ZADD', base .. 'idx:leased', 0, m)
redis.call('DEL', KEYS[1])
redis.call('ZREM', base .. 'idx:archived', m)
redis.call('DECR', base .. 'counter:archived')
return cjson.encode((row_of(key)))
"""
)

# Moving tasks between backends.
# KEYS: active
# ARGV: base, member...
# The active tasks among the members, with payloads, as one JSON array.
EXPORT = (
    _LUA_PRELUDE
    + """
local out = {}
for i = 2, #ARGV do
  local key = task_key(ARGV[i])
  if redis.call('EXISTS', key) == 1 then out[#out + 1] = with_payload(key) end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""
)

# KEYS: next_task_id
# ARGV: base, tasks as JSON [[taskClass, leaseOwner, leaseExpires, failureCount,
#       failureTime, priority, objectPHID, containerPHID, dateCreated,
#       dateModified, data], ...] (every value a string, NULL = ''),
#       ledger name, mark
# New tasks with every column kept but id and dataID, and the ledger mark,
# in one step.  Returns the new ids.
IMPORT = (
    _LUA_PRELUDE
    + """
local ids = {}
for _, t in ipairs(cjson.decode(ARGV[2])) do
  local data_id = redis.call('INCR', base .. 'next_data_id')
  local m = string.format('%020d', redis.call('INCR', KEYS[1]))
  local key = task_key(m)
  redis.call('SET', base .. 'data:' .. data_id, t[11])
  redis.call('HSET', key,
    'id', id_of(m), 'taskClass', t[1], 'leaseOwner', t[2], 'leaseExpires', t[3],
    'failureCount', t[4], 'dataID', data_id, 'failureTime', t[5], 'priority', t[6],
    'objectPHID', t[7], 'containerPHID', t[8], 'dateCreated', t[9], 'dateModified', t[10])
  redis.call('ZADD', base .. 'idx:active', t[6], m)
  if t[2] == '' and t[3] == '' then
    redis.call('ZADD', base .. 'idx:unleased', t[6], m)
  elseif t[3] ~= '' then
    redis.call('ZADD', base .. 'idx:leased', t[3], m)
  end
  if tonumber(t[4]) > 0 then redis.call('INCR', base .. 'counter:failed') end
  ids[#ids + 1] = id_of(m)
end
redis.call('SET', base .. 'migrated:' .. ARGV[3], ARGV[4])
return ids
"""
)

# KEYS: active
# ARGV: base, member...
# Removes the tasks (moved elsewhere) and their payloads; returns how many there were.
DELETE_TASKS = (
    _LUA_PRELUDE
    + """
local gone = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  local key = task_key(m)
  local f = redis.call('HMGET', key, 'dataID', 'failureCount')
  if f[1] then
    redis.call('DEL', key)
    redis.call('DEL', base .. 'data:' .. f[1])
    redis.call('ZREM', KEYS[1], m)
    redis.call('ZREM', base .. 'idx:unleased', m)
    redis.call('ZREM', base .. 'idx:leased', m)
    if (tonumber(f[2]) or 0) > 0 then redis.call('DECR', base .. 'counter:failed') end
    gone = gone + 1
  end
end
return gone
"""
)

# KEYS: active, leased, idx:archived, counter:failed
# ARGV: base, now
STATS = (
    _LUA_PRELUDE
    + """
local held = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[2], '+inf')) do
  local owner = redis.call('HGET', task_key(m), 'leaseOwner')
  if owner and owner ~= '' then held = held + 1 end
end
return {redis.call('ZCARD', KEYS[1]), held, redis.call('ZCARD', KEYS[3]),
        tonumber(redis.call('GET', KEYS[4]) or '0')}
"""
)

# KEYS: next_task_id, leased
# ARGV: since, now
# What held lease calls watch: the id sequence, and whether some task's
# leaseExpires lies in [since, now).
WAKE_CHECK = """
local due = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '(' .. ARGV[2], 'LIMIT', 0, 1)
return {redis.call('GET', KEYS[1]) or '0', #due}
"""

# KEYS: active
# ARGV: base, first rank, last rank
LIST = (
    _LUA_PRELUDE
    + """
local out = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3])) do
  local row, found = row_of(task_key(m))
  if found then out[#out + 1] = row end
end
if #out == 0 then return '[]' end
return cjson.encode(out)
"""
)

# KEYS: task
# ARGV: base
GET = (
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
return cjson.encode(with_payload(KEYS[1]))
"""
)


# ensure_ascii off: the text goes to Redis as the same UTF-8 it would have as
# separate arguments.
_pack = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


# What the operator scripts answer when the task is in the wrong state.
_REFUSALS = {
    "archived": ARCHIVED_NOT_ACTIVE,
    "leased": LEASED,
    "not_leased": NOT_LEASED,
    "active": ACTIVE_NOT_ARCHIVED,
    "succeeded": SUCCEEDED,
}


def _refusal(task_id: int, reply: Any) -> None:
    """Raise what a script's nil or CONFLICT answer means."""
    if not reply:
        raise TaskNotFound(task_id)
    if reply == CONFLICT:
        raise LeaseConflict(task_id)


def _expiry_or_marker(expires: int) -> str:
    try:
        return str(check_u32("expires", expires))
    except InvalidArgument:
        return OUT_OF_RANGE


def _followup_fields(followup: Followup) -> list[str]:
    """A follow-up as the archive step takes it (_LUA_FOLLOWUPS)."""
    request = followup.enqueue
    return [
        request.task_class,
        "" if followup.inherits_priority else str(request.priority),
        request.object_phid or "",
        request.container_phid or "",
        "" if request.delay_until is None else str(request.delay_until),
        request.data,
    ]


def _children(
    followups: Sequence[Followup], parent_priority: int, ids: Sequence[Sequence[str]], now: int
) -> tuple[Task, ...]:
    """The tasks the archive step inserted for ``followups`` under ``ids``."""
    return tuple(
        followup.request(parent_priority).new_task(int(task_id), int(data_id), now)
        for followup, (task_id, data_id) in zip(followups, ids, strict=True)
    )


def _report_result(report: Report, answer: Any, now: int) -> ReportResult:
    """One answer of the REPORT script as the store's result."""
    task_id = report.task_id
    if isinstance(answer, list):
        task_class, priority, ids = answer
        children = _children(report.followups, int(priority), ids, now)
        return ReportResult(task_id, task_class, None, children)
    if answer == NOT_FOUND:
        return ReportResult(task_id, error=TaskNotFound(task_id))
    if answer == CONFLICT:
        return ReportResult(task_id, error=LeaseConflict(task_id))
    if answer == OUT_OF_RANGE:
        field = "retryWait" if report.outcome == REPORT_FAIL else "duration"
        return ReportResult(task_id, error=InvalidArgument(field, f"{field} is too large"))
    return ReportResult(task_id, answer)


def _row(doc: dict[str, Any]) -> Task:
    """A task row decoded from a script's JSON, ``data`` being the payload if loaded."""
    payload = doc.pop("data", None)
    return task_from_columns(doc, payload)


class RedisTaskStore:
    """Implements :class:`gorge.taskqueue.store.TaskStore` on Redis.

    ``conn`` is a txredisapi connection (normally the lazy pool from
    :func:`gorge.redis.make_redis`); every call is bounded by ``op_timeout``
    seconds on ``clock`` because a lazy pool waits while the server is down.
    ``archive_retention`` (seconds, None = forever, the reference behaviour)
    bounds how long archive records, and so complete replays, are kept.
    """

    def __init__(
        self,
        conn: Any,
        *,
        clock: IReactorTime,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        ping_timeout: float = 5.0,
        archive_retention: int | None = None,
    ) -> None:
        self._conn = conn
        self._clock = clock
        self._op_timeout = op_timeout
        self._ping_timeout = ping_timeout
        self._archive_retention = archive_retention
        self.keys = Keys(key_prefix)
        self._enqueue = gredis.LuaScript(ENQUEUE)
        self._lease = gredis.LuaScript(LEASE)
        self._archive = gredis.LuaScript(ARCHIVE)
        self._fail = gredis.LuaScript(FAIL_TEMPORARY)
        self._yield = gredis.LuaScript(YIELD)
        self._report = gredis.LuaScript(REPORT)
        self._awaken = gredis.LuaScript(AWAKEN)
        self._renew = gredis.LuaScript(RENEW)
        self._list_archived = gredis.LuaScript(LIST_ARCHIVED)
        self._requeue = gredis.LuaScript(REQUEUE)
        self._delay = gredis.LuaScript(DELAY)
        self._set_priority = gredis.LuaScript(SET_PRIORITY)
        self._free = gredis.LuaScript(FREE)
        self._retry = gredis.LuaScript(RETRY)
        self._export = gredis.LuaScript(EXPORT)
        self._import = gredis.LuaScript(IMPORT)
        self._delete = gredis.LuaScript(DELETE_TASKS)
        self._stats = gredis.LuaScript(STATS)
        self._list = gredis.LuaScript(LIST)
        self._get = gredis.LuaScript(GET)
        self._wake_check = gredis.LuaScript(WAKE_CHECK)
        self._give_back_script = gredis.LuaScript(GIVE_BACK)
        self._giving_back = InFlight()

    def _now(self) -> int:
        return int(self._clock.seconds())

    # Plain functions answering Deferreds, not coroutines: every queue call
    # goes through them, and each coroutine layer costs a Deferred of its own.

    def _bounded(self, d: Any) -> Deferred:
        """A Deferred or coroutine, bounded to ``op_timeout`` seconds."""
        if not isinstance(d, Deferred):
            d = Deferred.fromCoroutine(d)
        return d.addTimeout(self._op_timeout, self._clock)

    def _run(self, script: gredis.LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Deferred:
        return self._bounded(script.run(self._conn, keys=keys, args=[self.keys.base, *args]))

    def _run_packed(
        self, script: gredis.LuaScript, key: str, fields: Sequence[Any], *extra: str
    ) -> Deferred:
        """Run a script that reads its small arguments from one JSON array."""
        packed = _pack([self.keys.base, *(f if isinstance(f, str) else str(f) for f in fields)])
        return self._bounded(script.run(self._conn, keys=[key], args=[packed, *extra]))

    async def enqueue(self, request: EnqueueRequest) -> Task:
        now = self._now()
        k = self.keys
        delay = "" if request.delay_until is None else str(request.delay_until)
        task_id, data_id = await self._run_packed(
            self._enqueue,
            k.next_task_id,
            [
                request.task_class,
                request.priority,
                request.object_phid or "",
                request.container_phid or "",
                delay,
                now,
            ],
            request.data,
        )
        return request.new_task(int(task_id), int(data_id), now)

    async def lease(
        self,
        owner: str,
        limit: int,
        lease_duration: int,
        task_classes: Sequence[str] | None = None,
    ) -> list[Task]:
        now = self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        classes = list(dict.fromkeys(task_classes or ()))
        # Unfiltered, the first `limit` unleased ids are all claimable: one page.
        batch = SCAN_BATCH if classes else max(limit, 1)
        k = self.keys
        claim = self._run_packed(self._lease, k.unleased, [limit, owner, exp, now, batch, *classes])
        rows = await outliving_caller(claim, lambda won: self._give_back(owner, exp, won))
        return sorted((_row(doc) for doc in json.loads(rows)), key=sort_key)

    def _give_back(self, owner: str, exp: int, rows: str) -> None:
        ids = [int(doc["id"]) for doc in json.loads(rows)]
        if not ids:
            return
        log_handed_back(owner, ids)
        d = self._giving_back.track(
            self._run(
                self._give_back_script,
                [self.keys.leased],
                [owner, exp, self._now(), *(member(i) for i in ids)],
            )
        )
        d.addErrback(
            lambda f: log.failure(
                "LEASE_HAND_BACK_FAILED task_ids={task_ids}", f, level=LogLevel.error, task_ids=ids
            )
        )

    async def _archive_task(
        self, task_id: int, result: int, duration: int, replay: bool, owner: str | None = None
    ) -> ArchivedTask:
        now = self._now()
        cutoff = "" if self._archive_retention is None else now - self._archive_retention
        k = self.keys
        reply = await self._run_packed(
            self._archive,
            k.task(task_id),
            [member(task_id), result, duration, now, "1" if replay else "0", cutoff, owner or ""],
        )
        _refusal(task_id, reply)
        return archived_from_columns(json.loads(reply))

    async def _checked_expiry(
        self, task_id: int, field: str, expires: int, owner: str | None
    ) -> int:
        """``expires`` if it fits the column; else the error the model gives:
        not found for an unknown id, a conflict for a fenced call on a task
        someone else holds, InvalidArgument otherwise."""
        try:
            return check_u32(field, expires)
        except InvalidArgument:
            k = self.keys
            holder = await self._bounded(self._conn.hmget(k.task(task_id), ["id", "leaseOwner"]))
            if holder[0] in (None, ""):
                if owner and await self._bounded(self._conn.exists(k.archived(task_id))):
                    raise LeaseConflict(task_id) from None
                raise TaskNotFound(task_id) from None
            if owner and holder[1] != owner:
                raise LeaseConflict(task_id) from None
            raise

    async def complete(self, task_id: int, duration: int, owner: str | None = None) -> ArchivedTask:
        return await self._archive_task(task_id, RESULT_SUCCESS, duration, True, owner)

    async def complete_with_followups(
        self,
        task_id: int,
        duration: int,
        followups: Sequence[Followup],
        owner: str | None = None,
    ) -> Completion:
        if not followups:
            return Completion(await self.complete(task_id, duration, owner))
        now = self._now()
        cutoff = "" if self._archive_retention is None else now - self._archive_retention
        reply = await self._run_packed(
            self._archive,
            self.keys.task(task_id),
            [member(task_id), RESULT_SUCCESS, duration, now, "1", cutoff, owner or ""],
            _pack([_followup_fields(f) for f in followups]),
        )
        _refusal(task_id, reply)
        row, children = json.loads(reply)
        archived = archived_from_columns(row)
        if not children:
            # A replay ({}, cjson's empty table): the first report inserted them.
            return Completion(archived)
        return Completion(archived, _children(followups, archived.priority, children, now))

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        if permanent:
            return await self._archive_task(task_id, RESULT_FAILURE, 0, False, owner)
        now = self._now()
        expires = await self._checked_expiry(task_id, "retryWait", now + retry_wait, owner)
        k = self.keys
        row = await self._run(
            self._fail,
            [k.task(task_id)],
            [member(task_id), now, expires, owner or ""],
        )
        _refusal(task_id, row)
        return _row(json.loads(row))

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        now = self._now()
        expires = await self._checked_expiry(
            task_id, "duration", now + max(duration, MIN_YIELD), owner
        )
        k = self.keys
        found = await self._run(
            self._yield,
            [k.task(task_id)],
            [member(task_id), now, expires, owner or "", YIELD_OWNER],
        )
        _refusal(task_id, found)

    async def cancel(self, task_id: int) -> ArchivedTask:
        return await self._archive_task(task_id, RESULT_CANCELLED, 0, False)

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        reports = list(reports)
        if not reports:
            return []
        now = self._now()
        cutoff = "" if self._archive_retention is None else now - self._archive_retention
        entries = []
        for report in reports:
            m = member(report.task_id)
            if report.outcome == REPORT_COMPLETE and report.followups:
                fields = [_followup_fields(f) for f in report.followups]
                entries.append([m, "c", str(report.duration), fields])
            elif report.outcome == REPORT_COMPLETE:
                entries.append([m, "c", str(report.duration)])
            elif report.outcome == REPORT_FAIL and report.permanent:
                entries.append([m, "p", ""])
            elif report.outcome == REPORT_FAIL:
                entries.append([m, "t", _expiry_or_marker(now + report.retry_wait)])
            else:
                entries.append([m, "y", _expiry_or_marker(now + max(report.duration, MIN_YIELD))])
        answers = json.loads(
            await self._run_packed(
                self._report,
                self.keys.active,
                [now, cutoff, owner or "", YIELD_OWNER],
                _pack(entries),
            )
        )
        return [
            _report_result(report, answer, now)
            for report, answer in zip(reports, answers, strict=True)
        ]

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return 0
        ago = self._now() - AWAKEN_WINDOW
        k = self.keys
        changed = await self._run(
            self._awaken,
            [k.leased, *(k.task(i) for i in ids)],
            [ago, YIELD_OWNER, *(member(i) for i in ids)],
        )
        return int(changed)

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        ids = list(dict.fromkeys(task_ids))
        exp = check_u32("duration", self._now() + duration)
        if not ids:
            return {}
        k = self.keys
        answers = await self._run(
            self._renew,
            [k.leased, *(k.task(i) for i in ids)],
            [owner, exp, *(member(i) for i in ids)],
        )
        return {
            task_id: (int(a) if a not in (None, "") else None)
            for task_id, a in zip(ids, answers, strict=True)
        }

    async def stats(self) -> Stats:
        k = self.keys
        active, held, archived, failed = await self._run(
            self._stats, [k.active, k.leased, k.archived_idx, k.counter_failed], [self._now()]
        )
        return Stats(
            active=int(active), leased=int(held), archived=int(archived), failed=int(failed)
        )

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        # Ranks are Redis 64-bit integers: the last one is clamped so the
        # largest offset is an empty page, not an overflow.
        last = min(offset + limit - 1, _INT64_MAX)
        rows = await self._run(self._list, [self.keys.active], [offset, last])
        return [_row(doc) for doc in json.loads(rows)]

    async def get_task(self, task_id: int) -> Task:
        reply = await self._run(self._get, [self.keys.task(task_id)], [])
        if not reply:
            raise TaskNotFound(task_id)
        return _row(json.loads(reply))

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        # Named fields only: the record also holds the payload copy.
        key = self.keys.archived(task_id)
        values = await self._bounded(self._conn.hmget(key, list(ARCHIVE_COLUMNS)))
        cols: Mapping[str, Any] = dict(zip(ARCHIVE_COLUMNS, values, strict=True))
        if cols.get("id") in (None, ""):
            return None
        return archived_from_columns(cols)

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        # Filtered pages are matched inside Redis, a bounded page per call,
        # so a large archive never blocks the server for long.
        rows: list[ArchivedTask] = []
        skip, rank = offset, 0
        while rank >= 0 and len(rows) < limit:
            wanted = skip + limit - len(rows)
            reply = json.loads(
                await self._run(
                    self._list_archived,
                    [self.keys.archived_idx],
                    [
                        rank,
                        ARCHIVE_PAGE,
                        "" if result is None else result,
                        task_class or "",
                        wanted,
                    ],
                )
            )
            for doc in reply["rows"]:
                if skip:
                    skip -= 1
                    continue
                rows.append(archived_from_columns(doc))
            rank = reply["next"]
        return rows[:limit]

    async def requeue(self, task_id: int) -> Task:
        return await self._operated(
            task_id,
            await self._run_packed(
                self._requeue, self.keys.archived(task_id), [member(task_id), self._now()]
            ),
        )

    async def _operated(self, task_id: int, reply: Any) -> Task:
        if not reply:
            raise TaskNotFound(task_id)
        if reply in _REFUSALS:
            raise TaskStateError(task_id, _REFUSALS[reply])
        return _row(json.loads(reply))

    async def delay(self, task_id: int, until: int) -> Task:
        k = self.keys
        return await self._operated(
            task_id,
            await self._run(
                self._delay,
                [k.task(task_id), k.unleased, k.leased],
                [member(task_id), until, self._now()],
            ),
        )

    async def set_priority(self, task_id: int, priority: int) -> Task:
        k = self.keys
        return await self._operated(
            task_id,
            await self._run(
                self._set_priority,
                [k.task(task_id), k.active, k.unleased],
                [member(task_id), priority, self._now()],
            ),
        )

    async def free(self, task_id: int) -> Task:
        k = self.keys
        return await self._operated(
            task_id,
            await self._run(
                self._free, [k.task(task_id), k.unleased, k.leased], [member(task_id), self._now()]
            ),
        )

    async def retry(self, task_id: int, repeat: bool) -> Task:
        return await self._operated(
            task_id,
            await self._run_packed(
                self._retry,
                self.keys.archived(task_id),
                [member(task_id), self._now(), "1" if repeat else "0"],
            ),
        )

    async def active_ids(self) -> list[int]:
        members = await self._bounded(self._conn.zrange(self.keys.active, 0, -1))
        return sorted(int(m) for m in members)

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        ids = sorted(set(task_ids))
        out: list[Task] = []
        for start in range(0, len(ids), ARCHIVE_PAGE):
            chunk = ids[start : start + ARCHIVE_PAGE]
            rows = await self._run(self._export, [self.keys.active], [member(i) for i in chunk])
            out += [_row(doc) for doc in json.loads(rows)]
        return out

    async def import_tasks(self, tasks: Sequence[Task], ledger: str, mark: int) -> list[int]:
        def text(value: Any) -> str:
            return "" if value is None else str(value)

        rows = [
            [
                t.task_class,
                text(t.lease_owner),
                text(t.lease_expires),
                str(t.failure_count),
                text(t.failure_time),
                str(t.priority),
                text(t.object_phid),
                text(t.container_phid),
                str(t.date_created),
                str(t.date_modified),
                t.data or "",
            ]
            for t in tasks
        ]
        ids = await self._run(self._import, [self.keys.next_task_id], [_pack(rows), ledger, mark])
        return [int(i) for i in ids or []]

    async def migration_mark(self, ledger: str) -> int | None:
        value = await self._bounded(self._conn.get(self.keys.migrated(ledger)))
        return None if value in (None, "") else int(value)

    async def clear_migration_mark(self, ledger: str) -> None:
        await self._bounded(self._conn.delete(self.keys.migrated(ledger)))

    async def delete_tasks(self, tasks: Sequence[Task]) -> int:
        gone = 0
        tasks = list(tasks)
        for start in range(0, len(tasks), ARCHIVE_PAGE):
            chunk = tasks[start : start + ARCHIVE_PAGE]
            gone += int(
                await self._run(self._delete, [self.keys.active], [member(t.id) for t in chunk])
            )
        return gone

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        k = self.keys
        highest, due = await self._bounded(
            self._wake_check.run(self._conn, keys=[k.next_task_id, k.leased], args=[since, now])
        )
        return int(highest), int(due) > 0

    async def ping(self) -> str | None:
        return await gredis.ping(self._conn, self._clock, self._ping_timeout)

    async def close(self) -> None:
        await self._giving_back.drain(GIVE_BACK_BUDGET, self._clock)
        await self._bounded(self._conn.disconnect())


def make_redis_task_store(
    settings: gredis.RedisSettings,
    reactor: Any,
    *,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    archive_retention: int | None = None,
) -> RedisTaskStore:
    """A store on a lazy pool: nothing connects until the first call.

    Raises ConfigError for a key prefix whose hash tag is malformed.
    """
    try:
        key_base(key_prefix)
    except ValueError as e:
        raise ConfigError("GORGE_TASKQUEUE_REDIS_KEY_PREFIX", str(e)) from None
    return RedisTaskStore(
        gredis.make_redis(settings, reactor),
        clock=reactor,
        key_prefix=key_prefix,
        archive_retention=archive_retention,
    )
