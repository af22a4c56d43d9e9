"""Lease renewal while a phase runs: one daemon thread per process for every lease in flight.

Whatever lives with a lease is renewed with it and released with it: a
:class:`Companion` attached to a held lease (a concurrency slot, see
:mod:`pipelines.engine.flow`) is renewed right after each renewal of the
lease, and released the moment the lease is found lost. Lease first, then
the companion: a lost lease never extends anything, and the companion may
live under another key (a Redis Cluster puts it in another hash slot), so
the two renewals are two calls, not one script.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Protocol

from adapters.base import Storage
from pipelines.engine._daemon import Daemon, start_daemon
from pipelines.engine.errors import InvalidInputError, PipelineError

__all__ = ["LEASE_KEEPER", "MIN_LEASE_SECONDS", "Companion", "LeaseKeeper", "check_lease_seconds"]

logger = logging.getLogger("pipelines")


MIN_LEASE_SECONDS = 1.0
"""The shortest lease taken: below it an ordinary pause (a collection, a slow round trip, a busy core) outlasts
the lease before its renewal lands, and every turn is fenced off and runs again, its tools with it."""
_TICK = 0.5  # the keeper's look at the leases it holds, at most this far apart (less for short leases)


def check_lease_seconds(value: object) -> float:
    """A lease time to live must be a finite number of seconds >= :data:`MIN_LEASE_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise InvalidInputError(f"lease_seconds must be a finite number of seconds > 0, got {value!r}")
    if value < MIN_LEASE_SECONDS:
        raise InvalidInputError(f"lease_seconds must be at least {MIN_LEASE_SECONDS:g} s, got {value!r}: a shorter "
                                "lease runs out before it is renewed, and each turn is fenced off and runs again")
    return float(value)


class Companion(Protocol):
    """Something held only while a lease is: renewed with it, released with it (:meth:`LeaseKeeper.attach`)."""

    def renew(self) -> bool:
        """Extend it as the lease was just extended; ``False`` when it was no longer held."""
        ...

    def release(self) -> None:
        """Give it back (the lease was lost); a no-op when it is not held."""
        ...


_Held = tuple[Storage, str, str, float, float]
"""storage, job id, owner, ttl, when (monotonic) the lease was last renewed."""


class LeaseKeeper:
    """One daemon thread per process renews the leases of every phase in flight.

    A thread per advance would cost more than a whole memory-adapter turn;
    registering a lease here is a dict insert.
    """

    def __init__(self) -> None:
        self._leases: dict[int, _Held] = {}
        self._companions: dict[int, list[Companion]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Daemon | None = None
        self._ids = iter(range(1 << 62))
        self._tick = _TICK

    def reset_after_fork(self) -> None:
        # A forked child (an RQ work-horse) inherits this object but not the
        # thread, and may inherit the lock in a held state: start afresh.
        self._leases = {}
        self._companions = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._tick = _TICK

    def hold(self, storage: Storage, job_id: str, owner: str, ttl: float) -> int:
        with self._lock:
            key = next(self._ids)
            self._leases[key] = (storage, job_id, owner, ttl, time.monotonic())
            # Renewed at a third of its ttl: looked at six times a ttl, so a renewal lands by half of it.
            self._tick = min(self._tick, ttl / 6)
            if self._thread is None or not self._thread.is_alive():
                self._thread = start_daemon(self._run, "pipelines-lease-keeper")
        return key

    def drop(self, key: int) -> None:
        with self._lock:
            self._leases.pop(key, None)
            self._companions.pop(key, None)

    def attach(self, key: int, companion: Companion) -> None:
        """Renew ``companion`` with the lease ``key`` and release it if the lease is lost.

        A lease already lost (or dropped) releases it at once: nothing
        outlives the lease it came with.
        """
        with self._lock:
            alive = key in self._leases
            if alive:
                self._companions.setdefault(key, []).append(companion)
        if not alive:
            companion.release()

    def detach(self, key: int, companion: Companion) -> None:
        """Stop renewing ``companion`` (its holder gives it back itself)."""
        with self._lock:
            held = self._companions.get(key)
            if held is not None and companion in held:
                held.remove(companion)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._tick)
            self.renew_due(time.monotonic())

    def renew_due(self, now: float) -> None:
        """Renew every lease that is a third of its ttl old (``now``: monotonic), and its companions."""
        with self._lock:
            due = [(k, v) for k, v in self._leases.items() if now - v[4] >= v[3] / 3]
            # The look interval follows the shortest lease held now: back to _TICK once the short ones are gone
            # (hold() only lowers it, on the hot path; this runs a few times a second, off it).
            self._tick = min([_TICK, *(v[3] / 6 for v in self._leases.values())])
        for key, (storage, job_id, owner, ttl, _) in due:
            try:
                renewed = storage.renew_lease(job_id, owner, ttl)
            except PipelineError:
                logger.warning("lease renewal failed for %s", job_id, exc_info=True)
                continue
            with self._lock:
                if key not in self._leases:
                    continue  # the phase ended meanwhile: its holder released everything
                if renewed:
                    self._leases[key] = (storage, job_id, owner, ttl, now)
                    companions = list(self._companions.get(key, ()))
                else:
                    del self._leases[key]  # lost: the commit will be fenced off
                    companions = self._companions.pop(key, [])
            _follow(job_id, companions, renewed)


def _follow(job_id: str, companions: list[Companion], renewed: bool) -> None:
    """Renew (or, the lease lost, release) what lives with the lease of ``job_id``; a failure is logged."""
    for companion in companions:
        try:
            if not renewed:
                companion.release()
            elif not companion.renew():
                logger.warning("job %s: %r ran out while its lease was held; not renewed", job_id, companion)
        except PipelineError:
            logger.warning("renewing or releasing %r of job %s failed", companion, job_id, exc_info=True)


LEASE_KEEPER = LeaseKeeper()
os.register_at_fork(after_in_child=LEASE_KEEPER.reset_after_fork)
