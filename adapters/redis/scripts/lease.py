"""The lease: LOAD (read the record, taking the lease when asked), RENEW, RELEASE and STATE.

The lease key expires by itself (``PX``), so a lease that ran out leaves no
trace in it. Taking a lease also writes its owner to the record hash's
``held`` field, which only letting it go removes (RELEASE, or the commit that
releases it): a ``held`` with no live lease is a lease that lapsed, its holder
dead or stalled in the middle of an attempt (STATE; the page's "worker lost").
LOAD counts such leases as it takes them over, in the record hash's ``lapses``
(the runner fails a job whose turn keeps killing its workers:
:mod:`pipelines.engine.runner.interrupted`).
"""

from __future__ import annotations

from adapters.redis.scripts.functions import TYPES_FN
from adapters.redis.scripts.naming import LOAD_KEYS, naming_fn

__all__ = ["LOAD", "RENEW", "RELEASE", "STATE"]

# KEYS: record, journal, lease, due, jobs, updated (the listing index of every job): naming.LOAD_KEYS, or only the
# record key and the due index's, the script naming the rest (adapters.redis.scripts.naming)
# ARGV: owner ('' with ttl_ms '' = read only), ttl_ms, job_id ('' when sent the two keys: naming), the token
# of the base the caller holds ('' none),
# the token of the write whose record the caller holds ('' none)
# Reply: nil (unknown job, or leased by someone else), 'gone' (no record, but an index still names
# the job: see below), 'corrupt:<role>:<type>',
# else {data, jver, journal pairs, control, inbox, dropped, token, base, dx, btok, version (the hash's, which the
# writes fence on: the adapter checks it against the record's JSON), hist (nil: history inside data), lapses (the
# record's ``interrupted``: leases taken over after they ran out since the last commit, this one's included)}:
# a record hash holds 'data' (record format 1) or 'base' and 'dx' (formats 2 and 3, dx compact in 3: record_format);
# base is '=' when it is the one the caller holds (btok, the token of the write that wrote it, is the one sent);
# data and hist are '=' (base and dx '') when the stored token is the one sent: the caller holds the record.
LOAD = naming_fn(LOAD_KEYS, job_arg=3) + TYPES_FN + """
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
local rec = redis.call('HMGET', KEYS[1], 'data', 'jver', 'control', 'inbox', 'dropped', 'token', 'base', 'dx',
                      'btok', 'hist', 'version', 'lapses', 'held')
-- 'lapses' is '<version> <n>': n leases that ran out were taken over at that version, none committing. A
-- commit moves the version on, which starts the count again: no write of its own (nor an older COMMIT's).
local at, n = string.match(rec[12] or '', '^(%S*) (%d+)$')
local lapses = (n and at == (rec[11] or '')) and tonumber(n) or 0
if ARGV[2] ~= '' then
  local holder = redis.call('GET', KEYS[3])
  if holder and holder ~= ARGV[1] then return false end
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
  redis.call('HSET', KEYS[1], 'held', ARGV[1])
  if not holder and rec[13] then  -- 'held' without a live lease: it ran out, its holder died or stalled
    lapses = lapses + 1
    redis.call('HSET', KEYS[1], 'lapses', (rec[11] or '') .. ' ' .. lapses)
  end
end
if ARGV[5] and ARGV[5] ~= '' and rec[6] == ARGV[5] then
  return {'=', rec[2] or '', redis.call('HGETALL', KEYS[2]), rec[3] or '', rec[4] or '0', rec[5] or '',
          rec[6], '', '', rec[9] or '', rec[11] or '', '=', lapses}
end
local base = rec[7] or ''
if base ~= '' and ARGV[4] and ARGV[4] ~= '' and rec[9] == ARGV[4] then base = '=' end
-- A record hash without 'data' or 'base' comes back as '' and the adapter reports it corrupt.
return {rec[1] or '', rec[2] or '', redis.call('HGETALL', KEYS[2]), rec[3] or '', rec[4] or '0', rec[5] or '',
        rec[6] or '', base, rec[8] or '', rec[9] or '', rec[11] or '', rec[10], lapses}
"""

# KEYS: lease; ARGV: owner, ttl_ms
RENEW = TYPES_FN + """
local bad = wrong_type({KEYS[1], 'lease', 'string'})
if bad then return bad end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease, record; ARGV: owner
# The owner lets go of 'held' even when its lease already ran out: it is alive, so no worker was lost.
RELEASE = TYPES_FN + """
local bad = wrong_type({KEYS[1], 'lease', 'string', KEYS[2], 'record', 'hash'})
if bad then return bad end
if redis.call('HGET', KEYS[2], 'held') == ARGV[1] then redis.call('HDEL', KEYS[2], 'held') end
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease, record. Reply: {live owner or '', held or ''}.
STATE = TYPES_FN + """
local bad = wrong_type({KEYS[1], 'lease', 'string', KEYS[2], 'record', 'hash'})
if bad then return bad end
return {redis.call('GET', KEYS[1]) or '', redis.call('HGET', KEYS[2], 'held') or ''}
"""
