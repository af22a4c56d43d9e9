"""Operating on runs: steering one (cancel, pause, resume, retry, approvals), advancing them, deleting them.

The App's control methods are a thin face over :class:`Controls`: each ends
in one call to :mod:`pipelines.engine.control`, :mod:`phases.approvals`,
:mod:`pipelines.engine.runner` or :mod:`pipelines.engine.writer`. Retention's
sweeps (``advance_due``, ``requeue_overdue``, ``gc``) live here too.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from adapters.base import (
    CountingIndex,
    FlowCapable,
    InProcessScheduler,
    RetentionStore,
    Scheduler,
    Storage,
    VersionedSchema,
)
from phases import approvals, titles
from pipelines.app import retention
from pipelines.engine import children, control, flow, transitions, writer
from pipelines.engine.capabilities import Feature, as_feature, has
from pipelines.engine.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidPipelineError,
    JobConflictError,
    PipelineError,
    StaleVersionError,
)
from pipelines.engine.models import JobRecord, JobStatus
from pipelines.engine.runner import AdvanceResult, advance_under_lease
from pipelines.engine.start import RetryMode, check_retry_mode, start_job
from pipelines.handle import JobView

if TYPE_CHECKING:
    from pipelines.app.face import App

__all__ = ["Controls", "check_retention", "check_seconds", "flow_control"]

logger = logging.getLogger("pipelines")


class Controls:
    """Operating on ``app``'s runs (see the module doc)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.storage = app.storage
        self.scheduler = app.scheduler
        self.env = app.env
        self.registry = app.registry
        self._walk = retention.FinishedWalk()  # retention's place in the finished index

    # --- steering ------------------------------------------------------------------------------
    def cancel(self, job_id: str, *, wait: float = 30.0, force: bool = False) -> JobView:
        """Cancel at the turn boundary, keeping the checkpoint (see :func:`pipelines.engine.control.cancel_job`)."""
        if not isinstance(force, bool):
            raise InvalidInputError(f"force must be True or False, got {force!r}")
        return self.app.read.view(control.cancel_job(job_id, storage=self.storage, scheduler=self.scheduler,
                                                     wait=check_seconds(wait, "wait"), force=force))

    def pause(self, job_id: str, *, wait: float = 30.0) -> JobView:
        """Pause at the turn boundary (see :func:`pipelines.engine.control.pause_job`)."""
        return self.app.read.view(control.pause_job(job_id, storage=self.storage, scheduler=self.scheduler,
                                                    wait=check_seconds(wait, "wait")))

    def resume(self, job_id: str) -> JobView:
        """Resume a paused job from its checkpoint."""
        return self.app.read.view(control.resume_job(job_id, storage=self.storage, scheduler=self.scheduler))

    def retry(self, job_id: str, *, mode: RetryMode = "resume") -> JobView:
        """Run a failed or cancelled job again: ``"resume"`` from its checkpoint, ``"full"`` from the start of its
        run (the phase and state it started with; a complete job too)."""
        record = control.load_job(self.storage, job_id)
        retry_mode = check_retry_mode(mode, optional=False, name="mode")
        pipeline = self.registry.pipeline(record.pipeline)
        first = record.initial_phase if retry_mode == "full" else None
        if first is not None and first not in pipeline.by_name:
            # A deploy renamed the phase the run began at: which phase takes its state is the caller's call.
            raise InvalidPipelineError(
                f"job {job_id!r}'s run began at phase {first!r}, which pipeline {record.pipeline!r} no longer has "
                f"(phases are {', '.join(pipeline.by_name)}); retry it with mode='resume', or start it again at a "
                "phase you name: app.run_pipeline(..., retry_mode='full', initial_phase=...)")
        start_job(job_id=job_id, pipeline=pipeline, name=record.pipeline, storage=self.storage,
                  scheduler=self.scheduler, retry_mode=retry_mode, initial_phase=first)
        return self.app.read.view(control.load_job(self.storage, job_id))

    def approve(self, job_id: str, call_id: str, *, digest: str | None = None) -> JobView:
        """Approve a waiting tool call with the arguments it was shown with."""
        return self.app.read.view(approvals.approve(job_id, call_id, digest=digest, storage=self.storage,
                                                    scheduler=self.scheduler))

    def reject(self, job_id: str, call_id: str, *, reason: str, digest: str | None = None) -> JobView:
        """Reject a waiting tool call; the model reads ``reason`` as its result."""
        return self.app.read.view(approvals.reject(job_id, call_id, reason=reason, digest=digest,
                                                   storage=self.storage, scheduler=self.scheduler))

    def record_tool_result(self, job_id: str, call_id: str, result: Any) -> JobView:
        """Record what an interrupted call did, as a person found it (see :mod:`phases.approvals`)."""
        return self.app.read.view(approvals.record_tool_result(job_id, call_id, result, storage=self.storage,
                                                      scheduler=self.scheduler))

    def supply_input(self, job_id: str, key: str, value: Any) -> JobView:
        """Give a job waiting in ``wait_for_input`` its input (see :func:`pipelines.engine.control.supply_input`)."""
        return self.app.read.view(control.supply_input(job_id, key, value, storage=self.storage,
                                                       scheduler=self.scheduler))

    # --- advancing ---------------------------------------------------------------------------
    def advance(self, job_id: str) -> AdvanceResult:
        """Advance ``job_id`` with the pipeline its record names (what a worker or cron does); idempotent."""
        # The App's environment goes with the job: tools and phases that start child jobs start them on
        # this App, on whatever thread they run (see pipelines.engine.env).
        return advance_under_lease(job_id, lambda record: self.registry.pipeline(record.pipeline), storage=self.storage,
                           scheduler=self.scheduler, lease_seconds=self.app.lease_seconds,
                           continue_for=self.app.continue_for, env=self.env,
                           max_interrupted_turns=self.app.max_interrupted_turns)

    try_advance = advance

    def advance_due(self, *, grace: float = 0.0, limit: int = 1000) -> list[tuple[str, AdvanceResult]]:
        """Advance every running job due for at least ``grace`` seconds and not leased: the sweep (I7).

        Documented on :meth:`pipelines.app.App.advance_due`.
        """
        done: list[tuple[str, AdvanceResult]] = []
        foreign: Counter[str] = Counter()  # another app's jobs on the storage: left to it (control.note_foreign)
        for job_id in self.storage.due_jobs(self.scheduler.now() - grace, limit=limit):
            try:
                rec = self.storage.get_job(job_id)
                if rec is not None and rec.pipeline not in self.registry.pipelines:
                    # Not run here (no lease taken, one log line, not a traceback a job), yet reported: overdue
                    # past the grace, its own app's workers are down, or no app registers its pipeline any more.
                    foreign[rec.pipeline] += 1
                    done.append((job_id, AdvanceResult.UNREACHED))
                    continue
                done.append((job_id, self.advance(job_id)))
            except Exception as exc:  # one job that cannot be advanced never stops the sweep
                done.append((job_id, AdvanceResult.UNREACHED))
                logger.error("sweep: job %s: %s", job_id, exc, exc_info=not isinstance(exc, PipelineError))
        for parent in children.ready_parents(self.storage, limit=limit):
            # A parent whose children finished but whose wake-up was lost (pipelines.engine.children).
            if parent.pipeline not in self.registry.pipelines:
                foreign[parent.pipeline] += 1
                done.append((parent.job_id, AdvanceResult.UNREACHED))
                continue
            try:
                done.append((parent.job_id, self.advance(parent.job_id)))
            except Exception as exc:  # as above
                done.append((parent.job_id, AdvanceResult.UNREACHED))
                logger.error("sweep: parent %s: %s", parent.job_id, exc, exc_info=not isinstance(exc, PipelineError))
        control.note_foreign(foreign)
        self._sweep_retention()
        return done

    def requeue_overdue(self, *, grace: float, limit: int = 1000) -> list[str]:
        """Enqueue (not run) every job overdue by ``grace`` seconds: the worker's sweep (and retention's)."""
        requeued = control.requeue_overdue(self.storage, self.scheduler, grace=grace, limit=limit,
                                           runs=self.registry.pipelines.__contains__)
        self._sweep_retention()
        return requeued

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run every scheduled advance now (an in-process scheduler only); returns how many ran."""
        in_process = as_feature(self.scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is None:
            raise ConfigurationError(f"drain() needs an in-process scheduler such as MemoryScheduler; this app's "
                                     f"is {type(self.scheduler).__name__}: its workers advance the jobs")
        return in_process.drain(max_advances=max_advances)

    def run_in_process(self) -> bool:
        """Drain an in-process scheduler (nothing else would run its jobs); a no-op for queue schedulers.

        Whether nothing runs a job between two such calls: an in-process scheduler with no threads of its own
        (the memory one; not the local scheduler's workers, which run jobs meanwhile).
        """
        in_process = as_feature(self.scheduler, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
        if in_process is not None:
            in_process.drain()
        return in_process is not None and not has(self.scheduler, Feature.HOSTED)


    # --- deleting -------------------------------------------------------------------------------
    def delete(self, job_id: str) -> None:
        """Delete ``job_id``, its child runs and everything they stored (transcript, logs, events, index entries).

        Documented on :meth:`pipelines.app.App.delete`.
        """
        for _ in range(3):
            rec = control.load_job(self.storage, job_id)
            if rec.status in (JobStatus.RUNNING, JobStatus.WAITING):
                raise JobConflictError(f"job {job_id!r} is {rec.status.value}; cancel it before deleting it")
            children.check_not_awaited(rec, self.storage, act="delete it")
            # Its child runs first, then its title job, the job last: a process that dies midway leaves the job,
            # and deleting it again finishes the rest.
            if self._delete_below(rec) and self._delete_with_title(rec) is not None:
                self.env.callbacks.forget(job_id)
                return
        raise JobConflictError(f"job {job_id!r} kept changing while it was being deleted; try again")

    def _delete_below(self, rec: JobRecord) -> bool:
        """Delete the child runs below ``rec`` (:func:`~pipelines.engine.children.descendants`), each before its
        parent; ``False`` when one moved on meanwhile. One running or waiting: refused, nothing deleted."""
        below = children.descendants(rec, self.storage)
        busy = next((r for r in below if r.status in (JobStatus.RUNNING, JobStatus.WAITING)), None)
        if busy is not None:
            raise JobConflictError(f"job {rec.job_id!r} has a child run {busy.job_id!r} that is "
                                   f"{busy.status.value}; cancel it before deleting {rec.job_id!r}")
        for child in reversed(below):
            if self._delete_with_title(child) is None:
                return False
            self.env.callbacks.forget(child.job_id)
        return True

    def _delete_with_title(self, rec: JobRecord) -> bool | None:
        """Delete ``rec``'s title job, then ``rec``'s job if it is still at ``rec.version`` (:meth:`_delete_at`)."""
        self._delete_title_of(rec.job_id)
        return self._delete_at(rec)

    def gc(self, older_than: float | None = None, *, scan: bool = False, limit: int = 1000,
           all_pipelines: bool = False, rescan_after: float = 0.0) -> list[str]:
        """Delete finished jobs (complete, error, cancelled) that finished over ``older_than`` seconds ago.

        Documented on :meth:`pipelines.app.App.gc`; ``rescan_after``: see :mod:`pipelines.app.retention`.
        """
        age = self.app.retention if older_than is None else check_retention(older_than, "older_than")
        if age is None:
            raise ConfigurationError("gc needs older_than= (seconds; `pipelines gc --older-than SECONDS`) or an "
                                     "App(retention=...)")
        before = self.scheduler.now() - age
        ids = self._finished_before(before, scan=scan, limit=limit, rescan_after=rescan_after)
        # Another App may share the storage (one Redis, one SQLite file) with a retention of its own, or none:
        # its jobs are its own to delete. Read now, not at App(): agents can be registered later.
        mine = None if all_pipelines else frozenset(self.registry.pipelines)
        removed = []
        for job_id in ids:
            try:
                rec = self.storage.get_job(job_id)
                # Judged again on the record: the index entry may be older than a restart.
                expired = rec is not None and rec.status in transitions.FINISHED and rec.updated_at <= before
                if expired and rec is not None and mine is not None and not self._of_pipelines(rec, mine):
                    continue
                if expired and rec is not None and children.waiting_parent(rec, self.storage) is not None:
                    continue  # its parent has not read its outcome yet: a later sweep deletes it
                if expired and rec is not None and self._delete_at(rec):
                    self.env.callbacks.forget(job_id)
                    self._delete_title_of(job_id)
                    removed.append(job_id)
            except PipelineError as exc:  # one job that cannot be deleted now never stops the others'
                logger.error("retention: job %s not deleted: %s", job_id, exc)
        return removed

    def _of_pipelines(self, rec: JobRecord, mine: frozenset[str]) -> bool:
        """Whether ``rec``'s family is this app's: judged by the pipeline of the job at its top.

        A child run or a title job is its conversation's, whatever its own pipeline: another app may run a child
        agent of the same name. A job whose parent is gone is judged by its own pipeline.
        """
        for _ in range(children.MAX_DEPTH + 1):
            parent = None if rec.parent_job is None else self.storage.get_job(rec.parent_job)
            if parent is None:
                break
            rec = parent
        return rec.pipeline in mine

    def _finished_before(self, before: float, *, scan: bool, limit: int, rescan_after: float) -> list[str]:
        indexed = as_feature(self.storage, Feature.RETENTION, RetentionStore)  # type: ignore[type-abstract]
        # Walked on from where the last call stopped: the oldest entries may be jobs it keeps (pipelines.app.retention).
        ids = [] if indexed is None else self._walk.take(indexed, before, limit, now=self.scheduler.now(),
                                                         rescan_after=rescan_after)
        if scan or indexed is None:
            found = [r.job_id for r in self.storage.list_jobs(limit=1_000_000)
                     if r.status in transitions.FINISHED and r.updated_at <= before]
            ids = list(dict.fromkeys([*ids, *found]))
        return ids[: max(0, limit)]

    def _delete_title_of(self, job_id: str) -> None:
        """A deleted conversation's title job goes with it, whatever its state: a job made again under its id would
        take its title (and the first message it was asked about). Best effort: logged, never raised."""
        try:
            title = self.storage.get_job(titles.title_job_id(job_id))
            if title is None or not children.owned(title, job_id):
                return
            if title.status not in transitions.FINISHED:  # queued or running: stopped first (a turn in flight fenced)
                title = control.cancel_job(title.job_id, storage=self.storage, scheduler=self.scheduler, wait=0,
                                           force=True)
            self._delete_at(title)
        except PipelineError as exc:
            logger.warning("job %s: its title job was not deleted: %s", job_id, exc)

    def _delete_at(self, rec: JobRecord) -> bool | None:
        """Delete ``rec``'s job if it is still at ``rec.version``; ``None`` when it moved on meanwhile."""
        try:
            return writer.delete(self.storage, rec)
        except StaleVersionError:
            return None

    def _sweep_retention(self) -> None:
        """The sweeps' share of retention: delete what has expired (logged, never raised)."""
        if self.app.retention is None:
            return
        try:
            removed = self.gc(limit=retention.SWEEP_LIMIT, rescan_after=retention.RESCAN_EVERY)
        except PipelineError as exc:
            logger.error("retention sweep failed: %s", exc)
            return
        if removed:
            logger.info("retention: deleted %d finished job(s)", len(removed))


    # --- operating on the storage ---------------------------------------------------------------
    def migrate_storage(self) -> tuple[int, int]:
        """Upgrade the storage's schema to this version (``pipelines migrate``): ``(before, after)``."""
        schema = as_feature(self.storage, Feature.SCHEMA, VersionedSchema)  # type: ignore[type-abstract]
        if schema is None:
            raise ConfigurationError(f"{type(self.storage).__name__} keeps no schema version: nothing to migrate "
                                     "(pipelines migrate upgrades an SQLite file)")
        return schema.migrate()

    def reindex(self) -> int:
        """Put jobs stored before the listing indexes existed into them (safe while workers run); how many."""
        counter = as_feature(self.storage, Feature.COUNTS, CountingIndex)  # type: ignore[type-abstract]
        if counter is None:
            raise ConfigurationError(f"{type(self.storage).__name__} has no listing index to rebuild")
        return counter.reindex()



def check_retention(value: object, name: str = "retention") -> float | None:
    """``value`` as seconds (:func:`check_seconds`); ``None`` too for ``retention`` (keep jobs for ever)."""
    if value is None and name == "retention":
        return None
    return check_seconds(value, name)


def check_seconds(value: object, name: str) -> float:
    """``value`` as a finite number of seconds >= 0, else :class:`InvalidInputError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise InvalidInputError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def flow_control(storage: Storage, scheduler: Scheduler, rate_limits: Sequence[flow.RateLimit],
                 concurrency: Mapping[str, int] | None, store: Any, lease_seconds: float) -> flow.FlowControl:
    """The App's flow control; its state in ``store``, else the storage's own (``storage.flow_store()``)."""
    if isinstance(rate_limits, flow.RateLimit) or not isinstance(rate_limits, Sequence):
        raise InvalidInputError(f"rate_limits must be a list of RateLimit, got {type(rate_limits).__name__}")
    default = store is None and bool(rate_limits or concurrency)
    if default:
        capable = as_feature(storage, Feature.FLOW, FlowCapable)  # type: ignore[type-abstract]
        store = capable.flow_store() if capable is not None else None
    # A slot outlives a lease by a little, so a worker that holds its lease keeps its slot too.
    control = flow.FlowControl(store, rate_limits=rate_limits, concurrency=concurrency,
                               slot_seconds=lease_seconds * 1.5, clock=scheduler.now)
    control.storage_default = default
    return control
