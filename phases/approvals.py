"""A person in the loop: approve or reject a tool call, or record the outcome of an interrupted one.

A tool declared ``needs_approval`` stops its turn before it runs: the job is
``waiting`` and ``record.waiting["calls"]`` lists each pending call (tool,
arguments, call id). A decision is one compare-and-set on the job's version
(:func:`pipelines.engine.transitions.supply_inputs`): of two people deciding the
same call at once exactly one wins, and the other is told who did. The
decision is bound to the exact arguments shown and lives in that turn's
checkpoint, next to the call's ledger entry: once the call has run, its
journaled result is what a retry reuses, so an approved call cannot run
twice, and the next turn starts with no approvals at all. When a turn waits
on several calls, the job goes on once each is decided.
"""

from __future__ import annotations

from typing import Any

from adapters.base import Scheduler, Storage
from phases import journal
from phases.tool_runner import arguments_digest
from phases.tool_runner.calls import check_message_size
from phases.tools import result_content
from pipelines.engine import transitions, writer
from pipelines.engine.control import load_job
from pipelines.engine.errors import InvalidInputError, JobConflictError, StaleVersionError
from pipelines.engine.events import make_event
from pipelines.engine.models import JobRecord, JobStatus, JSONValue, detached

__all__ = ["approve", "pending_calls", "pending_calls_of", "record_tool_result", "reject"]

_TRIES = 20  # a version that moved for another reason (another call decided) is read again


def _entries(record: JobRecord) -> dict[str, JSONValue]:
    cp = record.checkpoint
    return {} if cp is None else {**cp.inputs, **cp.journal}


def _turn_call(record: JobRecord, call_id: str) -> dict[str, Any]:
    """The tool call ``call_id`` of the job's open turn (from its journaled model answer)."""
    for call in journal.model_calls(_entries(record)):
        if call.get("id") == call_id:
            return call
    raise InvalidInputError(f"job {record.job_id!r} has no tool call {call_id!r} in its current turn")


def pending_calls(job_id: str, *, storage: Storage) -> list[dict[str, Any]]:
    """The calls a waiting job still needs a decision on: ``[{"call_id", "tool", "arguments"}]``."""
    return pending_calls_of(load_job(storage, job_id))


def pending_calls_of(record: JobRecord) -> list[dict[str, Any]]:
    """The calls ``record`` (a waiting job) still needs a decision on, each with the ``digest`` of what it asks
    (pass it to :func:`approve` / :func:`reject` to decide on exactly what was shown)."""
    if record.status is not JobStatus.WAITING or record.waiting is None or record.checkpoint is None:
        return []
    entries = _entries(record)
    calls = {c.get("id"): c for c in journal.model_calls(entries)}
    return [{**c, **({"digest": arguments_digest(calls[c.get("call_id")])} if c.get("call_id") in calls else {})}
            for c in record.waiting.get("calls") or [] if journal.approval_key(str(c.get("call_id"))) not in entries]


def approve(job_id: str, call_id: str, *, digest: str | None = None, storage: Storage,
            scheduler: Scheduler) -> JobRecord:
    """Approve the waiting call ``call_id`` with the arguments it was shown with; the job goes on.

    ``digest`` (a pending call's, see :func:`pending_calls_of`): refused with
    :class:`JobConflictError` when the call now pending under that id asks something else (the job was
    retried meanwhile, and the new turn's call got the same id).
    """
    return _decide(job_id, call_id, {"decision": "approved"}, storage, scheduler, digest)


def reject(job_id: str, call_id: str, *, reason: str, digest: str | None = None, storage: Storage,
           scheduler: Scheduler) -> JobRecord:
    """Reject the waiting call ``call_id``; the model gets ``reason`` as the tool's result and goes on.

    ``digest``: as for :func:`approve`.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInputError("reject needs a non-empty reason; the model reads it")
    return _decide(job_id, call_id, {"decision": "rejected", "reason": reason}, storage, scheduler, digest)


def _check_decidable(record: JobRecord, call_id: str) -> dict[str, Any]:
    job_id = record.job_id
    waiting = record.waiting or {}
    entries = _entries(record)
    earlier = entries.get(journal.approval_key(call_id))
    if isinstance(earlier, dict):
        raise JobConflictError(f"call {call_id!r} of job {job_id!r} was already {earlier.get('decision')} "
                               "(by another caller); nothing changed")
    if record.status is not JobStatus.WAITING or waiting.get("kind") != "approval":
        raise JobConflictError(f"job {job_id!r} is {record.status.value}, not waiting for an approval")
    if call_id not in {c.get("call_id") for c in waiting.get("calls") or []}:
        raise InvalidInputError(f"job {job_id!r} is not waiting for an approval of call {call_id!r}")
    return _turn_call(record, call_id)


def _decide(job_id: str, call_id: str, decision: dict[str, Any], storage: Storage,
            scheduler: Scheduler, digest: str | None = None) -> JobRecord:
    for _ in range(_TRIES):
        record = load_job(storage, job_id)
        call = _check_decidable(record, call_id)
        entry = {**decision, "digest": arguments_digest(call)}
        if digest is not None and digest != entry["digest"]:
            raise JobConflictError(f"call {call_id!r} of job {job_id!r} now asks something other than what was "
                                   "shown (the job ran that turn again); nothing decided: look at it again")
        left = [c for c in pending_calls_of(record) if c.get("call_id") != call_id]
        now = scheduler.now()
        event = make_event(f"call_{decision['decision']}", now, phase=_phase(record), call_id=call_id,
                           tool=(call.get("function") or {}).get("name"), **({"reason": decision["reason"]}
                                                                            if "reason" in decision else {}),
                           pending=len(left))  # calls still waiting: a stream reader ends its message here if any
        # The job goes on once every call it waits on is decided.
        commit = transitions.supply_inputs(record, {journal.approval_key(call_id): entry}, resume=not left,
                                           now=now, why=f"call {call_id} {decision['decision']}", event=event)
        try:
            writer.apply(storage, scheduler, commit)
        except StaleVersionError:
            continue  # someone else wrote first: read again (and lose cleanly if it was this call)
        return detached(commit.record)  # the caller's own: storage may keep the committed object
    raise JobConflictError(f"job {job_id!r} kept changing while call {call_id!r} was being decided; try again")


def _phase(record: JobRecord) -> str | None:
    return record.checkpoint.next_phase if record.checkpoint is not None else None


def record_tool_result(job_id: str, call_id: str, result: Any, *, storage: Storage,
                       scheduler: Scheduler) -> JobRecord:
    """Record the outcome of a tool call that was interrupted mid-call, as a person found it.

    For tools whose ``on_interrupted`` is ``"ask"`` (the job is ``waiting``)
    the job goes on at once; for ``"fail"`` (the job is in ``error``) retry it
    afterwards with ``retry_mode="resume"``. ``result`` becomes the tool
    message the model sees (one too large to store raises
    :class:`~pipelines.engine.errors.ValueTooLargeError`). A call that already has a result, or that waits
    for an approval, is refused: a recorded outcome never replaces a real one.
    """
    content = result_content(result)
    # Refused here, naming the call: a result that fits the journal and not the transcript would fail the
    # job's next commit, and every resume after it.
    check_message_size({"id": call_id}, content)
    for _ in range(_TRIES):
        record = load_job(storage, job_id)
        _check_recordable(record, call_id)
        now = scheduler.now()
        resume = record.status is JobStatus.WAITING
        event = make_event("tool_result_recorded", now, phase=_phase(record), call_id=call_id)
        commit = transitions.supply_inputs(record, {journal.tool_key(call_id): content}, resume=resume, now=now,
                                           why=f"outcome of {call_id} recorded", event=event)
        try:
            writer.apply(storage, scheduler, commit)
        except StaleVersionError:
            continue
        return detached(commit.record)  # the caller's own: storage may keep the committed object
    raise JobConflictError(f"job {job_id!r} kept changing while a result of {call_id!r} was recorded; try again")


def _check_recordable(record: JobRecord, call_id: str) -> None:
    job_id = record.job_id
    if record.status not in (JobStatus.WAITING, JobStatus.ERROR) or record.checkpoint is None:
        raise JobConflictError(f"job {job_id!r} is {record.status.value}; only a waiting or failed job takes a result")
    _turn_call(record, call_id)
    if journal.tool_key(call_id) in _entries(record):
        raise JobConflictError(f"call {call_id!r} of job {job_id!r} already has a result; it is not replaced")
    if any(c.get("call_id") == call_id for c in pending_calls_of(record)):
        raise JobConflictError(f"call {call_id!r} of job {job_id!r} awaits an approval: approve or reject it")
    started = _entries(record).get(journal.TOOLS_STARTED)
    if not isinstance(started, list) or call_id not in started:
        # Never started (another call's wait stopped the turn first): it runs when the job goes on, and what a
        # person says of it would stand in for a real run.
        raise JobConflictError(f"call {call_id!r} of job {job_id!r} was not interrupted: it never started, and runs "
                               "when the job goes on (only the outcome of a call cut off mid-call is recorded)")
