"""The Lua functions several scripts share, each a piece of text the scripts are built from."""

from __future__ import annotations

from adapters.redis.scripts.layout import INDEX_ROLES
from pipelines.engine.models import JobStatus

__all__ = ["TYPES_FN", "INDEX_FN", "HIST_FN", "PUSH_FN", "TOKENS_FN", "ID_FN"]

# checks is a flat list of (key, role, expected type) triples. Returns the
# status naming the first key of another type, or false when all are fine.
TYPES_FN = """
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
INDEX_FN = TYPES_FN + """
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
-- The listing index of role i (1: every job, 1 + p: the status of place p): the last #INDEX_ROLES KEYS,
-- unless a script named only some of them in IX (COMMIT, when the status index the job is in is known).
local IX = nil
local function ix(i)
  if IX then return IX[i] end
  return KEYS[#KEYS - #INDEX_ROLES + i]
end
-- old: the status index the job is in now (the record's 'st'), or nil when not known (a record
-- written before 'st' existed, a delete, a reindex): then every status index is touched.
-- pos: the status index it goes in (0: none). Checks the type of each index it would write.
local function index_checks(old, pos)
  local checks = {}
  for i = 1, #INDEX_ROLES do
    if old == nil or i == 1 or i == old + 1 or i == pos + 1 then
      checks[#checks + 1] = ix(i)
      checks[#checks + 1] = INDEX_ROLES[i]
      checks[#checks + 1] = 'zset'
    end
  end
  return wrong_type(checks)
end
-- Puts job_id in the status index number pos (0: in none, and out of the all-jobs index), out of
-- the one it was in (old; nil: out of every other).
local function index_job(job_id, pos, score, old)
  for i = 1, #INDEX_ROLES - 1 do
    if i == pos then redis.call('ZADD', ix(i + 1), score, job_id)
    elseif old == nil or i == old then redis.call('ZREM', ix(i + 1), job_id) end
  end
  if pos > 0 then redis.call('ZADD', ix(1), score, job_id) else redis.call('ZREM', ix(1), job_id) end
end
"""

# The record's turn history (field 'hist', one mark per line: JSON text never holds a raw newline).
# base '' = the whole history is add; else drop `drop` marks from the front of the stored one, then
# append add (the caller checked that the stored one is the one the commit with token base wrote).
HIST_FN = """
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
PUSH_FN = INDEX_FN + HIST_FN + """
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
-- then the durable stream's next id serves both. Returns the last id ('' = none),
-- the first (nil = none) and that of the event at place 'mark' among them
-- (1-based; nil without one).
local function add_events(key, live, from, mark)
  local id, first, marked = '', nil, nil
  for i = from, #ARGV do
    id = redis.call('XADD', live, 'MAXLEN', '~', '10000', '*', 'e', ARGV[i])
    local done = redis.pcall('XADD', key, id, 'e', ARGV[i])
    if type(done) == 'table' and done.err then
      redis.call('XDEL', live, id)
      id = redis.call('XADD', key, '*', 'e', ARGV[i])
      redis.call('XADD', live, 'MAXLEN', '~', '10000', id, 'e', ARGV[i])
    end
    if i == from then first = id end
    if i - from + 1 == mark then marked = id end
  end
  return id, first, marked
end
-- The live stream keeps the run in flight and the one before it, not the
-- job's whole life: a write that starts a run (its event at 'start': the
-- create's job_started, a job_continued or job_retried) drops the parts before
-- the previous run's start ('lrun' beside the record), their durable events
-- staying (a reader behind that point reads those instead). Not a turn's: a
-- client that resumes a run's message from a cursor is sent what it misses
-- after rebuilding what it holds, from every part of that run up to the
-- cursor (pipelines.web.sse); and the run before, for a client still resuming
-- it when the next one starts (a message sent during its last turn ends it and
-- starts the next in one commit). 'lcut' (the last event's id) says the stream
-- shares the durable stream's ids; one written before that, without it, loses
-- its own copies of the events at the first commit after (from its 'first'
-- event on it does).
local function cut_live(live, first, last, start)
  if first and redis.call('HEXISTS', KEYS[1], 'lcut') == 0 then redis.call('XTRIM', live, 'MINID', first) end
  if start then
    local previous = redis.call('HGET', KEYS[1], 'lrun')
    if previous then redis.call('XTRIM', live, 'MINID', previous) end
    redis.call('HSET', KEYS[1], 'lrun', start)
  end
  if last ~= '' then redis.call('HSET', KEYS[1], 'lcut', last) end
end
"""

# The idempotency tokens of the calls kept outside the version fence (publish, send, dropped usage).
# KEYS[1] is the record hash.
TOKENS_FN = """
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

# Two stream ids ('<ms>-<seq>') compared as numbers: -1, 0 or 1; nil when either does not parse.
ID_FN = """
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
