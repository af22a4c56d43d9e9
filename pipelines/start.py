"""Starting jobs: ``run_pipeline`` writes a new job (or retries one) and enqueues its first advance.

Nothing here runs a phase; ``pipelines.runner`` does. Bad input raises before
anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from adapters.base import Scheduler, Storage
from pipelines.errors import (
    InvalidInputError,
    InvalidPipelineError,
    JobConflictError,
    JobNotFoundError,
    StaleVersionError,
)
from pipelines.events import make_event, publish
from pipelines.leases import check_lease_seconds
from pipelines.models import (
    Checkpoint,
    Commit,
    JobRecord,
    JobStatus,
    LogEntry,
    Message,
    check_messages,
    to_json_value,
    validate_job_id,
)
from pipelines.phase import Phase
from pipelines.runner import DEFAULT_LEASE_SECONDS, advance_phase, phase_map

__all__ = ["RetryMode", "run_pipeline", "start_job"]

RetryMode = Literal["resume", "full"]

_ACTIVE = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)


def run_pipeline(
    *,
    job_id: str,
    phases: Sequence[Phase],
    storage: Storage,
    scheduler: Scheduler,
    initial_state: Any = None,
    retry_mode: RetryMode | None = None,
    initial_phase: str | None = None,
    pipeline: str = "default",
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> None:
    """Write the job to storage and enqueue its first advance. Returns at once.

    A new ``job_id`` starts at ``initial_phase`` (default: the first phase).
    For a job that ended in ``error`` or ``cancelled``, ``retry_mode="resume"``
    (the default when it has a checkpoint) continues from the checkpoint;
    ``"full"`` restarts from the first phase and ``initial_state``, cutting the
    transcript back to where this run began. A running, waiting or paused job
    raises :class:`JobConflictError`. Bad input raises before anything is written.
    """
    pmap = phase_map(phases)
    check_lease_seconds(lease_seconds)

    def advance(jid: str) -> None:
        advance_phase(job_id=jid, phases=phases, storage=storage, scheduler=scheduler, lease_seconds=lease_seconds)

    scheduler.bind(advance, pipeline=pipeline)
    start_job(
        job_id=job_id,
        phase_names=list(pmap),
        storage=storage,
        scheduler=scheduler,
        initial_state=initial_state,
        retry_mode=retry_mode,
        initial_phase=initial_phase,
        pipeline=pipeline,
    )


def start_job(
    *,
    job_id: str,
    phase_names: Sequence[str],
    storage: Storage,
    scheduler: Scheduler,
    initial_state: Any = None,
    retry_mode: RetryMode | None = None,
    initial_phase: str | None = None,
    pipeline: str = "default",
    messages: Sequence[Message] = (),
    continue_completed: bool = False,
) -> JobRecord:
    """Create, retry or continue a job, then schedule its first advance.

    ``continue_completed``: a ``complete`` job starts a new run from the first
    phase with ``messages`` appended to its kept transcript (an agent
    conversation going on). Returns the record as written.
    """
    validate_job_id(job_id)
    if retry_mode not in (None, "resume", "full"):
        raise InvalidInputError(f"retry_mode must be None, 'resume' or 'full', got {retry_mode!r}")
    if initial_phase is not None and initial_phase not in phase_names:
        raise InvalidPipelineError(f"unknown initial_phase {initial_phase!r}; phases are {', '.join(phase_names)}")
    first = initial_phase or phase_names[0]
    state = to_json_value(initial_state, what=f"initial_state of job {job_id!r}")
    new_messages = check_messages(messages, f"initial messages of job {job_id!r}")
    now = scheduler.now()

    existing = storage.get_job(job_id)
    if existing is None:
        if retry_mode == "resume":
            raise JobNotFoundError(f"job {job_id!r} does not exist; nothing to resume")
        record = JobRecord(
            job_id=job_id,
            pipeline=pipeline,
            status=JobStatus.RUNNING,
            checkpoint=_fresh_checkpoint(first, state, 1, now, len(new_messages)),
            version=1,
            transcript_len=len(new_messages),
            base_transcript_len=len(new_messages),
            initial_phase=first,
            initial_state=state,
            created_at=now,
            updated_at=now,
        )
        started = LogEntry(timestamp=now, phase=first, message="job started")
        events = [make_event("job_started", now, phase=first, pipeline=pipeline)]
        storage.create_job(record, messages=new_messages, logs=[started], events=events)
    else:
        restart = _restart(existing, first, state, retry_mode, new_messages, continue_completed, now, pipeline)
        record = restart.record
        events = [make_event(restart.event, now, phase=record.checkpoint.next_phase if record.checkpoint else None)]
        commit = Commit(
            job_id=job_id,
            expected_version=existing.version,
            token=uuid.uuid4().hex,
            record=record,
            append_messages=new_messages,
            truncate_messages_to=restart.truncate_to,
            logs=[LogEntry(timestamp=now, phase=record.checkpoint.next_phase if record.checkpoint else None,
                           message=restart.why)],
            keep_journal=restart.keep_journal,
            events=events,
        )
        try:
            storage.commit(commit)
        except StaleVersionError as exc:
            raise JobConflictError(f"job {job_id!r} changed while it was being restarted; try again") from exc
    publish(job_id, events)
    scheduler.schedule_advance(job_id, 0.0, pipeline=pipeline, version=record.version)
    return record


def _fresh_checkpoint(phase: str, state: Any, version: int, now: float, tlen: int) -> Checkpoint[Any]:
    return Checkpoint(next_phase=phase, state=state, version=version, due_at=now, transcript_len=tlen,
                      created_at=now, updated_at=now)


@dataclass(frozen=True)
class _Restart:
    record: JobRecord
    why: str
    event: str
    truncate_to: int | None = None
    keep_journal: bool = False


def _restart(
    existing: JobRecord,
    first: str,
    state: Any,
    retry_mode: RetryMode | None,
    new_messages: list[Message],
    continue_completed: bool,
    now: float,
    pipeline: str,
) -> _Restart:
    jid = existing.job_id
    if existing.status in _ACTIVE:
        raise JobConflictError(f"job {jid!r} is {existing.status.value}; wait for it, or cancel it before a retry")
    version = existing.version + 1
    running = {"status": JobStatus.RUNNING, "error": None, "waiting": None, "stop_reason": None, "version": version,
               "updated_at": now}
    if existing.status is JobStatus.COMPLETE and continue_completed and retry_mode is None:
        # A finished conversation goes on: keep the transcript, add the new messages.
        tlen = existing.transcript_len + len(new_messages)
        record = existing.model_copy(update={
            **running, "result": None, "checkpoint": _fresh_checkpoint(first, state, version, now, tlen),
            "transcript_len": tlen, "base_transcript_len": tlen, "initial_phase": first, "initial_state": state,
            "pipeline": pipeline,
        })
        return _Restart(record, "job continued with new messages", "job_continued")
    if new_messages:
        raise JobConflictError(
            f"job {jid!r} exists ({existing.status.value}); new messages only continue a complete job"
        )
    mode = retry_mode or ("resume" if existing.checkpoint is not None else "full")
    if mode == "resume":
        if existing.checkpoint is None:
            raise JobConflictError(f"job {jid!r} is {existing.status.value} with no checkpoint; nothing to resume")
        cp = existing.checkpoint.model_copy(update={
            "version": version, "attempt": existing.checkpoint.attempt + 1, "due_at": now, "updated_at": now,
            "journal": {},
        })
        # The journal stays: steps that finished before the failure are not repeated.
        record = existing.model_copy(update={**running, "checkpoint": cp})
        return _Restart(record, f"job retried (resume) at phase {cp.next_phase!r}", "job_retried", keep_journal=True)
    # Full: the first phase, the initial state given now (or the stored one),
    # the transcript cut back to where this run began (I4).
    restart_state = state if state is not None else existing.initial_state
    base = existing.base_transcript_len
    record = existing.model_copy(update={
        **running, "result": None, "checkpoint": _fresh_checkpoint(first, restart_state, version, now, base),
        "transcript_len": base,
    })
    return _Restart(record, "job retried (full)", "job_retried", truncate_to=base)
