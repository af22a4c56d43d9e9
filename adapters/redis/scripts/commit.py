"""CREATE and COMMIT (a job's first write and each turn's commit) and RECORD_STEP (a journaled step)."""

from __future__ import annotations

from adapters.redis.scripts.functions import PUSH_FN, TYPES_FN
from adapters.redis.scripts.naming import COMMIT_KEYS, STEP_KEYS, naming_fn

__all__ = ["CREATE", "COMMIT", "RECORD_STEP"]

# KEYS: record, messages, logs, journal, lease, events, due, jobs, live, finished, inbox, then the listing indexes
# (naming.COMMIT_KEYS; or only the record key and the due index's, the script naming the rest)
# ARGV: job_id ('' when sent the two keys: read from them, naming), token, data, version, due_at ('' = not
#       due), n_messages, n_logs,
#       finished_at ('' = not finished), status index position, updated_at, history (marks, one per line),
#       then the messages, the log lines, the events.
CREATE = naming_fn(COMMIT_KEYS, job_arg=1) + PUSH_FN + """
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
local last, first = add_events(KEYS[6], KEYS[9], 12 + n + nl)
cut_live(KEYS[9], nil, last, first)  -- a new stream: its first run starts with its first event
redis.call('SADD', KEYS[8], ARGV[1])
index_job(ARGV[1], tonumber(ARGV[9]), ARGV[10])
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[7], ARGV[5], ARGV[1]) end
-- A job can be created finished (a fork at the turn that completed its original).
if ARGV[8] ~= '' then redis.call('ZADD', KEYS[10], ARGV[8], ARGV[1]) end
return 'ok'
"""

# A message ARGV '=<start> <length> <sha1 prefix> <step key>' is that slice of the journaled step value;
# '><prefix length> <sha1 prefix> <key length>\n<step key><prefix><suffix>' is the journaled value with that
# text around it (adapters.redis.refs): resolved before anything is written; nil when one does not match
# (reply 'rebase').
_RESOLVE_FN = """
local function resolve(journal, from, to)
  local out = {}
  for i = from, to do
    local m = ARGV[i]
    local first = string.byte(m, 1)
    if first == 61 then  -- '='
      local s, n, h, key = string.match(m, '^=(%d+) (%d+) (%x+) (.*)$')
      if not s or #h ~= 16 then return nil end
      local v = redis.call('HGET', journal, key)
      if not v then return nil end
      s, n = tonumber(s), tonumber(n)
      m = string.sub(v, s, s + n - 1)
      if #m ~= n or string.sub(redis.sha1hex(m), 1, 16) ~= h then return nil end
    elseif first == 62 then  -- '>'
      local lead, h, kl, rest = string.match(m, '^>(%d+) (%x+) (%d+)\\n(.*)$')
      if not lead or #h ~= 16 then return nil end
      lead, kl = tonumber(lead), tonumber(kl)
      if kl + lead > #rest then return nil end
      local v = redis.call('HGET', journal, string.sub(rest, 1, kl))
      if not v or string.sub(redis.sha1hex(v), 1, 16) ~= h then return nil end
      m = string.sub(rest, kl + 1, kl + lead) .. v .. string.sub(rest, kl + lead + 1)
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
# (naming.COMMIT_KEYS; or only the record key and the due index's, the script naming the rest: naming)
# ARGV: job_id ('' when sent the two keys: read from them, naming), token, data, expected_version, new_version,
#       has_owner, owner,
#       truncate_to ('' = keep), keep_journal, release_lease, due_at ('' = remove),
#       n_messages, n_logs, clear_control, live_ttl_ms ('' = keep the live stream),
#       finished_at ('' = not finished: remove), inbox_taken, status index position, updated_at,
#       history base token ('' = the whole history follows), marks dropped from its front, marks added,
#       ends_run ('1': refused while the inbox holds more than inbox_taken),
#       record mode (how data is written, adapters.redis.record_format: '1' whole in 'data', '2' whole in
#       'base', 'd:<token>' the fields that differ from 'base', in 'dx', while the stored token is <token>;
#       'd' names the history base token), the status index place the job is in ('': not known, and
#       KEYS end with every listing index; else with three: every job's, that status's, the new status's),
#       archive ('1': the commit finishes the job and the adapter archives its events: the reply carries
#       what the archive reads), the place among the events of the one that starts a run ('' = none: the
#       live stream keeps the run in flight, cut where a run starts),
#       then the messages (each JSON text or a reference into the journal), the log lines, the events.
# Reply: 'ok:<pending request>:<inbox count>' / 'applied:...' (a re-sent commit); with archive '1',
# {'ok:...', the archive field ('' = none), the event stream's entries} (adapters.redis.events);
# 'inbox:<inbox count>' (the commit ends the run past messages sent meanwhile: nothing written);
# 'stale:<why>'; 'corrupt:<role>:<type>'; 'rebase' (the history base is not the stored record's, or a
# message reference does not match the journal: nothing written, send the history and messages whole).
# Stale replies: missing, version:<stored>, expired (nobody holds the lease),
# leased (another owner holds it).
COMMIT = naming_fn(COMMIT_KEYS, job_arg=1) + PUSH_FN + _RESOLVE_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'messages', 'list', KEYS[3], 'logs', 'list',
                        KEYS[4], 'journal', 'hash', KEYS[5], 'lease', 'string', KEYS[6], 'events', 'stream',
                        KEYS[7], 'due', 'zset', KEYS[9], 'live', 'stream', KEYS[10], 'finished', 'zset',
                        KEYS[11], 'inbox', 'list'})
-- The status index the job is in ('st', beside the record): only it and the new one are touched.
-- ARGV[25] names its place when KEYS end with only three listing indexes (every job, that status's,
-- the new status's): then 'st' must say so, else 'rebase' (the adapter sends them all).
local was = nil
if not bad then
  was = status_place(KEYS[1])
  if ARGV[25] ~= '' then
    if was ~= tonumber(ARGV[25]) then return 'rebase' end
    IX = {[1] = KEYS[12], [was + 1] = KEYS[13]}
    IX[tonumber(ARGV[18]) + 1] = KEYS[14] or KEYS[13]  -- the same status: named once
  end
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
-- So does a record delta: to the base and dx the write with that token left.
local mode = ARGV[24]
if mode == 'd' then mode = 'd:' .. ARGV[20] end  -- the history's base token (checked above) is the record's
if string.sub(mode, 1, 2) == 'd:'
    and (cur[2] ~= string.sub(mode, 3) or redis.call('HEXISTS', KEYS[1], 'base') == 0) then
  return 'rebase'
end
local n, nl = tonumber(ARGV[12]), tonumber(ARGV[13])
local messages = resolve(KEYS[4], 28, 27 + n)
if not messages then return 'rebase' end
-- Every check passed; from here on nothing can fail (inputs were validated
-- by the adapter, key types above), so the commit lands whole.
local field = (mode == '1' and 'data') or (mode == '2' and 'base') or 'dx'
redis.call('HSET', KEYS[1], field, ARGV[3], 'version', ARGV[5], 'token', ARGV[2], 'jver', ARGV[5],
           'st', status_name(ARGV[18]))
if mode == '1' then
  redis.call('HDEL', KEYS[1], 'base', 'dx', 'btok')
elseif mode == '2' then
  redis.call('HDEL', KEYS[1], 'data', 'dx')
  redis.call('HSET', KEYS[1], 'btok', ARGV[2])  -- a load need not send this base to a worker that holds it
end
set_history(ARGV[20], ARGV[21], ARGV[22])
if ARGV[8] ~= '' then
  local n = tonumber(ARGV[8])
  -- LTRIM 0 -1 would keep everything, so cutting to zero is a DEL.
  if n == 0 then redis.call('DEL', KEYS[2]) else redis.call('LTRIM', KEYS[2], 0, n - 1) end
end
push_all(KEYS[2], messages)
push(KEYS[3], 28 + n, 27 + n + nl)
local last, first, start = add_events(KEYS[6], KEYS[9], 28 + n + nl, tonumber(ARGV[27]))
cut_live(KEYS[9], first, last, start)
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
if ARGV[10] == '1' and ARGV[6] == '1' then
  redis.call('DEL', KEYS[5])
  redis.call('HDEL', KEYS[1], 'held')  -- let go, not lapsed (scripts/lease.py)
elseif redis.call('EXISTS', KEYS[5]) == 0 then
  -- No live lease: a holder that lapsed before this commit (a retry, a forced cancel) held another turn, not
  -- the one this commit starts; taking the next lease over is no interruption of it.
  redis.call('HDEL', KEYS[1], 'held')
end
-- A pause/cancel request lives in the record hash beside 'data', outside the
-- version fence; the commit that applies it (or makes it moot) drops it, and
-- every commit reports one still pending so a worker keeping the lease obeys it.
if ARGV[14] == '1' then redis.call('HDEL', KEYS[1], 'control') end
-- A commit that finishes the job hands back what archiving its events reads (EVENTS from the start),
-- so the adapter packs them and runs ARCHIVE without a read of its own.
if ARGV[26] == '1' then
  return {reply('ok'), redis.call('HGET', KEYS[1], 'evz') or '', redis.call('XRANGE', KEYS[6], '-', '+')}
end
return reply('ok')
"""

# KEYS: record, journal, lease, live (naming.STEP_KEYS; or only the record key, the script naming the rest)
# ARGV: version, has_owner, owner, key, value, then live-stream parts to publish with it (optional);
# a part '=<prefix length> <start> <length>\n<prefix><suffix>' has that slice of the value between
# prefix and suffix (adapters.redis.refs.slice_parts). Reply 'badpart' (nothing written) if one does not parse.
# The parts go out only if the step is journaled (same fence). A re-sent call (its reply
# was lost) finds its own value already journaled under the key and publishes nothing
# again: a step key is journaled once per attempt, so the same key holding the same value
# at this version is that call.
RECORD_STEP = naming_fn(STEP_KEYS) + TYPES_FN + """
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
