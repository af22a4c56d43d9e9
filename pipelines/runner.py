"""The phase runner: ``advance_phase`` runs one phase of a job (``pipelines.start`` writes jobs).

One advance, step by step (DESIGN "The turn"):

1. take the job's lease and load the record in one call; unknown, leased,
   not running or not yet due → no-op (duplicates are normal, I6);
2. run the phase; ``ctx.step`` journals results as it goes (I5);
3. commit atomically, fenced on the version read (I1, I2); the commit also
   releases the lease, so the next advance can start at once;
4. schedule the next advance (the fast path; storage's due index is the
   truth, I7).

Every failure ends as data (I9): status ``error``, a readable message, the
last good checkpoint kept for ``retry_mode="resume"``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from adapters.base import Scheduler, Storage
from pipelines._aio import resolve
from pipelines.errors import (
    CorruptRecordError,
    InvalidInputError,
    InvalidPipelineError,
    PipelineError,
    StaleVersionError,
    StorageUnavailableError,
)
from pipelines.events import make_event, publish
from pipelines.leases import LEASE_KEEPER, check_lease_seconds
from pipelines.models import (
    Checkpoint,
    Commit,
    Event,
    JobRecord,
    JobStatus,
    LogEntry,
    LogLevel,
    Message,
    to_json_value,
    validate_job_id,
)
from pipelines.phase import (
    Done,
    Fail,
    FailJob,
    Next,
    Phase,
    PhaseContext,
    RetryLater,
    WaitForInput,
    validate_state,
)
from pipelines.tokens import new_token

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "AdvanceResult",
    "advance_job",
    "advance_phase",
    "phase_map",
    "try_advance",
]

logger = logging.getLogger("pipelines")

STORAGE_RETRY_SECONDS = 5.0
"""How soon a phase that lost its storage connection mid-way is tried again."""

DEFAULT_LEASE_SECONDS = 60.0
"""Lease time to live. The lease keeper renews it every third of that while a phase runs."""



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


def phase_map(phases: Sequence[Phase]) -> dict[str, Phase]:
    """Index ``phases`` by name, rejecting an empty list and duplicate names."""
    if isinstance(phases, Phase) or not isinstance(phases, Sequence):
        raise InvalidPipelineError(f"phases must be a list of Phase, got {type(phases).__name__}")
    if not phases:
        raise InvalidPipelineError("a pipeline needs at least one phase; got an empty list")
    out: dict[str, Phase] = {}
    for p in phases:
        if not isinstance(p, Phase):
            raise InvalidPipelineError(f"phases must be Phase objects, got {type(p).__name__}")
        if p.name in out:
            raise InvalidPipelineError(f"duplicate phase name {p.name!r}")
        out[p.name] = p
    return out


def advance_phase(
    *,
    job_id: str,
    phases: Sequence[Phase],
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> None:
    """Run the job's next phase once, if it is running, due and not leased (else a no-op).

    Safe to call any number of times, from any number of processes (I6). A
    phase's exception never escapes: it is recorded on the job as status
    ``error`` (I9).
    """
    try_advance(job_id=job_id, phases=phases, storage=storage, scheduler=scheduler, lease_seconds=lease_seconds)


def try_advance(
    *,
    job_id: str,
    phases: Sequence[Phase],
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
) -> AdvanceResult:
    """``advance_phase`` that says what it did (for the CLI, the sweep and tests).

    ``continue_for`` (seconds, default 0): after a commit whose next phase is
    due at once, keep the lease and run that phase right away instead of a
    queue round trip, until this much time has passed (the turn in progress
    always finishes). A worker then serves one job for at most about that
    long before it goes back to the queue, which keeps jobs fair.
    """
    pmap = phase_map(phases)
    return advance_job(job_id, lambda record: pmap, storage=storage, scheduler=scheduler,
                       lease_seconds=lease_seconds, continue_for=continue_for)


def advance_job(
    job_id: str,
    phases_for: Callable[[JobRecord], dict[str, Phase]],
    *,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
) -> AdvanceResult:
    """``try_advance`` with the phases chosen from the record (``App`` resolves them by pipeline name).

    One round trip takes the lease and loads the record; ``phases_for`` runs
    under the lease, so a job naming an unknown pipeline raises with the lease
    released and nothing written.
    """
    validate_job_id(job_id)
    check_lease_seconds(lease_seconds)
    if not isinstance(continue_for, int | float) or not 0 <= continue_for < math.inf:
        raise InvalidInputError(f"continue_for must be a finite number of seconds >= 0, got {continue_for!r}")
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
    released = False
    deadline = time.monotonic() + continue_for
    try:
        while True:
            cp = record.checkpoint
            if record.status is not JobStatus.RUNNING or cp is None:
                return AdvanceResult.NOT_RUNNING
            now = scheduler.now()
            # Queues deliver delayed messages with some imprecision (RQ: ~1 s);
            # a scheduler may declare it, and we accept that much earliness
            # rather than drop a message that nothing would send again.
            if cp.due_at > now + float(getattr(scheduler, "precision", 0.0)):
                return AdvanceResult.NOT_DUE
            keep = continue_for > 0 and time.monotonic() < deadline
            result, commit = _run_and_commit(record, cp, phases_for(record), storage, scheduler, owner, now, keep)
            if commit is None:
                return result
            released = commit.release_lease
            if released:
                return result
            record = commit.record  # exactly what storage now holds: go on without reloading
    finally:
        LEASE_KEEPER.drop(held)
        if not released:
            storage.release_lease(job_id, owner)


def _run_and_commit(
    record: JobRecord,
    cp: Checkpoint[Any],
    pmap: dict[str, Phase],
    storage: Storage,
    scheduler: Scheduler,
    owner: str,
    now: float,
    keep_lease: bool,
) -> tuple[AdvanceResult, Commit | None]:
    """Run the phase and commit; ``(result, None)`` when fenced off. Schedules the next advance
    unless the commit kept the lease to run it at once."""
    job_id = record.job_id
    current = {"record": record}

    def save(state: Any) -> int:
        rec = current["record"]
        assert rec.checkpoint is not None
        value = to_json_value(state, what=f"state saved by phase {rec.checkpoint.next_phase!r}")
        version = rec.version + 1
        t = scheduler.now()
        new_cp = rec.checkpoint.model_copy(update={"state": value, "version": version, "updated_at": t, "journal": {}})
        new = rec.model_copy(update={"checkpoint": new_cp, "version": version, "updated_at": t})
        storage.commit(Commit(job_id=job_id, expected_version=rec.version, owner=owner, token=new_token(),
                              record=new, keep_journal=True, release_lease=False))
        current["record"] = new
        return version

    phase = pmap.get(cp.next_phase)
    ctx: PhaseContext[Any] = PhaseContext(job_id=job_id, checkpoint=cp, storage=storage, owner=owner,
                                          clock=scheduler.now, saver=save, attempt=cp.attempt, usage=record.usage)
    try:
        if phase is None:
            outcome: object = Fail(f"unknown phase {cp.next_phase!r}; phases are {', '.join(pmap)}")
        else:
            ctx.checkpoint = cp.model_copy(update={"state": validate_state(phase, cp.state)})
            outcome = resolve(phase.run(ctx))
            if not isinstance(outcome, Next | Done | Fail):
                outcome = Fail(f"phase {phase.name!r} returned {type(outcome).__name__}; expected Next, Done or Fail")
    except StaleVersionError:
        logger.info("job %s: fenced off (another worker moved it on)", job_id)
        return AdvanceResult.STALE, None
    except (RetryLater, WaitForInput) as sig:
        outcome = sig
    except StorageUnavailableError as exc:
        # Storage went away mid-phase (a journal write failed): that is no
        # reason to fail the job. Run the phase again shortly, reusing what
        # was journaled; if storage is still down, this commit fails too and
        # the lease runs out, so the sweep picks the job up later (I7).
        outcome = RetryLater(STORAGE_RETRY_SECONDS, f"storage unavailable: {exc}")
    except FailJob as sig:
        outcome = Fail(sig.error)
    except Exception as exc:
        logger.info("job %s: phase %s raised", job_id, cp.next_phase, exc_info=True)
        outcome = Fail(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

    rec = current["record"]
    commit, result = _build_commit(rec, ctx, outcome, pmap, owner, scheduler.now(), keep_lease)
    try:
        storage.commit(commit)
    except StaleVersionError:
        logger.info("job %s: commit fenced off (another worker moved it on)", job_id)
        return AdvanceResult.STALE, None
    new = commit.record
    publish(job_id, commit.events)
    if result is AdvanceResult.ADVANCED and new.checkpoint is not None:
        for fn in ctx._on_commit:
            try:
                fn(new.checkpoint)
            except Exception:
                logger.warning("job %s: on_commit callback failed", job_id, exc_info=True)
    if commit.release_lease and new.status is JobStatus.RUNNING and new.checkpoint is not None:
        delay = max(0.0, new.checkpoint.due_at - scheduler.now())
        scheduler.schedule_advance(job_id, delay, pipeline=new.pipeline, version=new.version)
    return result, commit


def _build_commit(
    rec: JobRecord, ctx: PhaseContext[Any], outcome: object, pmap: dict[str, Phase], owner: str, now: float,
    keep_lease: bool = False,
) -> tuple[Commit, AdvanceResult]:
    assert rec.checkpoint is not None
    cp = rec.checkpoint
    buf = ctx._take_buffer()
    logs = list(buf.logs)
    events: list[Event] = []
    phase = cp.next_phase
    version = rec.version + 1
    base = {"version": version, "updated_at": now}
    if isinstance(outcome, Next) and outcome.next_phase not in pmap:
        outcome = Fail(f"phase {cp.next_phase!r} asked for unknown next phase {outcome.next_phase!r}; "
                       f"phases are {', '.join(pmap)}")
    if isinstance(outcome, Next | Done):
        try:
            value = to_json_value(
                cp.state if isinstance(outcome, Next) and outcome.state is None else
                (outcome.state if isinstance(outcome, Next) else outcome.result),
                what=f"{'state' if isinstance(outcome, Next) else 'result'} returned by phase {cp.next_phase!r}",
            )
        except PipelineError as exc:
            outcome, value = Fail(str(exc)), None
    keep_journal = False
    messages: list[Message] = []
    usage = rec.usage
    token = new_token()
    if isinstance(outcome, Next):
        tlen = rec.transcript_len + len(buf.messages)
        new_cp = Checkpoint[Any](next_phase=outcome.next_phase, state=value, version=version, attempt=0,
                                 due_at=now + outcome.delay, transcript_len=tlen, created_at=now, updated_at=now,
                                 commit_id=token)
        new = rec.model_copy(update={**base, "checkpoint": new_cp, "transcript_len": tlen,
                                     "usage": usage + buf.usage, "phases_done": rec.phases_done + 1})
        messages, result = buf.messages, AdvanceResult.ADVANCED
        events = buf.events
    elif isinstance(outcome, Done):
        tlen = rec.transcript_len + len(buf.messages)
        logs.append(_log(now, cp.next_phase, "info", "job complete"))
        new = rec.model_copy(update={**base, "status": JobStatus.COMPLETE, "checkpoint": None, "result": value,
                                     "stop_reason": outcome.reason or "done",
                                     "transcript_len": tlen, "usage": usage + buf.usage,
                                     "phases_done": rec.phases_done + 1})
        messages, result = buf.messages, AdvanceResult.COMPLETED
        events = [*buf.events, make_event("job_finished", now, phase=phase, reason=outcome.reason or "done")]
    elif isinstance(outcome, RetryLater):
        # Same phase again later; journaled steps survive so they are not repeated.
        keep_journal = True
        logs.append(_log(now, cp.next_phase, "warn", f"retrying phase in {outcome.delay:.1f}s: {outcome}"))
        new_cp = cp.model_copy(update={"version": version, "attempt": cp.attempt + 1, "due_at": now + outcome.delay,
                                       "updated_at": now, "journal": {}})
        new = rec.model_copy(update={**base, "checkpoint": new_cp})
        result = AdvanceResult.RETRY_LATER
        events = [make_event("retry_scheduled", now, phase=phase, delay=outcome.delay, reason=str(outcome))]
    elif isinstance(outcome, WaitForInput):
        keep_journal = True
        logs.append(_log(now, cp.next_phase, "warn", f"waiting: {outcome.reason}"))
        new = rec.model_copy(update={**base, "status": JobStatus.WAITING,
                                     "waiting": {**outcome.details, "reason": outcome.reason,
                                                 "call_id": outcome.call_id},
                                     "checkpoint": cp.model_copy(update={"version": version, "journal": {}})})
        result = AdvanceResult.WAITING
        kind = "approval_requested" if outcome.details.get("kind") == "approval" else "job_waiting"
        events = [make_event(kind, now, phase=phase, **{**outcome.details, "reason": outcome.reason})]
    else:
        assert isinstance(outcome, Fail)
        # The last good checkpoint stays, journal included, for a "resume" retry (I9).
        keep_journal = True
        logs.append(_log(now, cp.next_phase, "error", outcome.error))
        new = rec.model_copy(update={**base, "status": JobStatus.ERROR, "error": outcome.error,
                                     "checkpoint": cp.model_copy(update={"version": version, "journal": {}})})
        result = AdvanceResult.FAILED
        events = [make_event("job_failed", now, phase=phase, error=outcome.error)]
    commit = Commit(job_id=rec.job_id, expected_version=rec.version, owner=owner, token=token,
                    record=new, append_messages=messages, logs=logs, events=events, keep_journal=keep_journal,
                    # Kept only to run the next phase at once (see try_advance's continue_for).
                    release_lease=not (keep_lease and isinstance(outcome, Next) and outcome.delay == 0))
    return commit, result


def _log(now: float, phase: str | None, level: LogLevel, message: str) -> LogEntry:
    return LogEntry(timestamp=now, phase=phase, level=level, message=message)
