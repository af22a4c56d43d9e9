"""``MemoryScheduler``: the :class:`~adapters.base.Scheduler` port on a virtual clock (tests, the offline demo)."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from adapters.base import Feature
from adapters.memory.clock import VirtualClock
from pipelines.engine.errors import ConfigurationError, InvalidInputError

__all__ = ["MemoryScheduler"]


class _Entry(NamedTuple):
    # A tuple, so the heap compares entries in C: (due, rank, seq) decide, seq being unique.
    due: float
    rank: int  # 0 interactive, 1 background: at the same due time, interactive runs first
    seq: int
    job_id: str
    pipeline: str


def _rank(priority: str | None) -> int:
    if priority in (None, "interactive"):
        return 0
    if priority == "background":
        return 1
    raise InvalidInputError(f"priority must be 'interactive' or 'background', got {priority!r}")


class MemoryScheduler:
    """The :class:`~adapters.base.Scheduler` port on a virtual clock.

    ``drain()`` runs every scheduled advance in due order, moving the clock
    forward instead of sleeping; ``run_next()`` runs exactly one.
    """

    features: ClassVar[frozenset[Feature]] = frozenset({Feature.BACKLOG, Feature.IN_PROCESS})

    def __init__(self, *, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        self._heap: list[_Entry] = []
        self._seq = itertools.count()
        self._advance: Callable[[str], object] | None = None
        self._lock = threading.Lock()
        self.scheduled = 0  # total schedule_advance calls, for tests

    #: Delayed advances run exactly on time on the virtual clock.
    precision: float = 0.0

    def attach(self, advance: Callable[[str], object]) -> None:
        """Run ``advance(job_id)`` for every advance (the App attaches itself once)."""
        self._advance = advance

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        self.schedule_advance(job_id, 0.0, pipeline=pipeline, version=version, priority=priority)

    def schedule_advance(
        self, job_id: str, delay: float = 0.0, *, pipeline: str = "default", version: int | None = None,
        priority: str | None = None,
    ) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        rank = _rank(priority)
        with self._lock:
            heapq.heappush(self._heap, _Entry(self.clock() + delay, rank, next(self._seq), job_id, pipeline))
            self.scheduled += 1

    def work_waiting(self, priority: str | None = None) -> bool:
        """Whether an advance of ``priority`` or a higher one is due now (the runner's ``continue_for`` asks)."""
        rank, now = _rank(priority), self.clock()
        with self._lock:
            return any(e.due <= now and e.rank <= rank for e in self._heap)

    def now(self) -> float:
        return self.clock()

    def pending(self) -> int:
        """How many advances are scheduled and not yet run."""
        with self._lock:
            return len(self._heap)

    def next_due(self) -> float | None:
        with self._lock:
            return self._heap[0].due if self._heap else None

    def advances(self) -> list[tuple[float, str, str]]:
        """The scheduled advances, earliest first, as ``(due, priority, job id)`` (for people: the web page)."""
        with self._lock:
            entries = sorted(self._heap)
        return [(e.due, "background" if e.rank else "interactive", e.job_id) for e in entries]

    def run_next(self) -> bool:
        """Run the earliest scheduled advance, moving the clock to its due time. ``False`` if none."""
        with self._lock:
            if not self._heap:
                return False
            entry = heapq.heappop(self._heap)
        self.clock.advance_to(entry.due)
        if self._advance is None:
            raise ConfigurationError(f"nothing can advance job {entry.job_id!r}: this MemoryScheduler is not "
                                     "attached to an App (App(storage=..., scheduler=...) attaches it)")
        self._advance(entry.job_id)
        return True

    def run_due(self) -> int:
        """Run only what is due now, without moving the clock. Returns how many ran."""
        ran = 0
        while (due := self.next_due()) is not None and due <= self.clock():
            self.run_next()
            ran += 1
        return ran

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run advances until none is scheduled; returns how many ran.

        Phase exceptions never escape (the runner records them on the job).
        """
        ran = 0
        while self.run_next():
            ran += 1
            if ran >= max_advances:
                raise RuntimeError(f"drain stopped after {max_advances} advances; a pipeline loops forever?")
        return ran

    def drop_all(self) -> int:
        """Forget every scheduled advance (simulates lost queue messages). Returns how many."""
        with self._lock:
            n = len(self._heap)
            self._heap.clear()
        return n
