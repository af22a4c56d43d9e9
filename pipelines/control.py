"""Operator controls: cancel a job, retry it, sweep what is overdue.

These are what ``pipelines cancel`` / ``retry`` / ``worker`` call; a web
service can call them too. They go through the same storage commit as the
runner, so they are fenced exactly like a worker's turn (I2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipelines.errors import JobConflictError, JobNotFoundError, StaleVersionError
from pipelines.events import make_event, publish
from pipelines.models import Commit, JobRecord, JobStatus, LogEntry, validate_job_id
from pipelines.runner import AdvanceResult
from pipelines.tokens import new_token

if TYPE_CHECKING:
    from adapters.base import Scheduler, Storage
    from pipelines.app import App

__all__ = ["cancel_job", "pause_job", "requeue_overdue", "resume_job", "retry_job", "sweep_overdue"]

logger = logging.getLogger("pipelines")

_FINAL = (JobStatus.COMPLETE, JobStatus.CANCELLED)


def cancel_job(job_id: str, *, storage: Storage, scheduler: Scheduler, wait: float = 30.0,
               force: bool = False) -> JobRecord:
    """Set the job's status to ``cancelled``, keeping its checkpoint; returns the new record.

    Takes effect at the next turn boundary: a turn in flight finishes and
    commits first (this call waits up to ``wait`` seconds for it, holding the
    lease once it is free so no new turn starts), and nothing is lost.
    ``force=True`` does not wait: the turn in flight is fenced off (its
    journal writes and commit expect the old version, so they are rejected
    and its work is discarded, I2). A cancelled job is never advanced again
    except by an explicit retry, which resumes from the kept checkpoint.

    Raises :class:`JobNotFoundError` for an unknown job and
    :class:`JobConflictError` for one already complete or cancelled, or when a
    turn is still in flight after ``wait`` seconds.
    """

    def change(record: JobRecord) -> tuple[dict[str, Any], str, str]:
        if record.status in _FINAL:
            raise JobConflictError(f"job {job_id!r} is already {record.status.value}; nothing to cancel")
        return {"status": JobStatus.CANCELLED, "waiting": None}, "job cancelled", "job_cancelled"

    return _at_turn_boundary(job_id, storage, scheduler, change, wait=wait, force=force, what="cancel")


def pause_job(job_id: str, *, storage: Storage, scheduler: Scheduler, wait: float = 30.0) -> JobRecord:
    """Pause a running job at its next turn boundary (a turn in flight finishes and commits first).

    A paused job is not advanced (queued messages for it are no-ops) until
    :func:`resume_job`. Raises :class:`JobConflictError` if the job is not
    running, or a turn is still in flight after ``wait`` seconds.
    """

    def change(record: JobRecord) -> tuple[dict[str, Any], str, str]:
        if record.status is not JobStatus.RUNNING:
            raise JobConflictError(f"job {job_id!r} is {record.status.value}; only a running job can be paused")
        return {"status": JobStatus.PAUSED}, "job paused", "job_paused"

    return _at_turn_boundary(job_id, storage, scheduler, change, wait=wait, force=False, what="pause")


def resume_job(job_id: str, *, storage: Storage, scheduler: Scheduler) -> JobRecord:
    """Set a paused job running again from its checkpoint, due now, and enqueue it."""

    def change(record: JobRecord) -> tuple[dict[str, Any], str, str]:
        if record.status is not JobStatus.PAUSED:
            raise JobConflictError(f"job {job_id!r} is {record.status.value}; only a paused job can be resumed")
        return {"status": JobStatus.RUNNING}, "job resumed", "job_resumed"

    new = _at_turn_boundary(job_id, storage, scheduler, change, wait=0.0, force=False, what="resume")
    scheduler.schedule_advance(job_id, 0.0, pipeline=new.pipeline, version=new.version)
    return new


def _at_turn_boundary(
    job_id: str,
    storage: Storage,
    scheduler: Scheduler,
    change: Callable[[JobRecord], tuple[dict[str, Any], str, str]],
    *,
    wait: float,
    force: bool,
    what: str,
) -> JobRecord:
    """Apply ``change`` to the record while holding the job's lease (so no turn is in flight), then release it."""
    validate_job_id(job_id)
    owner = f"control-{new_token()}"
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        record = None if force else storage.acquire_lease(job_id, owner, max(wait, 5.0))
        if record is not None:
            break
        current = storage.get_job(job_id)
        if current is None:
            raise JobNotFoundError(f"job {job_id!r} not found")
        if force:
            record = current
            break
        change(current)  # an impossible change (wrong status) fails now, not after the wait
        if time.monotonic() >= deadline:
            raise JobConflictError(f"job {job_id!r} has a turn in flight; {what} takes effect at the turn "
                                   f"boundary: try again" + (", or cancel with force=True" if what == "cancel" else ""))
        time.sleep(0.05)
    try:
        fields, message, event = change(record)
        now = scheduler.now()
        version = record.version + 1
        cp = record.checkpoint
        if cp is not None:
            cp = cp.model_copy(update={"version": version, "due_at": now, "journal": {}})
        new = record.model_copy(update={**fields, "version": version, "updated_at": now, "checkpoint": cp})
        phase = cp.next_phase if cp is not None else None
        commit = Commit(job_id=job_id, expected_version=record.version, owner=None if force else owner,
                        token=new_token(), record=new, keep_journal=True, release_lease=not force,
                        logs=[LogEntry(timestamp=now, phase=phase, level="warn" if what == "cancel" else "info",
                                       message=message)],
                        events=[make_event(event, now, phase=phase)])
        try:
            storage.commit(commit)
        except StaleVersionError as exc:
            raise JobConflictError(f"job {job_id!r} changed during the {what}; try again") from exc
        publish(job_id, commit.events)
        return new
    finally:
        if not force:
            storage.release_lease(job_id, owner)


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
    """Advance every running job due for at least ``grace`` seconds (I7); see :meth:`App.advance_due`."""
    return app.advance_due(grace=grace, limit=limit)


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
        # A scheduler that can put it at the front of its queue (RQ) does: the
        # job has already waited out a lease, it should not also wait out the backlog.
        requeue = getattr(app.scheduler, "requeue", None)
        if callable(requeue):
            requeue(job_id, pipeline=record.pipeline, version=record.version)
        else:
            app.scheduler.schedule_advance(job_id, 0.0, pipeline=record.pipeline, version=record.version)
        requeued.append(job_id)
    return requeued
