"""The :class:`~adapters.base.FlowStore` port in process memory: the twin of :mod:`adapters.redis.flow`.

Same buckets and slots, same answers, on the caller's clock (a test's
virtual clock moves them without sleeping). One lock makes every method the
atomic check-and-take the Redis scripts are.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pipelines.engine.flow import (
    FRONT_RETRY_SECONDS,
    LINE_SECONDS,
    bucket_sizes,
    check_block_seconds,
    check_slot_member,
    check_slot_ttl,
)

__all__ = ["MemoryFlowStore", "line_of", "take_from_bucket", "take_in_line"]


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


def take_in_line(members: dict[str, float], member: str, *, limit: int, ttl: float, now: float) -> float:
    """Take a slot of one key for ``member``, in line; 0 when taken, else seconds to wait. Changes ``members``.

    ``members``: the key's entries, each with when it runs out: the slots held (``"<job id>[ <owner>]"``)
    and the line of jobs refused (``"?<when it first asked> <job id>"``; a job id holds no space or
    ``?``). A free slot goes to a job only if fewer jobs wait ahead of it than slots are free: every
    waiting job is ahead of one not in line (a job that just gave its slot back asks again at the back).
    A refused job keeps its place for :data:`LINE_SECONDS` from each ask. The Redis script
    (``adapters.redis.flow.TAKE_SLOT``) is this function in Lua; change both together.
    """
    for other, expiry in list(members.items()):
        if expiry <= now:  # a killed worker's slot (its lease ran out), or a job that stopped asking
            del members[other]
    if member in members:
        members[member] = now + ttl
        return 0.0
    job = member.split(" ", 1)[0]
    held: list[float] = []
    line: list[tuple[float, str, str]] = []
    for m, expiry in members.items():
        if m.startswith("?"):
            asked, _, waiting = m[1:].partition(" ")
            line.append((float(asked), waiting, m))
        else:
            held.append(expiry)
    line.sort()
    place = next((i for i, (_, waiting, _) in enumerate(line) if waiting == job), None)
    ahead = len(line) if place is None else place
    if ahead < limit - len(held):
        members[member] = now + ttl
        if place is not None:
            del members[line[place][2]]
        return 0.0
    # A place is stamped with when the job first asked, after every place given before it (clocks and
    # ties: two jobs asking in the same microsecond still keep the order they came in).
    stamp = max(now, line[-1][0] + 1e-6) if line else now
    members[f"?{stamp:.6f} {job}" if place is None else line[place][2]] = now + LINE_SECONDS
    soonest = max(1e-3, min(held) - now) if held else FRONT_RETRY_SECONDS  # when the first slot runs out
    return min(soonest, FRONT_RETRY_SECONDS) if ahead < limit else soonest  # next for a slot: asks again soon


def line_of(members: dict[str, float], now: float) -> list[str]:
    """The jobs waiting in a key's line, first first (tests, inspection)."""
    line = sorted((float(m[1:].partition(" ")[0]), m[1:].partition(" ")[2]) for m, expiry in members.items()
                  if m.startswith("?") and expiry > now)
    return [job for _, job in line]


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
            if member.startswith("?") or held.get(member, now) <= now:  # released, or run out: take_slot's choice
                return False
            held[member] = now + ttl
            return True

    def release_slot(self, key: str, member: str) -> None:
        with self._lock:
            self._slots.get(key, {}).pop(member, None)

    def slots(self, key: str, now: float) -> list[str]:
        """Members holding a live slot of ``key`` (tests, inspection)."""
        with self._lock:
            return sorted(m for m, expiry in self._slots.get(key, {}).items() if expiry > now and m[:1] != "?")

    def line(self, key: str, now: float) -> list[str]:
        """The jobs waiting for a slot of ``key``, first first (tests, inspection)."""
        with self._lock:
            return line_of(self._slots.get(key, {}), now)
