"""The scheduler port: how the next advance is triggered, and what a scheduler may add to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["AdvanceFn", "Scheduler", "InProcessScheduler", "Backlog", "BacklogProbe", "NamedQueues"]


AdvanceFn = Callable[[str], object]
"""What a scheduler calls to advance one job: ``fn(job_id)`` (its return value is ignored)."""


@runtime_checkable
class Scheduler(Protocol):
    """Triggers an advance of a job, now or after a delay.

    ``precision``: how early (seconds) a delayed delivery may arrive; the
    runner accepts a message that early instead of dropping it (RQ: ~1 s).
    """

    precision: float

    def schedule_advance(
        self, job_id: str, delay: float = 0.0, *, pipeline: str = "default", version: int | None = None,
        priority: str | None = None,
    ) -> None:
        """Ask for ``job_id`` to be advanced after ``delay`` seconds (at least once).

        ``priority`` (``"interactive"``, the default, or ``"background"``):
        where the queue allows, interactive work is taken first.
        """
        ...

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        """Ask again, now, for an advance the queue lost (the sweep); ahead of other work where possible."""
        ...

    def now(self) -> float:
        """The scheduler's clock, in seconds since the epoch."""
        ...


@runtime_checkable
class InProcessScheduler(Scheduler, Protocol):
    """A scheduler that runs advances itself, in this process (the memory scheduler).

    It is attached once to the function that advances a job (the App's), and
    ``drain()`` runs what is scheduled. Queue schedulers have no such thing:
    their workers load the app by its import path.
    """

    def attach(self, advance: AdvanceFn) -> None:
        """Use ``advance(job_id)`` for every advance from now on."""
        ...

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run advances until none is scheduled; returns how many ran."""
        ...


@runtime_checkable
class Backlog(Protocol):
    """A scheduler that can tell whether work is waiting (optional; RQ and memory have it).

    The runner asks it before it keeps a job under ``continue_for``: a worker
    hands the job back as soon as other work of the same or a higher priority
    waits, so a busy conversation never makes a new one wait behind it.
    """

    def work_waiting(self, priority: str | None = None) -> bool:
        """Whether an advance of ``priority`` (or a higher one) is queued and due now."""
        ...


@runtime_checkable
class BacklogProbe(Protocol):
    """A :class:`Backlog` that can ask without waiting for the answer (optional; RQ has it).

    The runner asks before it runs a phase under ``continue_for`` and reads
    the answer when it commits that phase, so the question's round trip
    overlaps the phase instead of delaying it.
    """

    def probe_work_waiting(self, priority: str | None = None) -> Callable[[], bool]:
        """``work_waiting(priority)`` asked now; the returned function gives its answer (call it in every case)."""
        ...


@runtime_checkable
class NamedQueues(Protocol):
    """A queue scheduler that names the queue a run of each priority waits on (for people: hints, health)."""

    def queue_for(self, priority: str | None = None) -> str:
        """The name of the queue advances of ``priority`` (default: the highest) are sent to."""
        ...
