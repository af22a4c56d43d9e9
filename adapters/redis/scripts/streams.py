"""The event streams: PUBLISH (live parts), EVENTS and READ_LIVE (reads), ARCHIVE (a finished job's events)."""

from __future__ import annotations

from adapters.redis.scripts.functions import ID_FN, TOKENS_FN, TYPES_FN

__all__ = ["PUBLISH", "EVENTS", "READ_LIVE", "ARCHIVE"]

# KEYS: record, live; ARGV: token, then the parts (JSON lines)
# Reply: 1 published (or already, for a re-sent call: its token), 0 unknown job
# (a stale worker of a deleted job leaves no orphan stream).
PUBLISH = TYPES_FN + TOKENS_FN + """
local bad = wrong_type({KEYS[1], 'record', 'hash', KEYS[2], 'live', 'stream'})
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
-- redis-py re-sends a command whose reply was lost: the same parts twice would double the text.
if seen('publish_tokens', ARGV[1]) then return 1 end
for i = 2, #ARGV do redis.call('XADD', KEYS[2], 'MAXLEN', '~', '10000', '*', 'e', ARGV[i]) end
remember('publish_tokens', ARGV[1])
return 1
"""

# KEYS: record, events; ARGV: first id (XRANGE syntax), count ('' = all), the reader's cursor ('' = none)
# Reply: {archive ('' = none, or none after the cursor), stream entries}, or 'corrupt:<role>:<type>'. Read-only.
EVENTS = TYPES_FN + ID_FN + """
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
READ_LIVE = TYPES_FN + ID_FN + """
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

# KEYS: record, events, finished; ARGV: job_id, the newest stream entry id the archive holds,
# the length of the archive field it extends ('0': none), the new archive
# Reply: 'ok', 'missing' (no record), 'running' (not finished: new events may come at any time),
# 'moved' (the stream or the archive changed since they were read: nothing written),
# 'corrupt:<role>:<type>'. See adapters.redis.archive.
ARCHIVE = TYPES_FN + """
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
