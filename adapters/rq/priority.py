"""RQ workers that read the priority queues in order, with a share for background work.

``pipelines worker`` listens on ``[<queue>, <queue>-background]`` (see
:attr:`adapters.rq.RQScheduler.queue_names`). RQ takes from the first
non-empty queue in the list, so interactive work always goes first; alone,
that would starve background work under sustained interactive load. So after
``background_every - 1`` interactive takes in a row the worker reads the
background queue first for one take (if it is empty, interactive work is
taken as usual): background work gets at least one take in
``background_every`` (default 5) per worker, whatever the load.

Both classes also run ``warm_up`` (``pipelines worker`` sets it to import
and warm litellm) to its end before their first take, never beside one (see
:class:`_WarmBeforeFirstTake`), and go on through a Redis outage
(:mod:`adapters.rq.recovery`), send RQ's heartbeat and state only when they change something
(:mod:`adapters.rq.bookkeeping`), and take their horse and scheduler child with them
when they die (:mod:`adapters.rq.lifeline`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rq import Queue, SimpleWorker, Worker

from adapters.rq.bookkeeping import LeanBookkeeping
from adapters.rq.lifeline import Lifeline
from adapters.rq.recovery import RidesOutOutages, SchedulerKeeper

__all__ = ["DEFAULT_BACKGROUND_EVERY", "PrioritySimpleWorker", "PriorityWorker", "priority_order"]

DEFAULT_BACKGROUND_EVERY = 5


def priority_order(queues: list[Queue], taken: Queue, streak: int, every: int) -> tuple[list[Queue], int]:
    """The queue order for the next take after one from ``taken``, and the new interactive streak."""
    streak = streak + 1 if taken.name == queues[0].name else 0
    if len(queues) > 1 and every > 0 and streak >= every - 1:
        return [*queues[1:], queues[0]], streak
    return list(queues), streak


class _PriorityOrder:
    """Mixin over an RQ worker: :func:`priority_order` after every take (RQ calls ``reorder_queues``)."""

    background_every: int = DEFAULT_BACKGROUND_EVERY
    queues: list[Queue]
    _ordered_queues: list[Queue]
    _streak: int = 0

    def reorder_queues(self, reference_queue: Any) -> None:
        self._ordered_queues, self._streak = priority_order(self.queues, reference_queue, self._streak,
                                                            self.background_every)


class _WarmBeforeFirstTake:
    """Mixin over an RQ worker: ``warm_up()`` runs once, to its end, before the work loop first asks for a job.

    By then RQ has registered the worker (its state stays "started" until
    this returns, then "idle") and forked its scheduler process (which so
    never loads litellm). Not after the first take: a turn taken while
    litellm loads holds its job's lease through the import, and a worker
    killed meanwhile costs the job a whole lease. Workers restarted every
    0.5 s (make chaos) then advanced no job at all (0 of 40 in 180 s),
    though each lived longer than a turn. A forking worker's horses inherit
    the loaded module instead of importing it each.
    """

    warm_up: Callable[[], object] | None = None
    _warm_up_started: bool = False

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        if not self._warm_up_started and self.warm_up is not None:
            self._warm_up_started = True
            self.warm_up()
        return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)  # type: ignore[misc]


class PriorityWorker(Lifeline, RidesOutOutages, LeanBookkeeping, SchedulerKeeper, _WarmBeforeFirstTake,
                     _PriorityOrder, Worker):
    """A forking RQ worker reading its queues in priority order with a background share."""


class PrioritySimpleWorker(Lifeline, RidesOutOutages, LeanBookkeeping, SchedulerKeeper,
                           _WarmBeforeFirstTake, _PriorityOrder, SimpleWorker):
    """An in-process RQ worker reading its queues in priority order with a background share."""
