"""The advance requests a :class:`~adapters.local.LocalScheduler` keeps in its process, by due time and priority."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from dataclasses import dataclass, field

from pipelines.engine.errors import InvalidInputError

__all__ = ["Requests", "rank"]

logger = logging.getLogger("pipelines")

_RANKS = {None: 0, "interactive": 0, "background": 1}


def rank(priority: str | None) -> int:
    try:
        return _RANKS[priority]
    except (KeyError, TypeError):
        raise InvalidInputError(f"priority must be 'interactive' or 'background', got {priority!r}") from None


@dataclass(order=True)
class _Request:
    due: float
    rank: int
    seq: int
    job_id: str = field(compare=False)


class Requests:
    """Advance requests of this process: delayed ones by due time, due ones by priority, then due time.

    At most :attr:`limit` are kept: a process that runs none of them (no workers, an App that only starts
    jobs, the others claiming them from the storage) would otherwise keep every one it ever made. They are
    only hints (the storage says what is due), so past the limit the latest-due half is let go.
    """

    limit = 100_000

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._delayed: list[_Request] = []
        self._ready: list[tuple[int, float, int, str]] = []
        self._seq = itertools.count()
        self._warned = False

    def add(self, job_id: str, due: float, rank: int) -> None:
        with self.cond:
            heapq.heappush(self._delayed, _Request(due, rank, next(self._seq), job_id))
            if len(self) > self.limit:
                self._shed()
            self.cond.notify()

    def _shed(self) -> None:
        """Keep the earliest-due half of the requests (under ``cond``)."""
        keep = self.limit // 2
        ready = heapq.nsmallest(min(keep, len(self._ready)), self._ready)
        delayed = heapq.nsmallest(keep - len(ready), self._delayed)
        dropped = len(self) - len(ready) - len(delayed)
        self._ready, self._delayed = ready, delayed  # sorted lists are heaps
        if not self._warned:
            self._warned = True
            logger.warning("LocalScheduler: more than %d advance requests held and none run here (no workers?): "
                           "%d of the latest-due let go; the storage's claims and the sweep find their jobs",
                           self.limit, dropped)

    def _promote(self, now: float) -> None:
        while self._delayed and self._delayed[0].due <= now:
            r = heapq.heappop(self._delayed)
            heapq.heappush(self._ready, (r.rank, r.due, r.seq, r.job_id))

    def take(self, now: float) -> str | None:
        """The next request due at ``now`` (interactive first), or ``None``; call under ``cond``."""
        taken = self.take_ranked(now)
        return None if taken is None else taken[0]

    def take_ranked(self, now: float) -> tuple[str, int] | None:
        """The next request due at ``now`` as ``(job id, rank)`` (to put it back as it was), or ``None``."""
        self._promote(now)
        if not self._ready:
            return None
        rank, _, _, job_id = heapq.heappop(self._ready)
        return job_id, rank

    def next_due(self) -> float | None:
        """When the earliest request is due (call under ``cond``)."""
        if self._ready:
            return 0.0
        return self._delayed[0].due if self._delayed else None

    def due(self, now: float) -> int:
        """How many requests are due at ``now`` (call under ``cond``)."""
        self._promote(now)
        return len(self._ready)

    def waiting(self, now: float, rank: int) -> bool:
        with self.cond:
            self._promote(now)
            return any(r[0] <= rank for r in self._ready)

    def __len__(self) -> int:
        return len(self._delayed) + len(self._ready)

    def listed(self) -> list[tuple[float, str, str]]:
        """Every request as ``(due, priority, job id)``, earliest first."""
        with self.cond:
            rows = [(r.due, r.rank, r.job_id) for r in self._delayed] + [(d, k, j) for k, d, _, j in self._ready]
        return [(due, "background" if rank else "interactive", job_id) for due, rank, job_id in sorted(rows)]

    def clear(self) -> int:
        with self.cond:
            n = len(self)
            self._delayed.clear()
            self._ready.clear()
            return n
