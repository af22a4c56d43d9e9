"""The :class:`~adapters.base.FlowStore` port on Redis: one Lua script per check-and-take.

Keys (beside the storage's, under its prefix):

* ``<prefix>:flow:rate:<model>``: a hash, the model's bucket: ``r`` (requests
  left), ``t`` (tokens left, may be negative: debt after a correction),
  ``ts`` (when they were computed), ``b`` (blocked until, after a 429).
* ``<prefix>:flow:slots:<key>``: a sorted set, the concurrency slots held:
  member = "<job id> <lease owner>", score = when its lease expires; and the key's line, the
  jobs refused a slot: ``?<job id>`` scored by when it asked and ``!<job id>`` by when it gives
  up its place, each in a score range above every slot's (see
  :data:`adapters.memory.flow.PLACE_BASE`). Expired members are removed by the take itself, so
  a killed worker's slot comes back.

Unlike the storage scripts these read Redis's clock (``TIME``): buckets and
slot leases are shared by workers on many machines, and one clock makes
their arithmetic agree. Like every script here, each checks the type of its
key before its first write and replies ``corrupt:<role>:<type>`` instead
(roles ``rate`` and ``slots``); a refusal writes nothing. A script that
fails half-way keeps what it wrote (Redis does not roll a script back), so
each computes every number it writes, and refuses one out of range
(``bad:<why>``), before its first write; the Python side bounds them first.
"""

from __future__ import annotations

from typing import Any

import redis

from adapters.memory.flow import DEADLINE_BASE, PLACE_BASE, held_slots, line_of
from adapters.redis.client import _mapped
from adapters.redis.keys import check_prefix
from pipelines.engine.errors import MAX_RETRY_AFTER_SECONDS, CorruptRecordError, InvalidInputError
from pipelines.engine.flow import (
    CONCURRENCY_RETRY_SECONDS,
    FRONT_RETRY_SECONDS,
    LINE_SECONDS,
    MAX_SLOT_SECONDS,
    check_block_seconds,
    check_slot_member,
    check_slot_ttl,
)

__all__ = ["ADJUST_RATE", "BLOCK_RATE", "RELEASE_SLOT", "RENEW_SLOT", "TAKE_RATE", "TAKE_SLOT", "RedisFlowStore"]

_PRELUDE = """
local function wrong_type(key, role, expected)
  local t = redis.call('TYPE', key).ok
  if t ~= 'none' and t ~= expected then return 'corrupt:' .. role .. ':' .. t end
  return false
end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- A number of seconds in (0, top]: not NaN (x ~= x), not inf, not negative.
local function seconds_in(x, top)
  return x ~= nil and x == x and x > 0 and x <= top
end
-- A score as ZADD / ZCOUNT read it: tostring's 14 digits would round PLACE + now to 10 ms.
local function score(x) return string.format('%.17g', x) end
"""

_MAX_BLOCK = repr(MAX_RETRY_AFTER_SECONDS)
_MAX_SLOT = repr(MAX_SLOT_SECONDS)
_LINE = repr(LINE_SECONDS)
_FRONT = repr(FRONT_RETRY_SECONDS)
_BACK = repr(CONCURRENCY_RETRY_SECONDS)
_PLACE = repr(PLACE_BASE)
_DEADLINE = repr(DEADLINE_BASE)

# KEYS[1] the bucket; ARGV rpm, tpm (0 = no such limit), burst seconds, tokens. Reply: seconds to wait ('0': taken).
TAKE_RATE = _PRELUDE + "local MAX_BLOCK = " + _MAX_BLOCK + """
local bad = wrong_type(KEYS[1], 'rate', 'hash')
if bad then return bad end
local now = clock()
local rpm, tpm, burst, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local f = redis.call('HMGET', KEYS[1], 'r', 't', 'ts', 'b')
local blocked = tonumber(f[4]) or 0
-- A block beyond the longest one (an endless one written before blocks were bounded) ends at that longest.
if blocked ~= blocked or blocked > now + MAX_BLOCK then
  blocked = now + MAX_BLOCK
  redis.call('HSET', KEYS[1], 'b', tostring(blocked))
  redis.call('PEXPIRE', KEYS[1], math.ceil(MAX_BLOCK * 1000) + 120000)
end
if now < blocked then return tostring(blocked - now) end
local cap_r, cap_t = 0, 0
if rpm > 0 then cap_r = math.max(1, rpm * burst / 60) end
if tpm > 0 then cap_t = math.max(1, tpm * burst / 60) end
local elapsed = math.max(0, now - (tonumber(f[3]) or now))
local r = math.min(cap_r, (tonumber(f[1]) or cap_r) + elapsed * rpm / 60)
local t = math.min(cap_t, (tonumber(f[2]) or cap_t) + elapsed * tpm / 60)
local wait = 0
if rpm > 0 and r < 1 then wait = (1 - r) * 60 / rpm end
if tpm > 0 then
  local need = math.min(tokens, cap_t)
  if t < need then wait = math.max(wait, (need - t) * 60 / tpm) end
end
if wait > 0 then return tostring(wait) end
redis.call('HSET', KEYS[1], 'r', tostring(r - 1), 't', tostring(t - tokens), 'ts', tostring(now))
-- Idle for two minutes, a bucket is full again: let it go, unless a block outlives that.
redis.call('PEXPIRE', KEYS[1], math.max(120000, math.ceil((blocked - now) * 1000) + 60000))
return '0'
"""

# KEYS[1] the bucket; ARGV tokens to take (negative: give back). Only an existing bucket is corrected.
ADJUST_RATE = _PRELUDE + """
local bad = wrong_type(KEYS[1], 'rate', 'hash')
if bad then return bad end
if redis.call('HEXISTS', KEYS[1], 't') == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 't', -tonumber(ARGV[1]))
end
return 'ok'
"""

# KEYS[1] the bucket; ARGV seconds. Blocks every take until now + seconds (never shortens a block).
BLOCK_RATE = _PRELUDE + "local MAX_BLOCK = " + _MAX_BLOCK + """
local bad = wrong_type(KEYS[1], 'rate', 'hash')
if bad then return bad end
local seconds = tonumber(ARGV[1])
if not seconds_in(seconds, MAX_BLOCK) then return 'bad:block of ' .. tostring(ARGV[1]) .. ' seconds' end
local now = clock()
local until_ = now + seconds
local old = tonumber(redis.call('HGET', KEYS[1], 'b')) or 0
if until_ > old then
  local ttl = math.ceil(seconds * 1000) + 120000
  redis.call('HSET', KEYS[1], 'b', tostring(until_))
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 'ok'
"""

# KEYS[1] the slots; ARGV member, limit, ttl seconds, job id. Reply: seconds to wait ('0': held).
# adapters.memory.flow.take_in_line in Lua (its docstring says the rules, PLACE_BASE the scores): every
# step is a lookup or a count by score, so a line of thousands costs each take O(log n).
TAKE_SLOT = _PRELUDE + "local MAX_SLOT, LINE, FRONT, BACK = " + _MAX_SLOT + ", " + _LINE + ", " + _FRONT + ", " \
    + _BACK + "\nlocal PLACE, DEADLINE = " + _PLACE + ", " + _DEADLINE + """
local bad = wrong_type(KEYS[1], 'slots', 'zset')
if bad then return bad end
local ttl, limit, job = tonumber(ARGV[3]), tonumber(ARGV[2]), ARGV[4]
if not seconds_in(ttl, MAX_SLOT) then return 'bad:slot ttl of ' .. tostring(ARGV[3]) .. ' seconds' end
local now = clock()
local function keep(seconds)
  redis.call('PEXPIRE', KEYS[1], math.max(redis.call('PTTL', KEYS[1]), math.ceil(seconds * 1000) + 1000))
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', score(now))  -- slots run out (killed workers')
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], score(DEADLINE), score(DEADLINE + now), 'LIMIT', 0, 1000)
for _, m in ipairs(gone) do  -- places given up: jobs that stopped asking
  redis.call('ZREM', KEYS[1], m, '?' .. string.sub(m, 2))
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], score(now + ttl), ARGV[1])
  keep(ttl)
  return '0'
end
local held = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score(PLACE))
local mine = redis.call('ZSCORE', KEYS[1], '?' .. job)
local ahead
if mine then
  ahead = redis.call('ZCOUNT', KEYS[1], score(PLACE), '(' .. mine)
else
  ahead = redis.call('ZCOUNT', KEYS[1], score(PLACE), '(' .. score(DEADLINE))
end
if ahead < limit - held then
  redis.call('ZADD', KEYS[1], score(now + ttl), ARGV[1])
  redis.call('ZREM', KEYS[1], '?' .. job, '!' .. job)
  keep(ttl)
  return '0'
end
if not mine then  -- at the back, after every place given before it
  local stamp = PLACE + now
  local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], '(' .. score(DEADLINE), score(PLACE), 'WITHSCORES',
                          'LIMIT', 0, 1)
  if last[2] and tonumber(last[2]) + 0.001 > stamp then stamp = tonumber(last[2]) + 0.001 end
  redis.call('ZADD', KEYS[1], score(stamp), '?' .. job)
end
redis.call('ZADD', KEYS[1], score(DEADLINE + now + LINE), '!' .. job)
keep(math.max(LINE, ttl))
local soonest = FRONT
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. score(PLACE), 'WITHSCORES', 'LIMIT', 0, 1)
if first[2] then soonest = math.max(0.001, tonumber(first[2]) - now) end
if ahead < limit then return tostring(math.min(soonest, FRONT)) end
return tostring(math.min(soonest, BACK))
"""

# KEYS[1] the slots; ARGV member, ttl seconds. Extends a live slot only (XX): a released or run-out one
# stays gone, so a renewal that races the release never brings a slot back. Reply: '1' renewed, '0' not held.
RENEW_SLOT = _PRELUDE + "local MAX_SLOT, PLACE = " + _MAX_SLOT + ", " + _PLACE + """
local bad = wrong_type(KEYS[1], 'slots', 'zset')
if bad then return bad end
local ttl = tonumber(ARGV[2])
if not seconds_in(ttl, MAX_SLOT) then return 'bad:slot ttl of ' .. tostring(ARGV[2]) .. ' seconds' end
local now = clock()
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not expiry or expiry <= now or expiry >= PLACE then return '0' end  -- a place in line is no slot
redis.call('ZADD', KEYS[1], 'XX', tostring(now + ttl), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.max(redis.call('PTTL', KEYS[1]), math.ceil(ttl * 1000) + 1000))
return '1'
"""

# KEYS[1] the slots; ARGV member. Reply: 'ok:' and the job first in the key's line ('ok:' alone: none).
RELEASE_SLOT = _PRELUDE + "local PLACE, DEADLINE = " + _PLACE + ", " + _DEADLINE + """
local bad = wrong_type(KEYS[1], 'slots', 'zset')
if bad then return bad end
redis.call('ZREM', KEYS[1], ARGV[1])
local first = redis.call('ZRANGEBYSCORE', KEYS[1], score(PLACE), '(' .. score(DEADLINE), 'LIMIT', 0, 1)
if first[1] then return 'ok:' .. string.sub(first[1], 2) end
return 'ok:'
"""


class RedisFlowStore:
    """Rate buckets and concurrency slots on Redis (see the module docstring); share a storage's client."""

    def __init__(self, client: redis.Redis, *, prefix: str) -> None:
        self.client = client
        self.prefix = check_prefix(prefix)
        # register_script runs EVALSHA and reloads the script after SCRIPT FLUSH.
        self._take_rate = client.register_script(TAKE_RATE)
        self._adjust = client.register_script(ADJUST_RATE)
        self._block = client.register_script(BLOCK_RATE)
        self._take_slot = client.register_script(TAKE_SLOT)
        self._renew_slot = client.register_script(RENEW_SLOT)
        self._release = client.register_script(RELEASE_SLOT)

    def rate_key(self, model: str) -> str:
        return f"{self.prefix}:flow:rate:{model}"

    def slots_key(self, key: str) -> str:
        return f"{self.prefix}:flow:slots:{key}"

    def _run(self, script: Any, key: str, args: list[Any], what: str) -> str:
        with _mapped(what):
            reply = script(keys=[key], args=args)
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        if text.startswith("corrupt:"):
            _, role, found = text.split(":", 2)
            expected = "hash" if role == "rate" else "zset"
            raise CorruptRecordError(f"{what}: key {key!r} ({role}) is a Redis {found}, expected a {expected} "
                                     "(WRONGTYPE); nothing was written")
        if text.startswith("bad:"):
            raise InvalidInputError(f"{what}: {text[4:]} is out of range; nothing was written")
        return text

    def take_rate(self, model: str, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                  now: float) -> float:
        """See :class:`~adapters.base.FlowStore`; ``now`` is ignored (Redis's clock is used)."""
        args = [repr(float(rpm or 0)), repr(float(tpm or 0)), repr(float(burst)), str(int(tokens))]
        return float(self._run(self._take_rate, self.rate_key(model), args, f"taking rate budget of {model!r}"))

    def adjust_rate(self, model: str, tokens: int) -> None:
        self._run(self._adjust, self.rate_key(model), [str(int(tokens))], f"correcting rate budget of {model!r}")

    def block_rate(self, model: str, seconds: float, *, now: float) -> None:
        seconds = check_block_seconds(seconds)
        self._run(self._block, self.rate_key(model), [repr(seconds)], f"blocking model {model!r}")

    def take_slot(self, key: str, member: str, *, limit: int, ttl: float, now: float) -> float:
        args = [check_slot_member(member), str(int(limit)), repr(check_slot_ttl(ttl)), member.split(" ", 1)[0]]
        return float(self._run(self._take_slot, self.slots_key(key), args, f"taking a slot of {key!r}"))

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        """See :class:`~adapters.base.FlowStore`; ``now`` is ignored (Redis's clock is used)."""
        args = [member, repr(check_slot_ttl(ttl))]
        return self._run(self._renew_slot, self.slots_key(key), args, f"renewing a slot of {key!r}") == "1"

    def release_slot(self, key: str, member: str) -> str | None:
        reply = self._run(self._release, self.slots_key(key), [member], f"releasing a slot of {key!r}")
        return reply[3:] or None  # 'ok' from a script before the line: no one to wake

    def slots(self, key: str, now: float) -> list[str]:
        """Members holding a live slot of ``key`` (tests, inspection); by Redis's clock."""
        members, at = self._members(key, "reading the slots of")
        return held_slots(members, at)

    def line(self, key: str, now: float) -> list[str]:
        """The jobs waiting for a slot of ``key``, first first (tests, inspection); by Redis's clock."""
        members, at = self._members(key, "reading the line of")
        return line_of(members, at)

    def _members(self, key: str, what: str) -> tuple[dict[str, float], float]:
        with _mapped(f"{what} {key!r}"):
            sec, usec = self.client.time()
            entries: Any = self.client.zrange(self.slots_key(key), 0, -1, withscores=True)
        return {(m.decode() if isinstance(m, bytes) else str(m)): float(e) for m, e in entries}, sec + usec / 1e6
