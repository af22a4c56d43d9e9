"""One phase attempt: its context, the phase run with whatever it raises made an outcome, mid-phase saves."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from adapters.base import Scheduler, Storage
from pipelines.engine import telemetry, transitions, versions, writer
from pipelines.engine._aio import resolve
from pipelines.engine.contain import contained, describe
from pipelines.engine.env import RunEnv
from pipelines.engine.errors import PipelineError, StaleVersionError, StorageUnavailableError
from pipelines.engine.models import JobRecord, fresh_json, owned_json_value, same_json, to_json_value
from pipelines.engine.phase import Done, Fail, FailJob, Next, PhaseContext, Pipeline, RetryLater, WaitForInput
from pipelines.engine.phase import validate_state as _validate_state

__all__ = ["STORAGE_RETRY_SECONDS"]

logger = logging.getLogger("pipelines")

STORAGE_RETRY_SECONDS = 5.0
"""How soon a phase that lost its storage connection mid-way is tried again."""

class _Saver:
    """``ctx.save_state``: commits the state mid-phase and tracks the record the phase now runs on."""

    def __init__(self, record: JobRecord, storage: Storage, scheduler: Scheduler, owner: str) -> None:
        self.record = record
        self.storage = storage
        self.scheduler = scheduler
        self.owner = owner

    def __call__(self, state: Any) -> int:
        assert self.record.checkpoint is not None
        # The engine's own copy: the phase goes on with (and may change) the object it saved.
        value = owned_json_value(state, what=f"state saved by phase {self.record.checkpoint.next_phase!r}")
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
                        migrating=migrating, env=env, phases_done=record.phases_done)


def _outcome(ctx: PhaseContext[Any], pipeline: Pipeline, record: JobRecord) -> transitions.Outcome:
    """Run the phase; whatever it raises becomes an outcome, except being fenced off."""
    cp = ctx.checkpoint
    phase = pipeline.by_name.get(cp.next_phase)
    if phase is None:
        return Fail(f"unknown phase {cp.next_phase!r}; phases are {', '.join(pipeline.by_name)}")
    try:
        # The phase gets a copy of the stored state: a change it makes in place, in an attempt that then
        # retries, fails or is fenced off, must not reach the record a storage (or a warm load) holds.
        given = fresh_json(cp.state) if phase.copy_state else cp.state
        state = _validate_state(phase, given, pipeline.state_model_of(phase))
        if state is not cp.state:  # a scalar state is its own copy (and a phase may take none)
            ctx.checkpoint = cp.model_copy(update={"state": state})
        outcome = resolve(phase.run(ctx))
    except StaleVersionError:
        raise
    except (RetryLater, WaitForInput) as sig:
        # Returned, not raised on: without its traceback, whose frames (this one's caller holding the
        # outcome among them) would make a reference cycle of every turn that waits or retries.
        return sig.with_traceback(None)
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
        telemetry.record_error(None, exc)  # the turn's span (error.type: the exception's class)
        return Fail(describe(exc))
    if not isinstance(outcome, Next | Done | Fail | RetryLater | WaitForInput):
        return Fail(f"phase {phase.name!r} returned {type(outcome).__name__}; "
                    "expected Next, Done, Fail, RetryLater or WaitForInput")
    return outcome


def with_phase_state(rec: JobRecord, ctx: PhaseContext[Any]) -> JobRecord:
    """``rec`` holding the plain state the phase ran with, as it may have changed it in place: what its outcome keeps.

    The phase was given a copy of the stored state (:func:`_outcome`); whatever it did to that copy counts
    as it did when the phase was handed the stored object itself, and the record keeps a copy of its own.
    With a state model, the stored state as before.
    """
    cp = rec.checkpoint
    assert cp is not None
    state = ctx.checkpoint.state
    if state is cp.state or isinstance(state, BaseModel) or same_json(state, cp.state):
        return rec  # unchanged (the usual case): the stored state, no copy made
    try:
        kept = owned_json_value(state, what=f"state returned by phase {cp.next_phase!r}")
    except PipelineError:
        kept = state  # refused where it is stored, as before: the job fails saying why
    return rec.model_copy(update={"checkpoint": cp.model_copy(update={"state": kept})})


def _normalised(outcome: transitions.Outcome, rec: JobRecord, pipeline: Pipeline) -> transitions.Outcome:
    """Check a Next's phase name and turn state / result into their stored JSON form (the engine's own copy)."""
    cp = rec.checkpoint
    assert cp is not None
    try:
        if isinstance(outcome, Next):
            if outcome.next_phase not in pipeline.by_name:
                return Fail(f"phase {cp.next_phase!r} asked for unknown next phase {outcome.next_phase!r}; "
                            f"phases are {', '.join(pipeline.by_name)}")
            what = f"state returned by phase {cp.next_phase!r}"
            # The kept state is the engine's own already (with_phase_state); a new one is copied, unless the
            # phase says it does not change what it returned (Phase.copy_state).
            take = owned_json_value if _copies(pipeline, cp.next_phase) else to_json_value
            value = to_json_value(cp.state, what=what) if outcome.state is None else take(outcome.state, what=what)
            return Next(outcome.next_phase, state=value, delay=outcome.delay)
        if isinstance(outcome, Done):
            value = owned_json_value(outcome.result, what=f"result returned by phase {cp.next_phase!r}")
            return Done(result=value, reason=outcome.reason)
        if isinstance(outcome, WaitForInput) and outcome.details:
            # The record keeps them (``waiting``): the engine's own copy, as of a state or a result.
            details = owned_json_value(outcome.details, what=f"details of the wait of phase {cp.next_phase!r}")
            return WaitForInput(outcome.reason, call_id=outcome.call_id, details=details)
    except PipelineError as exc:
        return Fail(str(exc))
    return outcome


def _copies(pipeline: Pipeline, name: str) -> bool:
    phase = pipeline.by_name.get(name)
    return phase is None or phase.copy_state
