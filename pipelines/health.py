"""``pipelines health``: is the deployment of an App able to advance its jobs? Fit for a container probe.

Checks, each a :class:`Check`: storage reachable; the due backlog and its
oldest overdue job, by its time in the due index (beyond ``max_overdue``
seconds is unhealthy: nothing is advancing jobs; a job waiting for a
concurrency slot or a rate limit is moved later there, so it is not
overdue); for an RQ scheduler, workers registered and alive and the size of
RQ's failed-job registry (reported, never fatal: phaserunner records
failures on the job). Exit code 0 when every check passes, 1 otherwise.

A ``pipelines worker`` is alive while the key it renews every few seconds
exists (:func:`adapters.rq.lifeline.alive_key`, a TTL of ~10 s): a worker
killed with ``kill -9`` is dead here within that TTL, not after RQ's own
heartbeat expires (minutes). Other RQ workers are judged by RQ's heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.app.queues import alive_workers
from pipelines.engine.errors import PipelineError

if TYPE_CHECKING:
    from adapters.base import Storage
    from pipelines.app import App

__all__ = ["Check", "check"]

_PRECISION = 0.05  # seconds: how close the backlog's oldest due time is found
_SEARCHED = 366 * 24 * 3600.0  # how far back it is looked for when its record cannot say


@dataclass(frozen=True)
class Check:
    """One health check: its name, whether it passed, and what it found."""

    name: str
    ok: bool
    detail: str


def check(app: App, *, max_overdue: float = 60.0) -> list[Check]:
    """Run every check against ``app`` (see the module docstring)."""
    try:
        app.storage.get_job("health-check")  # one round trip; the id need not exist
    except PipelineError as exc:
        return [Check("storage", False, f"unreachable: {exc}")]
    try:
        backlog = _backlog(app, max_overdue)
    except PipelineError as exc:  # storage went away during the search: a failed check, not a traceback
        backlog = Check("backlog", False, f"could not be read: {exc}")
    checks = [Check("storage", True, f"{type(app.storage).__name__} reachable"), backlog]
    return checks + _rq_checks(app)


def _backlog(app: App, max_overdue: float) -> Check:
    storage, now = app.storage, app.scheduler.now()
    due = storage.due_jobs(now, limit=100_000)
    if not due:
        return Check("backlog", True, "no job is due")
    # A job whose turn is in flight (its lease held: a long tool call, a slow model) keeps the due time it
    # had when the turn began: it is being advanced, not waiting. The first one no worker holds is judged.
    position = next((i for i, j in enumerate(due[:_LEASES_READ]) if storage.lease_owner(j) is None), None)
    if position is None:
        return Check("backlog", True, f"{len(due)} due; the oldest {min(len(due), _LEASES_READ)} in flight")
    waiting = due[position]
    late = now - _due_since(storage, waiting, position, now)
    detail = f"{len(due)} due; oldest {waiting} overdue by {late:.1f} s (limit {max_overdue:g} s)"
    return Check("backlog", late <= max_overdue, detail)


_LEASES_READ = 100  # due jobs whose lease is read, oldest first, for one not in flight


def _due_since(storage: Storage, job: str, position: int, now: float) -> float:
    """When ``job``, at ``position`` in the due index (oldest first), became due there (to ``_PRECISION``).

    The index's time, not the record's ``due_at``: a turn deferred by flow control (waiting for a
    concurrency slot or a rate limit) commits nothing; it is only moved later in the index
    (``Storage.postpone``), and a job waiting so is not a backlog. The record's ``due_at`` is never
    later than that time, so the search starts there: one read when the job was not postponed. The
    jobs due by a time are a prefix of the index's order, so ``job`` is due by it when it is among the
    first ``position + 1`` of them.
    """
    try:
        record = storage.get_job(job)
    except PipelineError:  # unreadable: the index alone says when it became due
        record = None
    low = record.checkpoint.due_at if record is not None and record.checkpoint is not None else None
    low, high = (now - _SEARCHED if low is None else min(low, now)), now

    def due_by(cut: float) -> bool:
        return job in storage.due_jobs(cut, limit=position + 1)

    if due_by(low):
        return low
    for _ in range(64):  # bisect between the record's time and now
        if high - low <= _PRECISION:
            break
        middle = (low + high) / 2
        low, high = (low, middle) if due_by(middle) else (middle, high)
    return high


def _rq_checks(app: App) -> list[Check]:
    try:
        from adapters.rq import RQScheduler
    except ImportError:  # rq not installed: this app cannot be using it
        return []
    if not isinstance(app.scheduler, RQScheduler):
        return [Check("workers", True, f"not checked for {type(app.scheduler).__name__}")]
    from rq import Worker

    scheduler = app.scheduler
    workers = Worker.all(connection=scheduler.connection, queue=scheduler.queue)
    alive = alive_workers(scheduler.connection, workers)
    failed = scheduler.queue.failed_job_registry.count
    return [
        Check("workers", bool(alive), f"{len(alive)} alive of {len(workers)} registered on queue "
                                      f"{scheduler.queue_name!r}"),
        Check("failed", True, f"{failed} in RQ's failed-job registry"),
    ]
