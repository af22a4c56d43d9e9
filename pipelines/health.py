"""``pipelines health``: is the deployment of an App able to advance its jobs? Fit for a container probe.

Checks, each a :class:`Check`: storage reachable; the due backlog and its
oldest overdue job (beyond ``max_overdue`` seconds is unhealthy: nothing is
advancing jobs); for an RQ scheduler, workers registered and alive and the
size of RQ's failed-job registry (reported, never fatal: phaserunner records
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
    from pipelines.app import App

__all__ = ["Check", "check"]


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
    checks = [Check("storage", True, f"{type(app.storage).__name__} reachable"), _backlog(app, max_overdue)]
    return checks + _rq_checks(app)


def _backlog(app: App, max_overdue: float) -> Check:
    now = app.scheduler.now()
    due = app.storage.due_jobs(now, limit=100_000)
    if not due:
        return Check("backlog", True, "no job is due")
    oldest = app.storage.get_job(due[0])
    late = now - oldest.checkpoint.due_at if oldest is not None and oldest.checkpoint is not None else 0.0
    detail = f"{len(due)} due; oldest {due[0]} overdue by {late:.1f} s (limit {max_overdue:g} s)"
    return Check("backlog", late <= max_overdue, detail)


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
