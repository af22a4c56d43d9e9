"""The phase runner: ``advance_phase`` runs one phase of a job (``pipelines.engine.start`` writes jobs).

One advance, step by step (DESIGN "The turn"):

1. take the job's lease and load the record in one call; unknown, leased,
   not running or not yet due → no-op (duplicates are normal, I6); a pause
   or cancel requested while the last turn ran is applied here instead;
2. run the phase; ``ctx.step`` journals results as it goes (I5);
3. commit atomically, fenced on the version read (I1, I2); the commit also
   releases the lease, so the next advance can start at once;
4. schedule the next advance (the fast path; storage's due index is the
   truth, I7).

The commits themselves are built in :mod:`pipelines.engine.transitions`. Every
failure ends as data (I9): status ``error``, a readable message, the last
good checkpoint kept for ``retry_mode="resume"``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from adapters.base import Backlog, BacklogProbe, Scheduler, Storage
from pipelines.engine import children, flow, telemetry, transitions, versions, writer
from pipelines.engine._aio import resolve
from pipelines.engine.capabilities import Feature, as_feature
from pipelines.engine.contain import contained, describe
from pipelines.engine.env import EMPTY_ENV, RunEnv
from pipelines.engine.errors import (
    CorruptRecordError,
    InboxNotEmptyError,
    InvalidInputError,
    PipelineError,
    StaleVersionError,
    StorageUnavailableError,
)
from pipelines.engine.leases import LEASE_KEEPER, check_lease_seconds
from pipelines.engine.models import Commit, CommitReply, JobRecord, JobStatus, to_json_value, validate_job_id
from pipelines.engine.phase import Done, Fail, FailJob, Next, Phase, PhaseContext, Pipeline, RetryLater, WaitForInput
from pipelines.engine.phase import validate_state as _validate_state
from pipelines.engine.tokens import new_token

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "AdvanceResult",
    "advance_job",
    "advance_phase",
    "try_advance",
]

logger = logging.getLogger("pipelines")

STORAGE_RETRY_SECONDS = 5.0
"""How soon a phase that lost its storage connection mid-way is tried again."""

DEFAULT_LEASE_SECONDS = 10.0
"""Lease time to live. The lease keeper renews it every third of that while a phase runs, so a killed
worker's lease runs out 6.7-10 s after its death and the worker's sweep re-sends the turn (issue 34)."""


class AdvanceResult(StrEnum):
    """What one ``try_advance`` call did (``advance_phase`` itself returns ``None``)."""

    UNKNOWN = "unknown"
    BUSY = "busy"  # another caller holds the lease
    NOT_RUNNING = "not_running"
    NOT_DUE = "not_due"
    ADVANCED = "advanced"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY_LATER = "retry_later"
    WAITING = "waiting"
    STALE = "stale"  # fenced off: another worker moved the job on
    PAUSED = "paused"  # a pause requested during the last turn was applied
    CANCELLED = "cancelled"  # a cancel requested during the last turn was applied
    DEFERRED = "deferred"  # flow control (a rate limit, a concurrency key) moved the turn later; nothing committed


_RESULTS: dict[type, AdvanceResult] = {
    Next: AdvanceResult.ADVANCED, Done: AdvanceResult.COMPLETED, Fail: AdvanceResult.FAILED,
    RetryLater: AdvanceResult.RETRY_LATER, WaitForInput: AdvanceResult.WAITING,
}

PipelineFor = Callable[[JobRecord], Pipeline]
"""Finds the pipeline of a job from its record (the App looks it up by name)."""


def advance_phase(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    state_model: type[BaseModel] | None = None,
) -> None:
    """Run the job's next phase once, if it is running, due and not leased (else a no-op).

    Safe to call any number of times, from any number of processes (I6). A
    phase's exception never escapes: it is recorded on the job as status
    ``error`` (I9). ``state_model`` (or a :class:`Pipeline` with ``state=``)
    makes the phases see the state as that pydantic model.
    """
    try_advance(job_id=job_id, phases=phases, storage=storage, scheduler=scheduler, lease_seconds=lease_seconds,
                state_model=state_model)


def as_pipeline(phases: Sequence[Phase] | Pipeline, state_model: type[BaseModel] | None = None) -> Pipeline:
    """``phases`` as a :class:`Pipeline` (validated); ``state_model`` declares its state."""
    if isinstance(phases, Pipeline):
        if state_model is not None and phases.state not in (None, state_model):
            raise InvalidInputError("state_model differs from the Pipeline's own state model")
        return phases if state_model is None else Pipeline(phases.phases, state=state_model)
    return Pipeline(phases, state=state_model)


def try_advance(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
    state_model: type[BaseModel] | None = None,
) -> AdvanceResult:
    """``advance_phase`` that says what it did (for the CLI, the sweep and tests).

    ``continue_for`` (seconds, default 0): after a commit whose next phase is
    due at once, keep the lease and run that phase right away instead of a
    queue round trip, until this much time has passed (the turn in progress
    always finishes). A worker then serves one job for at most about that
    long before it goes back to the queue, which keeps jobs fair.
    """
    pipeline = as_pipeline(phases, state_model)
    return advance_job(job_id, lambda record: pipeline, storage=storage, scheduler=scheduler,
                       lease_seconds=lease_seconds, continue_for=continue_for)


def _check_continue_for(continue_for: object) -> None:
    if isinstance(continue_for, bool) or not isinstance(continue_for, int | float) or not 0 <= continue_for < math.inf:
        raise InvalidInputError(f"continue_for must be a finite number of seconds >= 0, got {continue_for!r}")


def advance_job(
    job_id: str,
    pipeline_for: PipelineFor,
    *,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
    flow_control: flow.FlowControl | None = None,
    env: RunEnv | None = None,
) -> AdvanceResult:
    """``try_advance`` with the pipeline chosen from the record (``App`` resolves it by name).

    One round trip takes the lease and loads the record; ``pipeline_for`` runs
    under the lease, so a job naming an unknown pipeline raises with the lease
    released and nothing written. ``flow_control`` (the App's) gates each turn
    on its concurrency key and is what the agent turn's rate limits read; a
    refused turn is rescheduled, not run (:attr:`AdvanceResult.DEFERRED`).
    ``env``: what the App hands each phase (:class:`~pipelines.engine.env.RunEnv`); its ``flow`` is the
    one used when ``flow_control`` is not given.
    """
    validate_job_id(job_id)
    check_lease_seconds(lease_seconds)
    _check_continue_for(continue_for)
    owner = new_token()
    try:
        record = storage.acquire_lease(job_id, owner, lease_seconds)
    except CorruptRecordError:
        # The lease may have been taken before the record failed to parse:
        # leave no lease behind a record that a person must repair first.
        storage.release_lease(job_id, owner)
        raise
    if record is None:
        return AdvanceResult.BUSY if storage.get_job(job_id) is not None else AdvanceResult.UNKNOWN
    held = LEASE_KEEPER.hold(storage, job_id, owner, lease_seconds)
    # Every advance this turn schedules goes to the queue of the run's priority.
    turn = _Turn(storage, flow.with_priority(scheduler, flow.priority_of(record)), owner,
                 time.monotonic() + continue_for if continue_for > 0 else None)
    env = env if env is not None else EMPTY_ENV
    if flow_control is not None and flow_control is not env.flow:
        env = replace(env, flow=flow_control)
    turn.env = env
    turn.flow = env.active_flow()
    turn.lease = held
    try:
        return turn.run(record, pipeline_for)
    finally:
        LEASE_KEEPER.drop(held)
        if not turn.released:
            storage.release_lease(job_id, owner)


class _Turn:
    """One lease held on one job: runs its due phases (several under ``continue_for``) and commits each."""

    #: The job's lease in LEASE_KEEPER: a concurrency slot taken under it is renewed and released with it.
    lease: int | None = None

    def __init__(self, storage: Storage, scheduler: Scheduler, owner: str, deadline: float | None) -> None:
        self.storage = storage
        self.scheduler = scheduler
        self.owner = owner
        self.deadline = deadline
        self.released = False
        self.flow: flow.FlowControl | None = None
        self.env: RunEnv = EMPTY_ENV
        # What the turn being run upgrades its job from (set by admit, read when its context is built).
        self.migrating: versions.Migrating | None = None

    def run(self, record: JobRecord, pipeline_for: PipelineFor) -> AdvanceResult:
        while True:
            woken = self.wake(record)
            if isinstance(woken, AdvanceResult):
                return woken
            record = woken
            cp = record.checkpoint
            if record.status is not JobStatus.RUNNING or cp is None:
                return AdvanceResult.NOT_RUNNING
            if record.control is not None:
                return self.apply_control(record)
            now = self.scheduler.now()
            # Queues deliver delayed messages with some imprecision (RQ: ~1 s);
            # the scheduler declares it, and we accept that much earliness
            # rather than drop a message that nothing would send again.
            if cp.due_at > now + self.scheduler.precision:
                return AdvanceResult.NOT_DUE
            keep = self.keep_lease()
            try:
                pipeline = pipeline_for(record)
                admitted = self.admit(record, pipeline)
                if isinstance(admitted, AdvanceResult):
                    return admitted
                result, commit, reply = self.run_gated(admitted, pipeline, keep)
            finally:
                keep()  # answered already, or the question lets its connection go
            if commit is None:
                return result
            self.released = commit.release_lease
            if self.released:
                return result
            # Exactly what storage now holds: go on without reloading.
            record = commit.record.model_copy(update={"control": reply.control, "inbox": reply.inbox})

    def wake(self, record: JobRecord) -> JobRecord | AdvanceResult:
        """A job waiting for child jobs runs again once all finished (see :mod:`pipelines.engine.children`).

        Any other record is returned as it is.
        """
        if not children.waits_for_children(record):
            return record
        commit = children.wake(record, self.storage, owner=self.owner, now=self.scheduler.now())
        if commit is None:
            return AdvanceResult.WAITING
        try:
            reply = writer.apply(self.storage, self.scheduler, commit)
        except StaleVersionError:
            return AdvanceResult.STALE
        if commit.record.status is not JobStatus.RUNNING:
            self.released = True
            return AdvanceResult.FAILED
        # The lease is kept: the woken turn runs now, on exactly what storage holds.
        return commit.record.model_copy(update={"control": reply.control, "inbox": reply.inbox})

    def admit(self, record: JobRecord, pipeline: Pipeline) -> JobRecord | AdvanceResult:
        """``record`` as this worker's version runs it (migrated), or why it does not run (:mod:`versions`)."""
        admitted = versions.admit(record, pipeline.version, pipeline.migrations or {})
        self.migrating = admitted.migrating
        if admitted.delay > 0:  # written by a newer version: left untouched for a newer worker
            return self.defer(record, admitted.delay, f"written by version {record.code_version}")
        if admitted.error is None:
            return admitted.record
        commit = transitions.after_phase(record, Fail(admitted.error), transitions.PhaseOutput(), owner=self.owner,
                                         now=self.scheduler.now())
        try:
            writer.apply(self.storage, self.scheduler, commit)
        except StaleVersionError:
            return AdvanceResult.STALE
        self.released = True
        return AdvanceResult.FAILED

    def keep_lease(self) -> Callable[[], bool]:
        """Whether the phase about to run keeps the job's lease after its commit (``continue_for``).

        It keeps it while the deadline is ahead and no other work of this
        job's priority (or higher) waits: anything waiting in the queue was
        sent before this job's next turn would be, so it is older work; a new
        conversation never waits behind a busy one. The queue is asked now and
        its answer read at the commit (a :class:`~adapters.base.BacklogProbe`
        sends the question and goes on), so the round trip overlaps the phase.
        """
        if self.deadline is None or time.monotonic() >= self.deadline:
            return _NEVER
        backlog = as_feature(self.scheduler, Feature.BACKLOG, Backlog)  # type: ignore[type-abstract]
        if backlog is None:
            return _ALWAYS
        try:
            probe = as_feature(self.scheduler, Feature.BACKLOG_PROBE, BacklogProbe)  # type: ignore[type-abstract]
            if probe is not None:
                return _Keep(probe.probe_work_waiting())
            return _NEVER if backlog.work_waiting() else _ALWAYS
        except PipelineError:
            return _NEVER  # cannot tell: the fair choice is to go back to the queue

    def run_gated(self, record: JobRecord, pipeline: Pipeline,
                  keep_lease: Callable[[], bool]) -> tuple[AdvanceResult, Commit | None, CommitReply]:
        """``run_phase`` inside a concurrency slot of the run's key (when the App limits it)."""
        if self.flow is None:
            return self.run_phase(record, pipeline, keep_lease)
        wait = self.flow.enter_turn(record, self.scheduler.now(), lease=self.lease)
        if wait > 0:
            return self.defer(record, wait, "concurrency limit"), None, CommitReply()
        try:
            return self.run_phase(record, pipeline, keep_lease)
        finally:
            self.flow.leave_turn(record, lease=self.lease)

    def defer(self, record: JobRecord, delay: float, why: str) -> AdvanceResult:
        """Run the same turn again after ``delay``, committing nothing (flow control: no attempt spent).

        The due index still holds the job, so if this message is lost the
        sweep finds it (I7). A fresh queue message (no version in its id):
        the one running now carries this turn's version.
        """
        logger.info("job %s: deferred %.2fs (%s)", record.job_id, delay, why)
        self.scheduler.schedule_advance(record.job_id, delay, pipeline=record.pipeline)
        return AdvanceResult.DEFERRED

    def apply_control(self, record: JobRecord) -> AdvanceResult:
        """Apply the pause or cancel that was requested while the last turn ran."""
        now = self.scheduler.now()
        if record.control == "cancel":
            commit, result = transitions.cancel(record, owner=self.owner, now=now), AdvanceResult.CANCELLED
        else:
            commit, result = transitions.pause(record, owner=self.owner, now=now), AdvanceResult.PAUSED
        try:
            writer.apply(self.storage, self.scheduler, commit)
        except StaleVersionError:
            return AdvanceResult.STALE
        self.released = True
        return result

    def run_phase(self, record: JobRecord, pipeline: Pipeline,
                  keep_lease: Callable[[], bool]) -> tuple[AdvanceResult, Commit | None, CommitReply]:
        """Run the phase and commit, in a span of the job's trace (when OpenTelemetry is on)."""
        cp = record.checkpoint
        assert cp is not None
        started = time.monotonic()
        with telemetry.turn_span(record.job_id, record.pipeline, cp.next_phase, trace=record.trace, due_at=cp.due_at,
                                 now=self.scheduler.now(), attempt=cp.attempt) as current:
            outcome = self.run_phase_in_span(record, pipeline, keep_lease)
            telemetry.record_turn(current, pipeline=record.pipeline, result=outcome[0].value,
                                  seconds=time.monotonic() - started)
        return outcome

    def run_phase_in_span(self, record: JobRecord, pipeline: Pipeline,
                          keep_lease: Callable[[], bool]) -> tuple[AdvanceResult, Commit | None, CommitReply]:
        """Run the phase and commit; ``(result, None, None)`` when fenced off."""
        job_id = record.job_id
        saver = _Saver(record, self.storage, self.scheduler, self.owner)
        ctx = _context(record, self.storage, self.scheduler, self.owner, saver, self.migrating, self.env)
        try:
            outcome = _outcome(ctx, pipeline, record)
        except StaleVersionError:
            logger.info("job %s: fenced off (another worker moved it on)", job_id)
            return AdvanceResult.STALE, None, CommitReply()
        if isinstance(outcome, flow.FlowDeferred):
            return self.defer(saver.record, outcome.delay, outcome.reason), None, CommitReply()
        rec = saver.record
        outcome = _normalised(outcome, rec, pipeline)
        try:
            commit, reply = self.commit(rec, ctx, outcome, keep_lease)
        except StaleVersionError:
            logger.info("job %s: commit fenced off (another worker moved it on)", job_id)
            return AdvanceResult.STALE, None, CommitReply()
        # A commit that could not be stored as built was replaced by a failure.
        result = AdvanceResult.FAILED if commit.record.status is JobStatus.ERROR else _RESULTS[type(outcome)]
        if result is AdvanceResult.ADVANCED and commit.record.checkpoint is not None:
            ctx.run_on_commit(commit.record.checkpoint)
        return result, commit, reply

    def commit(self, rec: JobRecord, ctx: PhaseContext[Any], outcome: transitions.Outcome,
               keep_lease: Callable[[], bool]) -> tuple[Commit, CommitReply]:
        out = ctx.take_output()
        now = self.scheduler.now()
        commit = transitions.after_phase(rec, outcome, out, owner=self.owner, now=now, keep_lease=keep_lease())
        try:
            return self.apply_outcome(rec, commit, outcome, out, now)
        except InvalidInputError as exc:
            # What the phase produced cannot be stored (too large, not JSON):
            # the job ends in error saying so, rather than staying due forever
            # while every sweep runs the phase into the same wall (I9).
            failed = Fail(f"the outcome of phase {ctx.phase!r} could not be committed: {exc}")
            kept = transitions.PhaseOutput(usage=out.usage, usage_keys=out.usage_keys)
            commit = transitions.after_phase(rec, failed, kept, owner=self.owner, now=now)
            return commit, writer.apply(self.storage, self.scheduler, commit)

    def apply_outcome(self, rec: JobRecord, commit: Commit, outcome: transitions.Outcome,
                      out: transitions.PhaseOutput, now: float) -> tuple[Commit, CommitReply]:
        """Apply the phase's commit; a run's end that storage refused for messages sent meanwhile goes on with them.

        Storage checks the inbox in the commit itself (``Commit.ends_run``), so
        a message sent at any moment of the last turn is either refused there
        (the sender continues the conversation) or seen here. The run's end and
        the next run that starts with those messages are then one commit: no
        crash can leave a complete job with messages nobody will read.
        """
        try:
            return commit, writer.apply(self.storage, self.scheduler, commit)
        except InboxNotEmptyError as exc:
            if not isinstance(outcome, Done):
                raise
            # Nothing was written: this turn's version and lease still hold.
            sent = self.storage.inbox(rec.job_id, exc.waiting)[out.take_inbox:]
            logger.info("job %s: %d message(s) sent during its last turn start its next run", rec.job_id, len(sent))
            commit = transitions.done_and_continued(rec, outcome, out, sent, owner=self.owner, now=now)
            return commit, writer.apply(self.storage, self.scheduler, commit)


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


class _Saver:
    """``ctx.save_state``: commits the state mid-phase and tracks the record the phase now runs on."""

    def __init__(self, record: JobRecord, storage: Storage, scheduler: Scheduler, owner: str) -> None:
        self.record = record
        self.storage = storage
        self.scheduler = scheduler
        self.owner = owner

    def __call__(self, state: Any) -> int:
        assert self.record.checkpoint is not None
        value = to_json_value(state, what=f"state saved by phase {self.record.checkpoint.next_phase!r}")
        commit = transitions.save_state(self.record, value, owner=self.owner, now=self.scheduler.now())
        writer.save_state(self.storage, commit)
        # Keep the open journal: the phase goes on with its steps.
        assert commit.record.checkpoint is not None
        journal = self.record.checkpoint.journal
        self.record = commit.record.model_copy(
            update={"checkpoint": commit.record.checkpoint.model_copy(update={"journal": journal})})
        return self.record.version


def _context(record: JobRecord, storage: Storage, scheduler: Scheduler, owner: str,
             saver: _Saver, migrating: versions.Migrating | None = None,
             env: RunEnv | None = None) -> PhaseContext[Any]:
    cp = record.checkpoint
    assert cp is not None
    return PhaseContext(job_id=record.job_id, checkpoint=cp, storage=storage, owner=owner, clock=scheduler.now,
                        saver=saver, attempt=cp.attempt, usage=record.total_usage, version=record.version,
                        transcript_len=record.transcript_len, options=record.options, inbox=record.inbox,
                        migrating=migrating, env=env)


def _outcome(ctx: PhaseContext[Any], pipeline: Pipeline, record: JobRecord) -> transitions.Outcome:
    """Run the phase; whatever it raises becomes an outcome, except being fenced off."""
    cp = ctx.checkpoint
    phase = pipeline.by_name.get(cp.next_phase)
    if phase is None:
        return Fail(f"unknown phase {cp.next_phase!r}; phases are {', '.join(pipeline.by_name)}")
    try:
        state = _validate_state(phase, cp.state, pipeline.state_model_of(phase))
        if state is not cp.state:  # no state model: the checkpoint already holds what the phase sees
            ctx.checkpoint = cp.model_copy(update={"state": state})
        outcome = resolve(phase.run(ctx))
    except StaleVersionError:
        raise
    except (RetryLater, WaitForInput) as sig:
        return sig
    except StorageUnavailableError as exc:
        # Storage went away mid-phase (a journal write failed): that is no
        # reason to fail the job. Run the phase again shortly, reusing what
        # was journaled; if storage is still down, this commit fails too and
        # the lease runs out, so the sweep picks the job up later (I7).
        return RetryLater(STORAGE_RETRY_SECONDS, f"storage unavailable: {exc}")
    except FailJob as sig:
        return Fail(sig.error)
    except BaseException as exc:
        # sys.exit() in user code too: the job's error, not the end of a worker serving other jobs.
        if not contained(exc):
            raise
        logger.info("job %s: phase %s raised", record.job_id, cp.next_phase, exc_info=True)
        return Fail(describe(exc))
    if not isinstance(outcome, Next | Done | Fail | RetryLater | WaitForInput):
        return Fail(f"phase {phase.name!r} returned {type(outcome).__name__}; "
                    "expected Next, Done, Fail, RetryLater or WaitForInput")
    return outcome


def _normalised(outcome: transitions.Outcome, rec: JobRecord, pipeline: Pipeline) -> transitions.Outcome:
    """Check a Next's phase name and turn state / result into their stored JSON form."""
    cp = rec.checkpoint
    assert cp is not None
    try:
        if isinstance(outcome, Next):
            if outcome.next_phase not in pipeline.by_name:
                return Fail(f"phase {cp.next_phase!r} asked for unknown next phase {outcome.next_phase!r}; "
                            f"phases are {', '.join(pipeline.by_name)}")
            state = cp.state if outcome.state is None else outcome.state
            value = to_json_value(state, what=f"state returned by phase {cp.next_phase!r}")
            return Next(outcome.next_phase, state=value, delay=outcome.delay)
        if isinstance(outcome, Done):
            value = to_json_value(outcome.result, what=f"result returned by phase {cp.next_phase!r}")
            return Done(result=value, reason=outcome.reason)
    except PipelineError as exc:
        return Fail(str(exc))
    return outcome
