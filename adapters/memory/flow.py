"""The :class:`~adapters.base.FlowStore` port in process memory: the twin of :mod:`adapters.redis.flow`.

Same buckets and slots, same answers, on the caller's clock (a test's
virtual clock moves them without sleeping). One lock makes every method the
atomic check-and-take the Redis scripts are.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pipelines.engine.flow import bucket_sizes, check_block_seconds, check_slot_ttl

__all__ = ["MemoryFlowStore", "take_from_bucket"]


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
        with self._lock:
            held = self._slots.setdefault(key, {})
            for other, expiry in list(held.items()):
                if expiry <= now:  # a killed worker's slot: its lease ran out
                    del held[other]
            if member in held or len(held) < limit:
                held[member] = now + ttl
                return 0.0
            return max(1e-3, min(held.values()) - now)

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        check_slot_ttl(ttl)
        with self._lock:
            held = self._slots.get(key, {})
            if held.get(member, now) <= now:  # released, or run out: taking it again is take_slot's choice
                return False
            held[member] = now + ttl
            return True

    def release_slot(self, key: str, member: str) -> None:
        with self._lock:
            self._slots.get(key, {}).pop(member, None)

    def slots(self, key: str, now: float) -> list[str]:
        """Members holding a live slot of ``key`` (tests, inspection)."""
        with self._lock:
            return sorted(m for m, expiry in self._slots.get(key, {}).items() if expiry > now)
