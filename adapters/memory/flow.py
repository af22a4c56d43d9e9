"""The :class:`~adapters.base.FlowStore` port in process memory: the twin of :mod:`adapters.redis.flow`.

Same buckets and slots, same answers, on the caller's clock (a test's
virtual clock moves them without sleeping). One lock makes every method the
atomic check-and-take the Redis scripts are.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pipelines.engine.flow import (
    CONCURRENCY_RETRY_SECONDS,
    FRONT_RETRY_SECONDS,
    LINE_SECONDS,
    bucket_sizes,
    check_block_seconds,
    check_slot_member,
    check_slot_ttl,
)

__all__ = ["DEADLINE_BASE", "PLACE_BASE", "MemoryFlowStore", "first_in_line", "held_slots", "line_of",
           "take_from_bucket", "take_in_line"]


@dataclass
class Bucket:
    """One model's budget: request and token levels at ``ts``, and a block set by a provider's 429."""

    requests: float | None = None
    tokens: float | None = None
    ts: float | None = None
    blocked_until: float = 0.0


def take_from_bucket(b: Bucket, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                     now: float) -> float:
    """Refill ``b`` to ``now`` and take one request and ``tokens``; 0 when taken, else seconds to wait.

    A refusal writes nothing. A request needing more tokens than the bucket
    holds is let through when the bucket is full (it then runs into debt),
    so no request waits forever.
    """
    if now < b.blocked_until:
        return b.blocked_until - now
    cap_r, cap_t = bucket_sizes(rpm, tpm, burst)
    elapsed = max(0.0, now - (b.ts if b.ts is not None else now))
    level_r = min(cap_r, (cap_r if b.requests is None else b.requests) + elapsed * (rpm or 0.0) / 60.0)
    level_t = min(cap_t, (cap_t if b.tokens is None else b.tokens) + elapsed * (tpm or 0.0) / 60.0)
    wait = 0.0
    if rpm and level_r < 1.0:
        wait = (1.0 - level_r) * 60.0 / rpm
    if tpm:
        need = min(float(tokens), cap_t)
        if level_t < need:
            wait = max(wait, (need - level_t) * 60.0 / tpm)
    if wait > 0:
        return wait
    b.requests, b.tokens, b.ts = level_r - 1.0, level_t - tokens, now
    return 0.0


PLACE_BASE = 1e11
"""A key's line in its slots' set (one set, so a Redis Cluster keeps it in one slot): ``"?<job id>"``
scored ``PLACE_BASE + when it asked`` (the order), ``"!<job id>"`` scored ``DEADLINE_BASE + when it gives
up its place``. Slots are scored by when they run out, always below ``PLACE_BASE``: a store written by
an older version, which knows no line, still counts and expires its slots right (it sees more held)."""
DEADLINE_BASE = 3e11


def take_in_line(members: dict[str, float], member: str, *, limit: int, ttl: float, now: float) -> float:
    """Take a slot of one key for ``member``, in line; 0 when taken, else seconds to wait. Changes ``members``.

    ``members``: the key's entries and their scores (see :data:`PLACE_BASE`): the slots held
    (``"<job id>[ <owner>]"``) and the line of jobs refused. A free slot goes to a job only if fewer
    jobs wait ahead of it than slots are free: every waiting job is ahead of one not in line (a job
    that just gave its slot back asks again at the back). A refused job keeps its place for
    :data:`LINE_SECONDS` from each ask. The Redis script (``adapters.redis.flow.TAKE_SLOT``) is this
    function in Lua; change both together.
    """
    for other, score in list(members.items()):
        if score <= now or DEADLINE_BASE <= score <= DEADLINE_BASE + now:
            del members[other]  # a killed worker's slot (its lease ran out), or a job that stopped asking
    for other in [m for m in members if m[0] == "?" and "!" + m[1:] not in members]:
        del members[other]  # its deadline went above
    if member in members:
        members[member] = now + ttl
        return 0.0
    job = member.split(" ", 1)[0]
    held = [score for score in members.values() if score < PLACE_BASE]
    places = [score for score in members.values() if PLACE_BASE <= score < DEADLINE_BASE]
    mine = members.get("?" + job)
    ahead = len(places) if mine is None else sum(1 for place in places if place < mine)
    if ahead < limit - len(held):
        members[member] = now + ttl
        members.pop("?" + job, None)
        members.pop("!" + job, None)
        return 0.0
    if mine is None:  # at the back, after every place given before it (a clock that stepped back, a tie)
        members["?" + job] = max(PLACE_BASE + now, max(places, default=0.0) + 1e-3)
    members["!" + job] = DEADLINE_BASE + now + LINE_SECONDS
    soonest = max(1e-3, min(held) - now) if held else FRONT_RETRY_SECONDS  # when the first slot runs out
    # Next for a slot as one frees: asks again soon. Further back: often enough to keep its place.
    return min(soonest, FRONT_RETRY_SECONDS if ahead < limit else CONCURRENCY_RETRY_SECONDS)


def line_of(members: dict[str, float], now: float) -> list[str]:
    """The jobs waiting in a key's line, first first (tests, inspection)."""
    waiting = [(score, m[1:]) for m, score in members.items()
               if m[0] == "?" and members.get("!" + m[1:], 0.0) > DEADLINE_BASE + now]
    return [job for _, job in sorted(waiting)]


def first_in_line(members: dict[str, float]) -> str | None:
    """The job first in a key's line (its place may have lapsed: waking it costs one advance), or ``None``."""
    places = [(score, m[1:]) for m, score in members.items() if PLACE_BASE <= score < DEADLINE_BASE]
    return min(places)[1] if places else None


def held_slots(members: dict[str, float], now: float) -> list[str]:
    """The members holding a live slot (tests, inspection)."""
    return sorted(m for m, score in members.items() if now < score < PLACE_BASE)


class MemoryFlowStore:
    """Rate buckets and concurrency slots in this process (see the module docstring)."""

    def __init__(self) -> None:
        self._buckets: dict[str, Bucket] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def take_rate(self, model: str, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                  now: float) -> float:
        with self._lock:
            bucket = self._buckets.setdefault(model, Bucket())
            return take_from_bucket(bucket, rpm=rpm, tpm=tpm, burst=burst, tokens=tokens, now=now)

    def adjust_rate(self, model: str, tokens: int) -> None:
        with self._lock:
            bucket = self._buckets.get(model)
            if bucket is not None and bucket.tokens is not None:
                bucket.tokens -= tokens

    def block_rate(self, model: str, seconds: float, *, now: float) -> None:
        check_block_seconds(seconds)
        with self._lock:
            bucket = self._buckets.setdefault(model, Bucket())
            bucket.blocked_until = max(bucket.blocked_until, now + seconds)

    def take_slot(self, key: str, member: str, *, limit: int, ttl: float, now: float) -> float:
        check_slot_ttl(ttl)
        check_slot_member(member)
        with self._lock:
            return take_in_line(self._slots.setdefault(key, {}), member, limit=limit, ttl=ttl, now=now)

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        check_slot_ttl(ttl)
        with self._lock:
            held = self._slots.get(key, {})
            if not now < held.get(member, PLACE_BASE) < PLACE_BASE:  # released, run out, or not a slot at all
                return False
            held[member] = now + ttl
            return True

    def release_slot(self, key: str, member: str) -> str | None:
        with self._lock:
            members = self._slots.get(key, {})
            members.pop(member, None)
            return first_in_line(members)

    def slots(self, key: str, now: float) -> list[str]:
        """Members holding a live slot of ``key`` (tests, inspection)."""
        with self._lock:
            return held_slots(self._slots.get(key, {}), now)

    def line(self, key: str, now: float) -> list[str]:
        """The jobs waiting for a slot of ``key``, first first (tests, inspection)."""
        with self._lock:
            return line_of(self._slots.get(key, {}), now)
