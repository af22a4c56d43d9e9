"""The Lua scripts behind :class:`adapters.redis.RedisStorage`.

Every write that must check something first (a version, a commit token, a
lease owner) is one script, so the check and the write are atomic on the
server and cost one round trip. Scripts reply with a short status string
(``"ok"``, ``"applied"``, ``"stale:<why>"``...) that the adapter maps to
exceptions; they never raise from Lua, because a Lua error after a write
would leave a half-applied commit (scripts are atomic, not transactional).

Wrong key types: a key planted by hand or by other software with the wrong
Redis type would make a command fail half-way through a script. So every
script first checks the type of every key whose command could fail on it
(``TYPE``; a missing key is fine) and, before its first write, replies
``"corrupt:<role>:<type found>"`` instead, with nothing written. The roles
are the :class:`~adapters.redis.JobKeys` field names plus ``due``, ``jobs``
and ``finished`` (finished jobs scored by the time they finished: what
retention removes), and the listing indexes' :data:`INDEX_ROLES` (``updated``:
every job by ``updated_at``; ``status_<status>``: one zset per status), which
always come last in ``KEYS``. Plain ``DEL`` works on every type, so the keys a script only
deletes (CREATE's leftovers of a dead job, DELETE's job keys) are not
checked: that is how a corrupt job can still be deleted.

Hash fields of ``<prefix>:{<job>}:record``: ``st`` (the job's status, so a
commit touches only the status index it leaves and the one it enters; absent
on records written before it, whose next commit touches them all), ``data``
(the record JSON),
``version`` (decimal), ``token`` (the last commit's token), ``jver`` (the
version the journal was written under; absent until the first commit),
``lcut`` (the id of the last event the last commit wrote: where the next
commit cuts the live stream; absent on records written before it) and
``hist`` (the record's turn history, one mark's JSON per line, oldest first;
``data`` then has no ``history``). A record written before ``hist`` existed
keeps its history inside ``data`` and has no ``hist`` until its next commit.
Each commit sends only the marks it adds and how many it drops from the
front, relative to the history the commit with a given token wrote (the
adapter remembers it); a record whose ``token`` is another replies ``rebase``
and the adapter sends the whole history instead. Likewise a transcript message
the journal already holds (the model's answer) travels as a checked slice of
the journaled value (:mod:`adapters.redis.refs`), and ``rebase`` asks for it whole.

Conventions: ``KEYS`` are always passed in full (hash-tagged per job); an
optional owner travels as a flag plus a value, so an empty-string owner is
still an owner. Nothing in the scripts reads the clock: leases expire by
Redis's own ``PX``, so workers' clocks never matter.
"""

from __future__ import annotations

from typing import NamedTuple

from adapters.base import INBOX_OPEN
from pipelines.engine.models import JobStatus

__all__ = ["ARCHIVE", "COMMIT", "COMMIT_ARGS", "CONTROL", "CREATE", "CREATE_ARGS", "DELETE", "EVENTS", "INDEX_ROLES",
           "LOAD", "PUBLISH", "READ_LIVE", "RECORD_STEP", "REINDEX", "RELEASE", "RENEW", "SEND", "ArgLayout",
           "index_position"]


class ArgLayout(NamedTuple):
    """Where CREATE's and COMMIT's ARGV keep their parts (0-based, as the adapter builds the list).

    ``fixed`` arguments come first, the turn history's from ``history`` to ``fixed``; then
    ``ARGV[n_messages]`` messages, ``ARGV[n_logs]`` log lines and the events up to the end. The
    bench's byte breakdown reads the same numbers.
    """

    data: int
    n_messages: int
    n_logs: int
    history: int
    fixed: int


CREATE_ARGS = ArgLayout(data=2, n_messages=5, n_logs=6, history=10, fixed=11)
COMMIT_ARGS = ArgLayout(data=2, n_messages=11, n_logs=12, history=19, fixed=23)

INDEX_ROLES = ("updated", *(f"status_{s.value}" for s in JobStatus))
"""The roles of the listing indexes, in the order they end ``KEYS`` (after every other key): every job by
``updated_at``, then one zset per status (in :class:`JobStatus` order)."""


def index_position(status: JobStatus) -> str:
    """ARGV naming the status index a job goes in: its 1-based place among the status indexes."""
    return str(list(JobStatus).index(status) + 1)

# checks is a flat list of (key, role, expected type) triples. Returns the
# status naming the first key of another type, or false when all are fine.
_TYPES_FN = """
local function wrong_type(checks)
  for i = 1, #checks, 3 do
    local t = redis.call('TYPE', checks[i]).ok
    if t ~= 'none' and t ~= checks[i + 2] then return 'corrupt:' .. checks[i + 1] .. ':' .. t end
  end
  return false
end
"""

# The listing indexes are always the last len(INDEX_ROLES) KEYS (found from
# the end, so keys added before them move nothing): KEYS[#KEYS - n + 1] holds
# every job by updated_at, the next ones one status each.
_INDEX_FN = _TYPES_FN + """
local INDEX_ROLES = {""" + ", ".join(f"'{r}'" for r in INDEX_ROLES) + """}
-- A status's name (what 'st' beside the record holds) and its place among the status indexes, both
-- ways: the place is this code's order of JobStatus, the name is what stays true if that order changes.
local STATUS_AT = {""" + ", ".join(f"'{s.value}'" for s in JobStatus) + """}
local STATUS_PLACE = {}
for i, name in ipairs(STATUS_AT) do STATUS_PLACE[name] = i end
local function status_place(key)
  local name = redis.call('HGET', key, 'st')
  return name and STATUS_PLACE[name] or nil
end
local function status_name(place)
  return STATUS_AT[tonumber(place)] or ''
end
-- old: the status index the job is in now (the record's 'st'), or nil when not known (a record
-- written before 'st' existed, a delete, a reindex): then every status index is touched.
-- pos: the status index it goes in (0: none). Checks the type of each index it would write.
local function index_checks(old, pos)
  local checks, first = {}, #KEYS - #INDEX_ROLES
  for i = 1, #INDEX_ROLES do
    if old == nil or i == 1 or i == old + 1 or i == pos + 1 then
      checks[#checks + 1] = KEYS[first + i]
      checks[#checks + 1] = INDEX_ROLES[i]
      checks[#checks + 1] = 'zset'
    end
  end
  return wrong_type(checks)
end
-- Puts job_id in the status index number pos (0: in none, and out of the all-jobs index), out of
-- the one it was in (old; nil: out of every other).
local function index_job(job_id, pos, score, old)
  local first = #KEYS - #INDEX_ROLES + 1
  for i = 1, #INDEX_ROLES - 1 do
    if i == pos then redis.call('ZADD', KEYS[first + i], score, job_id)
    elseif old == nil or i == old then redis.call('ZREM', KEYS[first + i], job_id) end
  end
  if pos > 0 then redis.call('ZADD', KEYS[first], score, job_id) else redis.call('ZREM', KEYS[first], job_id) end
end
"""

# The record's turn history (field 'hist', one mark per line: JSON text never holds a raw newline).
# base '' = the whole history is add; else drop `drop` marks from the front of the stored one, then
# append add (the caller checked that the stored one is the one the commit with token base wrote).
_HIST_FN = """
local function set_history(base, drop, add)
  local h = ''
  if base ~= '' then
    h = redis.call('HGET', KEYS[1], 'hist') or ''
    local from = 1
    for _ = 1, tonumber(drop) do
      local nl = string.find(h, '\\n', from, true)
      if not nl then from = #h + 1; break end
      from = nl + 1
    end
    h = string.sub(h, from)
  end
  if add ~= '' then
    if h ~= '' then h = h .. '\\n' .. add else h = add end
  end
  -- Kept even when empty: a present field says 'data' has no history of its own.
  redis.call('HSET', KEYS[1], 'hist', h)
end
"""

# RPUSH of many values at once, in chunks: unpack() of a huge range would hit
# Lua's C-stack limit (~8000 values).
_PUSH_FN = _INDEX_FN + _HIST_FN + """
local function push(key, from, to)
  local i = from
  while i <= to do
    local j = math.min(i + 999, to)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
end
-- Events go to the job's stream, one entry each; the stream id is the cursor.
-- Each is mirrored into the live stream (bounded), where the worker's text
-- deltas go too, so a client follows one ordered stream of parts. Both copies
-- get the same id, so a live cursor names the same place in the durable stream
-- (readers fill what the live stream no longer holds from there: see
-- adapters.redis.live). The live stream's ids are drawn first: it holds every
-- durable event's id and more, so its next id is above the durable stream's
-- last too, unless it was made anew (expired or deleted) at or below that;
-- then the durable stream's next id serves both. Returns the last id ('' = none).
local function add_events(key, live, from)
  local id = ''
  for i = from, #ARGV do
    id = redis.call('XADD', live, 'MAXLEN', '~', '10000', '*', 'e', ARGV[i])
    local done = redis.pcall('XADD', key, id, 'e', ARGV[i])
    if type(done) == 'table' and done.err then
      redis.call('XDEL', live, id)
      id = redis.call('XADD', key, '*', 'e', ARGV[i])
      redis.call('XADD', live, 'MAXLEN', '~', '10000', id, 'e', ARGV[i])
    end
  end
  return id
end
-- The live stream keeps the turn in flight, not the job's whole life: each
-- commit drops the parts older than the previous commit's last event (their
-- durable events stay; a reader behind that point reads those instead). 'lcut'
-- beside the record is where the next commit cuts.
local function cut_live(live, last)
  local cut = redis.call('HGET', KEYS[1], 'lcut')
  if cut and cut ~= '' then redis.call('XTRIM', live, 'MINID', cut) end
  if last ~= '' then redis.call('HSET', KEYS[1], 'lcut', last) end
end
"""

# KEYS: record, messages, logs, journal, lease, events, due, jobs, live, finished, inbox, then the listing indexes
# ARGV: job_id, token, data, version, due_at ('' = not due), n_messages, n_logs,
#       finished_at ('' = not finished), status index position, updated_at, history (marks, one per line),
#       then the messages, the log lines, the events.
CREATE = _PUSH_FN + """
-- KEYS[2..6] are only DEL'd before being written, so their type cannot fail.
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[7], 'due', 'zset', KEYS[8], 'jobs', 'set',
                        KEYS[10], 'finished', 'zset'})
if not bad then bad = index_checks() end
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- The same create re-sent after its reply was lost: already applied.
  if redis.call('HGET', KEYS[1], 'token') == ARGV[2] then return 'applied' end
  return 'exists'
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9], KEYS[11])
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'version', ARGV[4], 'token', ARGV[2], 'st', status_name(ARGV[9]))
set_history('', 0, ARGV[11])
local n, nl = tonumber(ARGV[6]), tonumber(ARGV[7])
push(KEYS[2], 12, 11 + n)
push(KEYS[3], 12 + n, 11 + n + nl)
cut_live(KEYS[9], add_events(KEYS[6], KEYS[9], 12 + n + nl))
redis.call('SADD', KEYS[8], ARGV[1])
index_job(ARGV[1], tonumber(ARGV[9]), ARGV[10])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[7], ARGV[5], ARGV[1]) end
-- A job can be created finished (a fork at the turn that completed its original).
if ARGV[8] ~= '' then redis.call('ZADD', KEYS[10], ARGV[8], ARGV[1]) end
return 'ok'
"""

# A message ARGV '=<start> <length> <sha1 prefix> <step key>' is that slice of the journaled step value
# (adapters.redis.refs): resolved before anything is written; nil when one does not match (reply 'rebase').
_RESOLVE_FN = """
local function resolve(journal, from, to)
  local out = {}
  for i = from, to do
    local m = ARGV[i]
    if string.byte(m, 1) == 61 then
      local s, n, h, key = string.match(m, '^=(%d+) (%d+) (%x+) (.*)$')
      if not s or #h ~= 16 then return nil end
      local v = redis.call('HGET', journal, key)
      if not v then return nil end
      s, n = tonumber(s), tonumber(n)
      m = string.sub(v, s, s + n - 1)
      if #m ~= n or string.sub(redis.sha1hex(m), 1, 16) ~= h then return nil end
    end
    out[#out + 1] = m
  end
  return out
end
local function push_all(key, list)
  local i = 1
  while i <= #list do
    local j = math.min(i + 999, #list)
    redis.call('RPUSH', key, unpack(list, i, j))
    i = j + 1
  end
end
"""

# KEYS: record, messages, logs, journal, lease, events, due, jobs, live, finished, inbox, then the listing indexes
# ARGV: job_id, token, data, expected_version, new_version, has_owner, owner,
#       truncate_to ('' = keep), keep_journal, release_lease, due_at ('' = remove),
#       n_messages, n_logs, clear_control, live_ttl_ms ('' = keep the live stream),
#       finished_at ('' = not finished: remove), inbox_taken, status index position, updated_at,
#       history base token ('' = the whole history follows), marks dropped from its front, marks added,
#       ends_run ('1': refused while the inbox holds more than inbox_taken),
#       then the messages (each JSON text or a reference into the journal), the log lines, the events.
# Reply: 'ok:<pending request>:<inbox count>' / 'applied:...' (a re-sent commit);
# 'inbox:<inbox count>' (the commit ends the run past messages sent meanwhile: nothing written);
# 'stale:<why>'; 'corrupt:<role>:<type>'; 'rebase' (the history base is not the stored record's, or a
# message reference does not match the journal: nothing written, send the history and messages whole).
# Stale replies: missing, version:<stored>, expired (nobody holds the lease),
# leased (another owner holds it).
COMMIT = _PUSH_FN + _RESOLVE_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'messages', 'list', KEYS[3], 'logs', 'list',
                        KEYS[4], 'journal', 'hash', KEYS[5], 'lease', 'string', KEYS[6], 'events', 'stream',
                        KEYS[7], 'due', 'zset', KEYS[9], 'live', 'stream', KEYS[10], 'finished', 'zset',
                        KEYS[11], 'inbox', 'list'})
-- The status index the job is in ('st', beside the record): only it and the new one are touched.
local was = nil
if not bad then
  was = status_place(KEYS[1])
  bad = index_checks(was, tonumber(ARGV[18]))
end
if bad then return bad end
-- What a worker keeping the lease must know after a commit: a pending pause or
-- cancel, and how many messages wait in the inbox.
local function reply(status)
  local after = redis.call('HMGET', KEYS[1], 'control', 'inbox')
  return status .. ':' .. (after[1] or '') .. ':' .. (after[2] or '0')
end
local cur = redis.call('HMGET', KEYS[1], 'version', 'token')
if not cur[1] then return 'stale:missing' end
-- A retried command whose reply was lost: report success, write nothing.
if cur[2] == ARGV[2] and cur[1] == ARGV[5] then return reply('applied') end
if cur[1] ~= ARGV[4] then return 'stale:version:' .. cur[1] end
local holder = redis.call('GET', KEYS[5])
-- A worker commits only while it holds the lease: a free lease means it
-- expired (or the job was deleted and re-created under the same id, where
-- version numbers alone could match again).
if ARGV[6] == '1' and not holder then return 'stale:expired' end
if ARGV[6] == '1' and holder ~= ARGV[7] then return 'stale:leased' end
-- The inbox and the status are checked in the step that writes them: a run never completes past
-- messages sent while its last turn ran (the runner then ends it and goes on with them in one commit).
if ARGV[23] == '1' then
  local waiting = tonumber(redis.call('HGET', KEYS[1], 'inbox') or '0')
  if waiting > tonumber(ARGV[17]) then return 'inbox:' .. waiting end
end
-- A history delta applies only to the history it was computed from: the one the base commit wrote.
if ARGV[20] ~= '' and cur[2] ~= ARGV[20] then return 'rebase' end
local n, nl = tonumber(ARGV[12]), tonumber(ARGV[13])
local messages = resolve(KEYS[4], 24, 23 + n)
if not messages then return 'rebase' end
-- Every check passed; from here on nothing can fail (inputs were validated
-- by the adapter, key types above), so the commit lands whole.
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'version', ARGV[5], 'token', ARGV[2], 'jver', ARGV[5],
           'st', status_name(ARGV[18]))
set_history(ARGV[20], ARGV[21], ARGV[22])
if ARGV[8] ~= '' then
  local n = tonumber(ARGV[8])
  -- LTRIM 0 -1 would keep everything, so cutting to zero is a DEL.
  if n == 0 then redis.call('DEL', KEYS[2]) else redis.call('LTRIM', KEYS[2], 0, n - 1) end
end
push_all(KEYS[2], messages)
push(KEYS[3], 24 + n, 23 + n + nl)
cut_live(KEYS[9], add_events(KEYS[6], KEYS[9], 24 + n + nl))
-- The listing indexes move with the status, in the same commit (one status index at a time).
index_job(ARGV[1], tonumber(ARGV[18]), ARGV[19], was)
-- Messages sent to the job that this commit's turn took into the transcript leave the inbox.
local took = tonumber(ARGV[17])
if took > 0 then
  redis.call('LTRIM', KEYS[11], took, -1)
  redis.call('HINCRBY', KEYS[1], 'inbox', -took)
end
-- The live stream of a finished job expires; a running one's is kept.
if ARGV[15] ~= '' then redis.call('PEXPIRE', KEYS[9], ARGV[15]) else redis.call('PERSIST', KEYS[9]) end
if ARGV[9] ~= '1' then redis.call('DEL', KEYS[4]) end
if ARGV[11] ~= '' then
  redis.call('ZADD', KEYS[7], ARGV[11], ARGV[1])
else
  redis.call('ZREM', KEYS[7], ARGV[1])
end
-- The finished index moves with the status, in the same commit: retention never sees a restarted job.
if ARGV[16] ~= '' then
  redis.call('ZADD', KEYS[10], ARGV[16], ARGV[1])
else
  redis.call('ZREM', KEYS[10], ARGV[1])
end
if ARGV[10] == '1' and ARGV[6] == '1' then redis.call('DEL', KEYS[5]) end
-- A pause/cancel request lives in the record hash beside 'data', outside the
-- version fence; the commit that applies it (or makes it moot) drops it, and
-- every commit reports one still pending so a worker keeping the lease obeys it.
if ARGV[14] == '1' then redis.call('HDEL', KEYS[1], 'control') end
return reply('ok')
"""

# KEYS: record, journal, lease, live
# ARGV: version, has_owner, owner, key, value, then live-stream parts to publish with it (optional);
# a part '=<prefix length> <start> <length>\n<prefix><suffix>' has that slice of the value between
# prefix and suffix (adapters.redis.refs.slice_parts). Reply 'badpart' (nothing written) if one does not parse.
# The parts go out only if the step is journaled (same fence). A re-sent call (its reply
# was lost) finds its own value already journaled under the key and publishes nothing
# again: a step key is journaled once per attempt, so the same key holding the same value
# at this version is that call.
RECORD_STEP = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'journal', 'hash', KEYS[3], 'lease', 'string'})
if not bad and #ARGV > 5 then bad = wrong_type({KEYS[4], 'live', 'stream'}) end
if bad then return bad end
local cur = redis.call('HMGET', KEYS[1], 'version', 'jver')
if not cur[1] then return 'stale:missing' end
if cur[1] ~= ARGV[1] then return 'stale:version:' .. cur[1] end
local holder = redis.call('GET', KEYS[3])
if ARGV[2] == '1' and not holder then return 'stale:expired' end
if ARGV[2] == '1' and holder ~= ARGV[3] then return 'stale:leased' end
local parts = {}
for i = 6, #ARGV do
  local m = ARGV[i]
  if string.byte(m, 1) == 61 then
    local pl, s, n, rest = string.match(m, '^=(%d+) (%d+) (%d+)\\n(.*)$')
    if not pl or tonumber(pl) > #rest or tonumber(s) + tonumber(n) - 1 > #ARGV[5] then return 'badpart' end
    pl, s = tonumber(pl), tonumber(s)
    m = string.sub(rest, 1, pl) .. string.sub(ARGV[5], s, s + tonumber(n) - 1) .. string.sub(rest, pl + 1)
  end
  parts[#parts + 1] = m
end
if cur[2] ~= ARGV[1] then
  -- The journal belongs to an older version: start a fresh one for this one.
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'jver', ARGV[1])
elseif #ARGV > 5 and redis.call('HGET', KEYS[2], ARGV[4]) == ARGV[5] then
  return 'ok'
end
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
for _, part in ipairs(parts) do redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10000', '*', 'e', part) end
return 'ok'
"""

# KEYS: record, journal, lease, due, jobs, updated (the listing index of every job)
# ARGV: owner ('' with ttl_ms '' = read only), ttl_ms, job_id
# Reply: nil (unknown job, or leased by someone else), 'gone' (no record, but an index still names
# the job: see below), 'corrupt:<role>:<type>',
# else {data, jver, journal pairs, control, inbox, dropped, token, hist (nil: history inside data)}.
LOAD = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'journal', 'hash'})
-- A read-only load never touches the lease, so only taking it checks its type.
if not bad and ARGV[2] ~= '' then bad = wrong_type({KEYS[3], 'lease', 'string'}) end
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- No record, but an index still names the job: its record was deleted by
  -- hand (or evicted) and its other keys are debris. 'gone' makes the adapter
  -- delete them all with DELETE's 'gone' mode; else every sweep would report
  -- the due entry as unknown forever. CREATE writes the record and the indexes
  -- together, so no live job can be caught half-created here. Nothing is
  -- written here: a plain unknown id (most loads of one) stays one read.
  bad = wrong_type({KEYS[4], 'due', 'zset', KEYS[5], 'jobs', 'set', KEYS[6], 'updated', 'zset'})
  if bad then return bad end
  if redis.call('ZSCORE', KEYS[4], ARGV[3]) or redis.call('SISMEMBER', KEYS[5], ARGV[3]) == 1
      or redis.call('ZSCORE', KEYS[6], ARGV[3]) then
    return 'gone'
  end
  return false
end
if ARGV[2] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if holder and holder ~= ARGV[1] then return false end
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
end
local rec = redis.call('HMGET', KEYS[1], 'data', 'jver', 'control', 'inbox', 'dropped', 'token', 'hist')
-- A record hash without 'data' comes back as '' and the adapter reports it corrupt.
return {rec[1] or '', rec[2] or '', redis.call('HGETALL', KEYS[2]), rec[3] or '', rec[4] or '0', rec[5] or '',
        rec[6] or '', rec[7]}
"""

# KEYS: lease; ARGV: owner, ttl_ms
RENEW = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'lease', 'string'})
if bad then return bad end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease; ARGV: owner
RELEASE = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'lease', 'string'})
if bad then return bad end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: record, messages, logs, journal, lease, events, due, jobs, live, finished, inbox, then the listing indexes
# ARGV: job_id, expected version ('' = whatever it is), mode ('gone': only the leftovers of a job
# whose record is gone)
# Reply: 1 deleted, 0 unknown job, 'stale:version:<stored>' (nothing deleted); in 'gone' mode
# 'present' (the record is there: nothing deleted) or {due entry removed 0/1, keys deleted,
# other index entries removed}.
# The job's own keys are only DEL'd (any type goes); the indexes are checked.
# With an expected version the caller checked the job's status at that version:
# it is deleted only if nothing committed since (a retry, a continued conversation).
DELETE = _INDEX_FN + """
local bad = wrong_type({KEYS[7], 'due', 'zset', KEYS[8], 'jobs', 'set', KEYS[10], 'finished', 'zset'})
if not bad then bad = index_checks() end
if bad then return bad end
local existed = redis.call('EXISTS', KEYS[1])
-- A job created again since LOAD saw its record gone is a live job: left alone.
if ARGV[3] == 'gone' and existed == 1 then return 'present' end
if ARGV[2] ~= '' and existed == 1 then
  bad = wrong_type({KEYS[1], 'record', 'hash'})
  if bad then return bad end
  local cur = redis.call('HGET', KEYS[1], 'version')
  if cur ~= ARGV[2] then return 'stale:version:' .. tostring(cur) end
end
local keys = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[9], KEYS[11])
local due = redis.call('ZREM', KEYS[7], ARGV[1])
-- Counted for the 'gone' mode's reply: the all-jobs listing stands for the status ones (index_job's).
local listed = redis.call('SREM', KEYS[8], ARGV[1]) + redis.call('ZREM', KEYS[10], ARGV[1])
    + redis.call('ZREM', KEYS[#KEYS - #INDEX_ROLES + 1], ARGV[1])
index_job(ARGV[1], 0, 0)
if ARGV[3] == 'gone' then return {due, keys, listed} end
return existed
"""

# KEYS: record, then the listing indexes
# ARGV: job_id, version (as read with the record), status index position, updated_at
# Reply: 'ok' indexed, 'moved' (committed since it was read: that commit indexed it),
# 'removed' (no record: a leftover entry dropped), 'corrupt:<role>:<type>'.
# Puts a job written before the indexes existed into them (pipelines reindex).
REINDEX = _INDEX_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash'})
if not bad then bad = index_checks() end
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then
  index_job(ARGV[1], 0, 0)
  return 'removed'
end
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then return 'moved' end
index_job(ARGV[1], tonumber(ARGV[3]), ARGV[4])
-- From now on the job's commits touch only the index it is in and the one it moves to.
redis.call('HSET', KEYS[1], 'st', status_name(ARGV[3]))
return 'ok'
"""

# KEYS: record; ARGV: request ('' = clear)
# Reply: 1 stored, 0 unknown job. Only the 'control' field is written: the
# record's data and version stay as they are, so a turn in flight still commits.
CONTROL = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '' then redis.call('HDEL', KEYS[1], 'control') else redis.call('HSET', KEYS[1], 'control', ARGV[1]) end
return 1
"""

# The idempotency tokens of the calls kept outside the version fence (publish, send, dropped usage).
# KEYS[1] is the record hash.
_TOKENS_FN = """
-- The last few call tokens of one kind, kept in a record-hash field: a call redis-py re-sends
-- after a lost reply finds its token there even if another caller wrote in between.
local function seen(field, token)
  local toks = redis.call('HGET', KEYS[1], field) or ''
  return string.find(' ' .. toks .. ' ', ' ' .. token .. ' ', 1, true) ~= nil
end
local function remember(field, token)
  local toks = redis.call('HGET', KEYS[1], field) or ''
  local kept = {}
  for t in string.gmatch(toks, '%S+') do kept[#kept + 1] = t end
  kept[#kept + 1] = token
  while #kept > 32 do table.remove(kept, 1) end
  redis.call('HSET', KEYS[1], field, table.concat(kept, ' '))
end
"""

# KEYS: record, live; ARGV: token, then the parts (JSON lines)
# Reply: 1 published (or already, for a re-sent call: its token), 0 unknown job
# (a stale worker of a deleted job leaves no orphan stream).
PUBLISH = _TYPES_FN + _TOKENS_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'live', 'stream'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- redis-py re-sends a command whose reply was lost: the same parts twice would double the text.
if seen('publish_tokens', ARGV[1]) then return 1 end
for i = 2, #ARGV do redis.call('XADD', KEYS[2], 'MAXLEN', '~', '10000', '*', 'e', ARGV[i]) end
remember('publish_tokens', ARGV[1])
return 1
"""

# KEYS: record, events, finished; ARGV: job_id, the newest stream entry id the archive holds,
# the length of the archive field it extends ('0': none), the new archive
# Reply: 'ok', 'missing' (no record), 'running' (not finished: new events may come at any time),
# 'moved' (the stream or the archive changed since they were read: nothing written),
# 'corrupt:<role>:<type>'. See adapters.redis.archive.
ARCHIVE = _TYPES_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'events', 'stream', KEYS[3], 'finished', 'zset'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'missing' end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 'running' end
local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #newest == 0 or newest[1][1] ~= ARGV[2] then return 'moved' end
if redis.call('HSTRLEN', KEYS[1], 'evz') ~= tonumber(ARGV[3]) then return 'moved' end
redis.call('HSET', KEYS[1], 'evz', ARGV[4], 'evz_last', ARGV[2])
-- Emptied, not deleted: the stream keeps its last id, so later events still sort after these.
redis.call('XTRIM', KEYS[2], 'MAXLEN', 0)
return 'ok'
"""

# Two stream ids ('<ms>-<seq>') compared as numbers: -1, 0 or 1; nil when either does not parse.
_ID_FN = """
local function id_cmp(a, b)
  local ams, aseq = string.match(a, '^(%d+)-?(%d*)$')
  local bms, bseq = string.match(b, '^(%d+)-?(%d*)$')
  if not ams or not bms then return nil end
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq) or 0, tonumber(bms), tonumber(bseq) or 0
  if ams ~= bms then return ams < bms and -1 or 1 end
  if aseq ~= bseq then return aseq < bseq and -1 or 1 end
  return 0
end
"""

# KEYS: record, events; ARGV: first id (XRANGE syntax), count ('' = all), the reader's cursor ('' = none)
# Reply: {archive ('' = none, or none after the cursor), stream entries}, or 'corrupt:<role>:<type>'. Read-only.
EVENTS = _TYPES_FN + _ID_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'events', 'stream'})
if bad then return bad end
local entries
if ARGV[2] == '' then entries = redis.call('XRANGE', KEYS[2], ARGV[1], '+')
else entries = redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', ARGV[2]) end
-- A reader already past the archive's newest entry gets none of it (a follower polling a finished job).
local archive = ''
local last = redis.call('HGET', KEYS[1], 'evz_last')
local past = false
if last and ARGV[3] ~= '' then
  local c = id_cmp(ARGV[3], last)
  past = c ~= nil and c >= 0
end
if not past then archive = redis.call('HGET', KEYS[1], 'evz') or '' end
return {archive, entries}
"""

# KEYS: live; ARGV: the reader's cursor ('' = from the start), count
# Reply: false (no live stream: it expired, or the job never had one), else {entries after the cursor, gap}:
# gap is 1 when the stream was trimmed past the cursor, so durable events older than its first entry may
# be missing from it (adapters.redis.live fills them in), else 0. Read-only.
READ_LIVE = _TYPES_FN + _ID_FN + """
local bad = wrong_type({KEYS[1], 'live', 'stream'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local entries
if ARGV[1] == '' then entries = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
else entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2]) end
local gap = 0
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local behind = #first > 0 and ARGV[1] == ''
if #first > 0 and ARGV[1] ~= '' then
  local c = id_cmp(ARGV[1], first[1][1])
  behind = c ~= nil and c < 0
end
if behind then
  -- The reader is before the stream's first entry: was anything trimmed off its front?
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  local length, added = 0, 0
  for i = 1, #info, 2 do
    if info[i] == 'length' then length = info[i + 1] elseif info[i] == 'entries-added' then added = info[i + 1] end
  end
  if added > length then gap = 1 end
end
return {entries, gap}
"""

# KEYS: record, inbox; ARGV: token, then the messages (JSON lines)
# Reply: the inbox's new length, -1 for an unknown job, 'closed:<status>' (nothing
# appended) for a job whose status takes no messages. Outside the version
# fence (a turn in flight still commits); the count lives in the record hash.
SEND = _TYPES_FN + _TOKENS_FN + """
local OPEN = {""" + ", ".join(f"['{s.value}'] = true" for s in INBOX_OPEN) + """}
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'inbox', 'list'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
-- A re-sent call (its reply was lost) must not add the messages twice.
if seen('send_tokens', ARGV[1]) then
  return tonumber(redis.call('HGET', KEYS[1], 'inbox') or '0')
end
-- The status is read in the step that appends: a run cannot end between the check and the
-- append, so no message lands in an inbox that no turn will read. A record written before
-- 'st' existed has its status only inside 'data' (absent there: the default, idle).
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  local ok, rec = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'data') or '')
  st = ok and type(rec) == 'table' and type(rec.status) == 'string' and rec.status or 'idle'
end
if not OPEN[st] then return 'closed:' .. st end
for i = 2, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
remember('send_tokens', ARGV[1])
return redis.call('HINCRBY', KEYS[1], 'inbox', #ARGV - 1)
"""

# KEYS: record; ARGV: token, the usage to add (JSON: {"prompt_tokens", ...})
# Reply: 1 counted (or already, for a re-sent call), 0 unknown job. The usage of
# attempts that were fenced off after paying for a model call: outside the
# version fence (the attempt can no longer commit), summed as one JSON field.
DROPPED = _TYPES_FN + _TOKENS_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if seen('dropped_tokens', ARGV[1]) then return 1 end
local add = cjson.decode(ARGV[2])
local raw = redis.call('HGET', KEYS[1], 'dropped')
local sum = raw and cjson.decode(raw) or {}
for k, v in pairs(add) do sum[k] = (sum[k] or 0) + v end
redis.call('HSET', KEYS[1], 'dropped', cjson.encode(sum))
remember('dropped_tokens', ARGV[1])
return 1
"""
