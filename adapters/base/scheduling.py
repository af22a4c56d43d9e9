"""The scheduler port: how the next advance is triggered, and what a scheduler may add to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pipelines.engine.errors import ConfigurationError

__all__ = ["AdvanceFn", "Scheduler", "InProcessScheduler", "Backlog", "BacklogProbe", "NamedQueues",
           "HostedScheduler", "SchedulerHost", "WorkerEntry"]


AdvanceFn = Callable[[str], object]
"""What a scheduler calls to advance one job: ``fn(job_id)`` (its return value is ignored)."""


@runtime_checkable
class Scheduler(Protocol):
    """Triggers an advance of a job, now or after a delay.

    ``precision``: how early (seconds) a delayed delivery may arrive; the
    runner holds a message that early until its time instead of dropping it
    (RQ: 1 s, for two machines' clocks; it sends delays for the whole second
    at or after their end). How *late* one may arrive: :class:`LateDelivery`.
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
                priority: str | None = None) -> bool | None:
        """Ask again, now, for an advance the queue lost (the sweep); ahead of other work where possible.

        ``False``: nothing was sent, because the advance's message still waits
        where the queue will deliver it; ``True`` or ``None``: sent.
        """
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
class LateDelivery(Protocol):
    """A scheduler whose delayed deliveries may arrive up to ``lateness()`` seconds late (optional; RQ: 2 s).

    A turn deferred by flow control sends its retry under an id of its own, which the sweep's requeue
    cannot find: the job is due in the index only that long after its retry's time, so the sweep never
    sends it a second advance (and a second chain of retries) while its retry may still be on its way.
    """

    def lateness(self) -> float:
        """The most seconds a delayed advance may arrive after its time."""
        ...


@runtime_checkable
class NamedQueues(Protocol):
    """A queue scheduler that names the queue a run of each priority waits on (for people: hints, health)."""

    def queue_for(self, priority: str | None = None) -> str:
        """The name of the queue advances of ``priority`` (default: the highest) are sent to."""
        ...


@dataclass(frozen=True)
class WorkerEntry:
    """Where a queue worker's advance lives, by import path: what a queue message names (never a callable).

    The App a queue scheduler is built into tells it (:meth:`HostedScheduler.bind`): an adapter never names
    the composing layer, and the worker that runs these functions and the App that names them are one
    library, so they cannot disagree.
    """

    advance: str
    """``fn(job_id, version=None, app=None) -> str``: what a message names and a worker runs (RQ)."""
    advance_with_default: str
    """``fn(default_app, job_id, version=None, app=None) -> str``: what a worker-side task body calls (Celery).

    Never a message's entry point: a message cannot name its own default app."""

    def __post_init__(self) -> None:
        for name, value in (("advance", self.advance), ("advance_with_default", self.advance_with_default)):
            module, _, attr = value.rpartition(".") if isinstance(value, str) else ("", "", "")
            if not module or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
                raise ConfigurationError(f"WorkerEntry.{name} must be a dotted import path, got {value!r}")


class SchedulerHost(Protocol):
    """What the App a scheduler is built into offers it: told once, at the App's construction."""

    @property
    def storage(self) -> Any:
        """The App's storage (a :class:`~adapters.base.Storage`)."""
        ...

    @property
    def worker_entry(self) -> WorkerEntry:
        """What a queue message names for a worker to run."""
        ...

    def advance(self, job_id: str) -> object:
        """Advance ``job_id`` once, in this process."""
        ...

    def requeue_overdue(self, *, grace: float, limit: int = 1000) -> list[str]:
        """The App's sweep: enqueue every job overdue by ``grace`` seconds."""
        ...

    @property
    def names(self) -> list[str]:
        """The pipelines (agents included) the App runs: a local scheduler claims only their jobs."""
        ...


@runtime_checkable
class HostedScheduler(Protocol):
    """A scheduler that learns what it needs from the App built with it (queue schedulers, the local one).

    RQ and Celery learn the worker's entry point (:class:`WorkerEntry`); the local scheduler learns the
    storage it claims due work from and the sweep it runs.
    """

    def bind(self, host: SchedulerHost) -> None:
        """Take from ``host`` what this scheduler needs (the App calls it once, when it is built)."""
        ...
