"""Lease renewal while a phase runs: one daemon thread per process for every lease in flight."""

from __future__ import annotations

import logging
import math
import os
import threading
import time

from adapters.base import Storage
from pipelines.engine._daemon import Daemon, start_daemon
from pipelines.engine.errors import InvalidInputError, PipelineError

__all__ = ["LEASE_KEEPER", "LeaseKeeper", "check_lease_seconds"]

logger = logging.getLogger("pipelines")


def check_lease_seconds(value: object) -> float:
    """A lease time to live must be a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise InvalidInputError(f"lease_seconds must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class LeaseKeeper:
    """One daemon thread per process renews the leases of every phase in flight.

    A thread per advance would cost more than a whole memory-adapter turn;
    registering a lease here is a dict insert.
    """

    def __init__(self) -> None:
        self._leases: dict[int, tuple[Storage, str, str, float, float]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Daemon | None = None
        self._ids = iter(range(1 << 62))

    def reset_after_fork(self) -> None:
        # A forked child (an RQ work-horse) inherits this object but not the
        # thread, and may inherit the lock in a held state: start afresh.
        self._leases = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None

    def hold(self, storage: Storage, job_id: str, owner: str, ttl: float) -> int:
        with self._lock:
            key = next(self._ids)
            self._leases[key] = (storage, job_id, owner, ttl, time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._thread = start_daemon(self._run, "pipelines-lease-keeper")
        return key

    def drop(self, key: int) -> None:
        with self._lock:
            self._leases.pop(key, None)

    def _run(self) -> None:
        while True:
            self._wake.wait(0.5)
            now = time.monotonic()
            with self._lock:
                due = [(k, v) for k, v in self._leases.items() if now - v[4] >= v[3] / 3]
            for key, (storage, job_id, owner, ttl, _) in due:
                try:
                    renewed = storage.renew_lease(job_id, owner, ttl)
                except PipelineError:
                    logger.warning("lease renewal failed for %s", job_id, exc_info=True)
                    continue
                with self._lock:
                    if key in self._leases:
                        if renewed:
                            self._leases[key] = (storage, job_id, owner, ttl, now)
                        else:
                            del self._leases[key]  # lost: the commit will be fenced off


LEASE_KEEPER = LeaseKeeper()
os.register_at_fork(after_in_child=LEASE_KEEPER.reset_after_fork)
