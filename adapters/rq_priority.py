"""RQ workers that read the priority queues in order, with a share for background work.

``pipelines worker`` listens on ``[<queue>, <queue>-background]`` (see
:attr:`adapters.rq.RQScheduler.queue_names`). RQ takes from the first
non-empty queue in the list, so interactive work always goes first; alone,
that would starve background work under sustained interactive load. So after
``background_every - 1`` interactive takes in a row the worker reads the
background queue first for one take (if it is empty, interactive work is
taken as usual): background work gets at least one take in
``background_every`` (default 5) per worker, whatever the load.
"""

from __future__ import annotations

from typing import Any

from rq import Queue, SimpleWorker, Worker

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


class PriorityWorker(_PriorityOrder, Worker):
    """A forking RQ worker reading its queues in priority order with a background share."""


class PrioritySimpleWorker(_PriorityOrder, SimpleWorker):
    """An in-process RQ worker reading its queues in priority order with a background share."""
