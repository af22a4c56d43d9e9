"""Whether a worker keeps a job's lease after a turn's commit, to run its next turn itself (``continue_for``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from adapters.base import Backlog, BacklogProbe, Scheduler
from pipelines.engine.capabilities import Feature, as_feature
from pipelines.engine.errors import PipelineError

__all__ = ["keep_lease"]


def keep_lease(deadline: float | None, scheduler: Scheduler) -> Callable[[], bool]:
    """Whether the phase about to run keeps the job's lease after its commit (``continue_for``, until ``deadline``).

    It keeps it while the deadline is ahead and no other work of this
    job's priority (or higher) waits: anything waiting in the queue was
    sent before this job's next turn would be, so it is older work; a new
    conversation never waits behind a busy one. The queue is asked now and
    its answer read at the commit (a :class:`~adapters.base.BacklogProbe`
    sends the question and goes on), so the round trip overlaps the phase.
    """
    if deadline is None or time.monotonic() >= deadline:
        return _NEVER
    backlog = as_feature(scheduler, Feature.BACKLOG, Backlog)  # type: ignore[type-abstract]
    if backlog is None:
        return _ALWAYS
    try:
        probe = as_feature(scheduler, Feature.BACKLOG_PROBE, BacklogProbe)  # type: ignore[type-abstract]
        if probe is not None:
            return _Keep(probe.probe_work_waiting())
        return _NEVER if backlog.work_waiting() else _ALWAYS
    except PipelineError:
        return _NEVER  # cannot tell: the fair choice is to go back to the queue


def _never() -> bool:
    return False


def _always() -> bool:
    return True


_NEVER: Callable[[], bool] = _never
_ALWAYS: Callable[[], bool] = _always


class _Keep:
    """The answer of a :class:`~adapters.base.BacklogProbe`, read once: keep the lease unless work waits."""

    def __init__(self, work_waiting: Callable[[], bool]) -> None:
        self._work_waiting: Callable[[], bool] | None = work_waiting
        self._keep = False

    def __call__(self) -> bool:
        ask, self._work_waiting = self._work_waiting, None
        if ask is not None:
            try:
                self._keep = not ask()
            except PipelineError:
                self._keep = False  # cannot tell: the fair choice is to go back to the queue
        return self._keep
