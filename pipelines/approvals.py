"""A person in the loop: approve or reject a tool call, or record the outcome of an interrupted one.

A tool declared ``needs_approval`` stops its turn before it runs: the job is
``waiting`` and ``record.waiting["calls"]`` lists each pending call (tool,
arguments, call id). ``approve`` / ``reject`` journal the decision in the
open turn, bound to the exact arguments shown, and reschedule the job. The
decision lives in that turn's journal, next to the call's ledger entry: once
the call has run, its journaled result is what a retry reuses, so an approved
call cannot run twice, and the next turn starts with no approvals at all.
When a turn waits on several calls, the job goes on once each is decided.
"""

from __future__ import annotations

import uuid
from typing import Any

from adapters.base import Scheduler, Storage
from phases.tool_runner import arguments_digest
from phases.tools import result_content
from pipelines.errors import InvalidInputError, JobConflictError, JobNotFoundError, StaleVersionError
from pipelines.models import Commit, JobRecord, JobStatus, LogEntry, validate_job_id

__all__ = ["approve", "pending_calls", "record_tool_result", "reject"]


def _load(job_id: str, storage: Storage) -> JobRecord:
    validate_job_id(job_id)
    record = storage.get_job(job_id)
    if record is None:
        raise JobNotFoundError(f"job {job_id!r} does not exist")
    return record


def _turn_call(record: JobRecord, call_id: str) -> dict[str, Any]:
    """The tool call ``call_id`` of the job's open turn (from its journaled model answer)."""
    cp = record.checkpoint
    journal = cp.journal if cp is not None else {}
    calls = ((journal.get("model") or {}).get("message") or {}).get("tool_calls") or []
    for call in calls:
        if call.get("id") == call_id:
            return dict(call)
    raise InvalidInputError(f"job {record.job_id!r} has no tool call {call_id!r} in its current turn")


def pending_calls(job_id: str, *, storage: Storage) -> list[dict[str, Any]]:
    """The calls a waiting job still needs a decision on: ``[{"call_id", "tool", "arguments"}]``."""
    return _undecided(_load(job_id, storage))


def _undecided(record: JobRecord) -> list[dict[str, Any]]:
    if record.status is not JobStatus.WAITING or record.waiting is None or record.checkpoint is None:
        return []
    journal = record.checkpoint.journal
    return [c for c in record.waiting.get("calls") or [] if f"approval:{c.get('call_id')}" not in journal]


def approve(job_id: str, call_id: str, *, storage: Storage, scheduler: Scheduler) -> None:
    """Approve the waiting call ``call_id`` with the arguments it was shown with; the job goes on."""
    _decide(job_id, call_id, {"decision": "approved"}, storage, scheduler)


def reject(job_id: str, call_id: str, *, reason: str, storage: Storage, scheduler: Scheduler) -> None:
    """Reject the waiting call ``call_id``; the model gets ``reason`` as the tool's result and goes on."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInputError("reject needs a non-empty reason; the model reads it")
    _decide(job_id, call_id, {"decision": "rejected", "reason": reason}, storage, scheduler)


def _decide(job_id: str, call_id: str, decision: dict[str, Any], storage: Storage, scheduler: Scheduler) -> None:
    record = _load(job_id, storage)
    waiting = record.waiting or {}
    if record.status is not JobStatus.WAITING or waiting.get("kind") != "approval":
        raise JobConflictError(f"job {job_id!r} is {record.status.value}, not waiting for an approval")
    if call_id not in {c.get("call_id") for c in waiting.get("calls") or []}:
        raise InvalidInputError(f"job {job_id!r} is not waiting for an approval of call {call_id!r}")
    if call_id not in {c.get("call_id") for c in _undecided(record)}:
        raise JobConflictError(f"call {call_id!r} of job {job_id!r} is already decided")
    call = _turn_call(record, call_id)
    storage.record_step(job_id, version=record.version, owner=None, key=f"approval:{call_id}",
                        value={**decision, "digest": arguments_digest(call)})
    # The job goes on once every call it waits on is decided, so a person
    # can decide several calls one after the other.
    after = storage.get_job(job_id)
    if after is not None and not _undecided(after):
        _resume(after, f"call {call_id} {decision['decision']}", storage, scheduler)


def record_tool_result(job_id: str, call_id: str, result: Any, *, storage: Storage, scheduler: Scheduler) -> None:
    """Record the outcome of a tool call that was interrupted mid-call, as a person found it.

    For tools whose ``on_interrupted`` is ``"ask"`` (the job is ``waiting``)
    the job goes on at once; for ``"fail"`` (the job is in ``error``) retry it
    afterwards with ``retry_mode="resume"``. ``result`` becomes the tool
    message the model sees.
    """
    record = _load(job_id, storage)
    if record.status not in (JobStatus.WAITING, JobStatus.ERROR) or record.checkpoint is None:
        raise JobConflictError(f"job {job_id!r} is {record.status.value}; only a waiting or failed job takes a result")
    _turn_call(record, call_id)
    storage.record_step(job_id, version=record.version, owner=None, key=f"tool:{call_id}",
                        value=result_content(result))
    if record.status is JobStatus.WAITING:
        _resume(record, f"outcome of {call_id} recorded", storage, scheduler)


def _resume(record: JobRecord, why: str, storage: Storage, scheduler: Scheduler) -> None:
    """Set a waiting job running again (its journal, with the new decision, kept) and enqueue it."""
    cp = record.checkpoint
    assert cp is not None
    now = scheduler.now()
    version = record.version + 1
    resumed = record.model_copy(update={
        "status": JobStatus.RUNNING, "waiting": None, "version": version, "updated_at": now,
        "checkpoint": cp.model_copy(update={"version": version, "due_at": now, "journal": {}}),
    })
    entry = LogEntry(timestamp=now, phase=cp.next_phase, level="info", message=why)
    try:
        storage.commit(Commit(job_id=record.job_id, expected_version=record.version, token=uuid.uuid4().hex,
                              record=resumed, logs=[entry], keep_journal=True))
    except StaleVersionError as exc:
        raise JobConflictError(f"job {record.job_id!r} changed meanwhile; try again") from exc
    scheduler.schedule_advance(record.job_id, 0.0, pipeline=record.pipeline, version=version)
