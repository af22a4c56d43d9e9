"""The job's keys and index entries as a whole: DELETE (a job, or what a vanished record left) and REINDEX."""

from __future__ import annotations

from adapters.redis.scripts.functions import INDEX_FN
from adapters.redis.scripts.naming import COMMIT_KEYS, naming_fn

__all__ = ["DELETE", "REINDEX"]

# KEYS: record, messages, logs, journal, lease, events, due, jobs, live, finished, inbox, then the listing indexes
# (naming.COMMIT_KEYS; or only the record key and the due index's, the script naming the rest)
# ARGV: job_id ('' when sent the two keys: naming), expected version ('' = whatever it is), mode ('gone':
# only the leftovers of a job whose record is gone)
# Reply: 1 deleted, 0 unknown job, 'stale:version:<stored>' (nothing deleted); in 'gone' mode
# 'present' (the record is there: nothing deleted) or {due entry removed 0/1, keys deleted,
# other index entries removed}.
# The job's own keys are only DEL'd (any type goes); the indexes are checked.
# With an expected version the caller checked the job's status at that version:
# it is deleted only if nothing committed since (a retry, a continued conversation).
DELETE = naming_fn(COMMIT_KEYS, job_arg=1) + INDEX_FN + """
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
REINDEX = INDEX_FN + """
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
