"""Operator controls: cancel a job, retry it, sweep what is overdue.

These are what ``pipelines cancel`` / ``retry`` / ``worker`` call; a web
service can call them too. They go through the same storage commit as the
runner, so they are fenced exactly like a worker's turn (I2).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from pipelines.errors import JobConflictError, JobNotFoundError, PipelineError, StaleVersionError
from pipelines.models import Commit, JobRecord, JobStatus, LogEntry, validate_job_id
from pipelines.runner import AdvanceResult

if TYPE_CHECKING:
    from adapters.base import Scheduler, Storage
    from pipelines.app import App

__all__ = ["cancel_job", "requeue_overdue", "retry_job", "sweep_overdue"]

logger = logging.getLogger("pipelines")

_FINAL = (JobStatus.COMPLETE, JobStatus.CANCELLED)


def cancel_job(job_id: str, *, storage: Storage, scheduler: Scheduler) -> JobRecord:
    """Set the job's status to ``cancelled``, keeping its checkpoint; returns the new record.

    The cancel is a control commit (no lease owner) that bumps the version. A
    turn in flight is fenced off: its journal writes and its commit expect the
    old version, so they are rejected and its work is discarded (I2); its lease
    is left to expire or be released, so it cannot overlap a retry (I3). The
    kept checkpoint lets ``retry_job`` resume where the job stopped.

    Raises :class:`JobNotFoundError` for an unknown job and
    :class:`JobConflictError` for one already complete or cancelled.
    """
    validate_job_id(job_id)
    record = storage.get_job(job_id)
    if record is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    if record.status in _FINAL:
        raise JobConflictError(f"job {job_id!r} is already {record.status.value}; nothing to cancel")
    now = scheduler.now()
    version = record.version + 1
    cp = record.checkpoint
    new = record.model_copy(update={
        "status": JobStatus.CANCELLED, "version": version, "updated_at": now,
        "checkpoint": None if cp is None else cp.model_copy(update={"version": version, "journal": {}}),
    })
    phase = cp.next_phase if cp is not None else None
    commit = Commit(job_id=job_id, expected_version=record.version, owner=None, token=uuid.uuid4().hex, record=new,
                    logs=[LogEntry(timestamp=now, phase=phase, level="warn", message="job cancelled")],
                    keep_journal=True, release_lease=False)
    try:
        storage.commit(commit)
    except StaleVersionError as exc:
        raise JobConflictError(f"job {job_id!r} changed while it was being cancelled; try again") from exc
    return new


def retry_job(job_id: str, *, app: App, full: bool = False) -> JobRecord:
    """Run a failed or cancelled job again with its own pipeline; returns the record.

    ``full=False`` resumes from the kept checkpoint (journaled steps are not
    repeated); ``full=True`` restarts from the first phase and the initial
    state, cutting the transcript back to where this run began.
    """
    validate_job_id(job_id)
    record = app.storage.get_job(job_id)
    if record is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    app.run_pipeline(record.pipeline, job_id=job_id, retry_mode="full" if full else "resume")
    after = app.storage.get_job(job_id)
    return after if after is not None else record


def sweep_overdue(app: App, *, grace: float = 0.0, limit: int = 1000) -> list[tuple[str, AdvanceResult]]:
    """Advance every running job that has been due for at least ``grace`` seconds (I7).

    ``grace=0`` is :meth:`App.advance_due`. A worker's periodic sweep uses a
    grace period so it only picks up jobs the queue failed to deliver (a lost
    message, a dead worker) instead of racing the queue for every fresh turn.
    One job failing does not stop the sweep.
    """
    done: list[tuple[str, AdvanceResult]] = []
    for job_id in app.storage.due_jobs(app.scheduler.now() - grace, limit=limit):
        try:
            done.append((job_id, app.try_advance(job_id)))
        except PipelineError as exc:
            logger.error("sweep: job %s: %s", job_id, exc)
            done.append((job_id, AdvanceResult.UNKNOWN))
    return done


def requeue_overdue(app: App, *, grace: float, limit: int = 1000) -> list[str]:
    """Enqueue again (not run) every running job due for ``grace`` seconds and not leased; returns their ids.

    This is the sweep a forking worker runs in a thread of its parent
    process: the advance itself then runs in a work-horse like any other.
    Running phases in that thread instead would be unsafe, because a fork
    taken while the thread holds a lock (an import lock during a lazy import
    inside litellm, say) leaves the horse waiting for it forever. The
    scheduler skips a job whose message for this version is still waiting,
    so a backlogged queue is not flooded with duplicates.
    """
    requeued: list[str] = []
    for job_id in app.storage.due_jobs(app.scheduler.now() - grace, limit=limit):
        if app.storage.lease_owner(job_id) is not None:
            continue  # in progress; if its worker died, the lease runs out and a later sweep gets it
        record = app.storage.get_job(job_id)
        if record is None or record.status is not JobStatus.RUNNING or record.checkpoint is None:
            continue
        app.scheduler.schedule_advance(job_id, 0.0, pipeline=record.pipeline, version=record.version)
        requeued.append(job_id)
    return requeued
