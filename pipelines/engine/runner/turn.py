"""The turns run under one lease: wake a parent, admit the version, apply a control, gate, run, commit.

``_LeasedJob`` holds one job's lease (taken by :func:`~pipelines.engine.runner.advance.advance_under_lease`)
and runs its due phases, several under ``continue_for``; each phase attempt itself is
:mod:`~pipelines.engine.runner.attempt`, each commit is built by :mod:`pipelines.engine.transitions` and written by
:mod:`pipelines.engine.writer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from adapters.base import Scheduler, Storage
from pipelines.engine import children, flow, telemetry, transitions, versions, writer
from pipelines.engine.capabilities import lateness_of
from pipelines.engine.contain import describe
from pipelines.engine.env import EMPTY_ENV, RunEnv
from pipelines.engine.errors import (
    InboxNotEmptyError,
    InvalidInputError,
    InvalidPipelineError,
    PipelineError,
    StaleVersionError,
)
from pipelines.engine.models import Commit, CommitReply, JobRecord, JobStatus
from pipelines.engine.phase import Done, Fail, PhaseContext, Pipeline
from pipelines.engine.runner import keeping
from pipelines.engine.runner.attempt import _context, _normalised, _outcome, _Saver, with_phase_state
from pipelines.engine.runner.interrupted import DEFAULT_MAX_INTERRUPTED_TURNS, interrupted_error
from pipelines.engine.runner.results import _RESULTS, AdvanceResult

__all__ = ["PipelineFor"]

logger = logging.getLogger("pipelines")

_HOLD_EARLY = 1.0  # seconds a delivery that came early within the scheduler's precision is held before it runs

PipelineFor = Callable[[JobRecord], Pipeline]
"""Finds the pipeline of a job from its record (the App looks it up by name)."""
class _LeasedJob:
    """One lease held on one job: runs its due phases (several under ``continue_for``) and commits each."""

    #: The job's lease in LEASE_KEEPER: a concurrency slot taken under it is renewed and released with it.
    lease: int | None = None
    max_interrupted: int | None = DEFAULT_MAX_INTERRUPTED_TURNS  #: a poison turn's limit (runner.interrupted)
    pipeline_for: PipelineFor  #: the pipeline of a job this app runs (set by :meth:`run`)

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
        self.pipeline_for = pipeline_for
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
            if record.parent_job is not None and self.parent_cancelled(record):
                # A child its parent's cancel could not reach: started by a turn whose wait never committed
                # (a crash, a forced cancel), so the parent does not list it; or whose parent was deleted since
                # (nothing waits for its outcome); or below a job cancelled by a cancel whose process died before
                # its walk got this far down (the parent between waits for its children). It follows them here.
                return self.apply_control(record.model_copy(update={"control": "cancel"}))
            if not self.due(record, cp.due_at):
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
            if self.let_go(commit, reply):
                return result
            # Exactly what storage now holds: go on without reloading.
            record = commit.record.model_copy(update={"control": reply.control, "inbox": reply.inbox})

    def due(self, record: JobRecord, due_at: float) -> bool:
        """Whether ``record``'s turn, due at ``due_at``, runs now: a delivery a little early waits for its time.

        A queue may deliver a delayed message a little early (the scheduler declares how much as its
        ``precision``: two machines' clocks, a broker's rounding). Such a one is neither run early nor
        dropped (nothing would send it again): held here up to ``_HOLD_EARLY`` s, sent again for its time
        past that (a worker is not kept idle longer); an earlier one is not due.
        """
        early = due_at - self.scheduler.now()
        if early > self.scheduler.precision:
            return False
        if early > _HOLD_EARLY:
            # No version: the message being handled now is this turn's, and its id must not be reused under it.
            self.scheduler.schedule_advance(record.job_id, early, pipeline=record.pipeline,
                                            priority=flow.priority_of(record))
            return False
        if early > 0:
            time.sleep(early)
        return True

    def let_go(self, commit: Commit, reply: CommitReply) -> bool:
        """Whether ``commit`` let the job go (released its lease); a pause or cancel asked meanwhile goes on then."""
        self.released = commit.release_lease
        if self.released and reply.control is not None:
            self.control_left(commit.record, reply.control)
        return self.released

    def control_left(self, record: JobRecord, control: str) -> None:
        """A pause or cancel asked during a turn whose commit let the job go: a delay, a retry later, a wait.

        Applied now, not when the delay ends or a person acts (the request stayed stored and the job
        said ``running`` for that long): a running job gets an advance at once, which applies it first
        thing (due or not; an id of its own, since the commit's delayed message holds its version's); a
        waiting one is cancelled here, as ``cancel_job`` cancels a waiting job (a pause waits for the
        job to run again).
        """
        try:
            if record.status is JobStatus.RUNNING:
                self.scheduler.schedule_advance(record.job_id, 0.0, pipeline=record.pipeline)
            elif record.status is JobStatus.WAITING and control == "cancel":
                commit = transitions.cancel(record, owner=None, now=self.scheduler.now())
                writer.apply(self.storage, self.scheduler, commit)
        except PipelineError as exc:  # stored still: the next advance, or the caller, applies it
            logger.warning("job %s: the %s asked during its turn waits: %s", record.job_id, control, exc)

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
        # The lease is kept: the woken turn runs now, on exactly what storage holds, its open journal
        # included (the commit kept it; the record it returns, as every record a commit builds, holds none):
        # without it the turn asked its model again and ran the children's finished siblings a second time.
        woken = commit.record.model_copy(update={"control": reply.control, "inbox": reply.inbox})
        if woken.checkpoint is not None and record.checkpoint is not None and record.checkpoint.journal:
            woken = woken.model_copy(update={"checkpoint": woken.checkpoint.model_copy(
                update={"journal": record.checkpoint.journal})})
        return woken

    def parent_cancelled(self, record: JobRecord) -> bool:
        """Whether a job above ``record`` stopped it (:func:`~pipelines.engine.children.stopped_above`)."""
        try:
            return children.stopped_above(record, self.storage)
        except PipelineError as exc:
            logger.error("job %s: cannot read a job above it (parent %s): %s", record.job_id, record.parent_job, exc)
            return False

    def admit(self, record: JobRecord, pipeline: Pipeline) -> JobRecord | AdvanceResult:
        """``record`` as this worker's version runs it (migrated), or why it does not run (:mod:`versions`; a poison
        turn: :mod:`~pipelines.engine.runner.interrupted`)."""
        admitted = versions.admit(record, pipeline.version, pipeline.migrations or {})
        self.migrating = admitted.migrating
        if admitted.delay > 0:  # written by a newer version: left untouched for a newer worker
            return self.defer(record, admitted.delay, f"written by version {record.code_version}")
        # A lease that ran out taken over too often: a poison turn is not run for ever (it outranks the version).
        error = interrupted_error(record, self.max_interrupted) or admitted.error
        if error is None:
            return admitted.record
        commit = transitions.after_phase(record, Fail(error), transitions.PhaseOutput(), owner=self.owner,
                                         now=self.scheduler.now())
        try:
            writer.apply(self.storage, self.scheduler, commit)
        except StaleVersionError:
            return AdvanceResult.STALE
        self.released = True
        return AdvanceResult.FAILED

    def keep_lease(self) -> Callable[[], bool]:
        """Whether the phase about to run keeps the job's lease after its commit (:func:`keeping.keep_lease`)."""
        return keeping.keep_lease(self.deadline, self.scheduler)

    def run_gated(self, record: JobRecord, pipeline: Pipeline,
                  keep_lease: Callable[[], bool]) -> tuple[AdvanceResult, Commit | None, CommitReply]:
        """``run_phase`` inside a concurrency slot of the run's key (when the App limits it)."""
        if self.flow is None:
            return self.run_phase(record, pipeline, keep_lease)
        wait = self.flow.enter_turn(record, self.scheduler.now(), lease=self.lease, owner=self.owner)
        if wait > 0:
            return self.defer(record, wait, "concurrency limit"), None, CommitReply()
        try:
            return self.run_phase(record, pipeline, keep_lease)
        finally:
            waiting = self.flow.leave_turn(record, lease=self.lease, owner=self.owner)
            if waiting is not None:
                self.wake_next(waiting)

    def wake_next(self, job_id: str) -> None:
        """Send the job first in a concurrency key's line an advance now: the slot this turn freed is its.

        On its own priority's queue (this runner's scheduler sends with the priority of the job that ran).
        """
        try:
            waiting = self.storage.get_job(job_id)
            if waiting is not None and waiting.status is JobStatus.RUNNING:
                self.pipeline_for(waiting)  # raises for another app's job (one storage): not sent to this app's queue
                self.scheduler.schedule_advance(job_id, 0.0, pipeline=waiting.pipeline,
                                                priority=flow.priority_of(waiting))
        except InvalidPipelineError:
            pass  # its own retry wakes it, as below
        except PipelineError as exc:  # its own retry comes within FRONT_RETRY_SECONDS all the same
            logger.warning("job %s: could not wake it for the slot it waits for: %s", job_id, exc)

    def defer(self, record: JobRecord, delay: float, why: str) -> AdvanceResult:
        """Run the same turn again after ``delay``, committing nothing (flow control: no attempt spent).

        The job's place in the due index moves to when the retry arrives at the latest (its
        scheduler's :class:`~adapters.base.LateDelivery`: RQ's come up to 2 s late): the sweep finds it
        overdue only if this message is lost (I7), not at every pass while it waits (each of
        its sends would start one more chain of deferrals). A fresh queue message (no version
        in its id): the one running now carries this turn's version.
        """
        logger.info("job %s: deferred %.2fs (%s)", record.job_id, delay, why)
        try:
            lateness = flow.bounded_wait(lateness_of(self.scheduler))
            writer.postpone(self.storage, record, self.scheduler.now() + delay + lateness)
        except PipelineError as exc:  # the sweep may send it again meanwhile: extra advances, never a lost one
            logger.warning("job %s: could not move it later in the due index: %s", record.job_id, exc)
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
        except StaleVersionError as exc:
            _fenced(job_id, exc)
            return AdvanceResult.STALE, None, CommitReply()
        if isinstance(outcome, flow.FlowDeferred):
            return self.defer(saver.record, outcome.delay, outcome.reason), None, CommitReply()
        rec = with_phase_state(saver.record, ctx)
        outcome = _normalised(outcome, rec, pipeline)
        try:
            commit, reply = self.commit(rec, ctx, outcome, keep_lease, stored=saver.record)
        except StaleVersionError as exc:
            _fenced(job_id, exc)
            return AdvanceResult.STALE, None, CommitReply()
        # A commit that could not be stored as built was replaced by a failure.
        result = AdvanceResult.FAILED if commit.record.status is JobStatus.ERROR else _RESULTS[type(outcome)]
        if result is AdvanceResult.ADVANCED and commit.record.checkpoint is not None:
            ctx.run_on_commit(commit.record.checkpoint)
        return result, commit, reply

    def commit(self, rec: JobRecord, ctx: PhaseContext[Any], outcome: transitions.Outcome,
               keep_lease: Callable[[], bool], *, stored: JobRecord | None = None) -> tuple[Commit, CommitReply]:
        """Commit ``outcome`` on ``rec``; an outcome storage refuses ends the job in error instead.

        ``stored``: the record as storage holds it (``rec`` may hold the state as the phase changed it in
        place): the failure is built on it, so a state storage refuses is not refused twice (I9).
        """
        out = ctx.take_output()
        now = self.scheduler.now()
        try:
            try:
                commit = transitions.after_phase(rec, outcome, out, owner=self.owner, now=now,
                                                 keep_lease=keep_lease())
            except PipelineError:
                raise
            except Exception as exc:  # a value no check caught (a user's subclass, say): not a worker's crash
                logger.warning("job %s: no commit could be built of its outcome", rec.job_id, exc_info=True)
                raise InvalidInputError(f"no commit could be built of it: {describe(exc)}") from exc
            return self.apply_outcome(rec, commit, outcome, out, now)
        except InvalidInputError as exc:
            # What the phase produced cannot be stored (too large, not JSON), or no commit could be built of it:
            # the job ends in error saying so, rather than staying due forever
            # while every sweep runs the phase into the same wall (I9).
            failed = Fail(f"the outcome of phase {ctx.phase!r} could not be committed: {exc}")
            kept = transitions.PhaseOutput(usage=out.usage, usage_keys=out.usage_keys)
            commit = transitions.after_phase(rec if stored is None else stored, failed, kept, owner=self.owner,
                                             now=now)
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


def _fenced(job_id: str, exc: StaleVersionError) -> None:
    # A warning: a turn whose lease ran out (a stalled process, a long GC pause) or that an operator's forced
    # cancel fenced off did work nobody keeps; a tool call it ran and could not journal runs again.
    logger.warning("job %s: this worker's turn was fenced off and its work discarded (%s); the turn is the "
                   "current lease holder's to run, and a tool call it ran unjournaled runs again", job_id, exc)
