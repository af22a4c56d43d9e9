"""Every state change of a job: a pure function from the current record to a :class:`Commit`.

Starting, restarting, each phase outcome, saving state mid-phase, pause,
resume, cancel and the inputs a person supplies (approvals, recorded tool
outcomes) are all built here and nowhere else, so they agree on what a
commit carries: the version moves by one, one token per commit (which is
also the new checkpoint's ``commit_id``), every transition emits its event
and its log line, and the checkpoint's ``transcript_epoch`` is drawn anew by
every creation and every commit that truncates the transcript (also by a run
that starts afresh), never carried across one: workers' transcript caches rely
on it. :func:`pipelines.engine.writer.apply` is the one function that writes a
commit, publishes its events and schedules the next advance.

Nothing here reads storage or the clock: callers pass the record they
loaded and ``now``, so each transition is tested as a plain function.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from pipelines.engine.errors import InvalidInputError, JobConflictError
from pipelines.engine.events import make_event
from pipelines.engine.models import (
    FINISHED_STATUSES,
    Checkpoint,
    Commit,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    LogLevel,
    Message,
    TurnMark,
    Usage,
    dump_json,
)
from pipelines.engine.phase import Done, Fail, Next, PhaseOutput, RetryLater, WaitForInput
from pipelines.engine.tokens import new_token

__all__ = [
    "ACTIVE",
    "FINAL",
    "FINISHED",
    "HISTORY_BYTES",
    "HISTORY_LIMIT",
    "PhaseOutput",
    "after_phase",
    "cancel",
    "child_failed",
    "children_done",
    "continue_conversation",
    "create",
    "done_and_continued",
    "create_child",
    "fork",
    "pause",
    "resume",
    "retry_full",
    "retry_resume",
    "save_state",
    "supply_inputs",
    "turn_mark",
]

ACTIVE = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
"""Statuses a restart must not touch: wait for the job, or cancel it first."""
FINAL = (JobStatus.COMPLETE, JobStatus.CANCELLED)
"""Statuses nothing but an explicit restart leaves."""
FINISHED = FINISHED_STATUSES
"""Statuses retention and ``delete`` may remove: no turn runs and no person is asked anything."""

CHILDREN = "children"
"""``record.waiting["kind"]`` of a job waiting for child jobs (see :mod:`pipelines.engine.children`)."""

HISTORY_LIMIT = 50
"""How many turns' checkpoints a record keeps (its ``history``): a fork can start at any of them."""
HISTORY_BYTES = 256 * 1024
"""At most this much state JSON in a record's history: older turns are dropped first (a large state
keeps fewer turns; a state larger than this keeps none), so the record stays far below the size limit."""


_Checkpoint = Checkpoint[Any]  # resolved once: indexing the generic costs a cache lookup per call

# --- building blocks ---------------------------------------------------------------
def _log(now: float, phase: str | None, message: str, level: LogLevel = "info") -> LogEntry:
    return LogEntry(timestamp=now, phase=phase, level=level, message=message)


def _phase_of(rec: JobRecord) -> str | None:
    return rec.checkpoint.next_phase if rec.checkpoint is not None else None


def _moved(rec: JobRecord, token: str, now: float, cp: Checkpoint[Any] | None, *, stamped: bool = False,
           **fields: Any) -> JobRecord:
    """``rec`` one version on, with ``cp`` stamped by this commit's token (``stamped``: built so already)."""
    if cp is not None and not stamped:
        cp = cp.model_copy(update={"commit_id": token, "updated_at": now, "journal": {}})
    return rec.model_copy(update={**fields, "checkpoint": cp, "version": rec.version + 1, "updated_at": now})


def _commit(rec: JobRecord, new: JobRecord, token: str, *, owner: str | None = None,
            logs: Sequence[LogEntry] = (), events: Sequence[Event] = (), messages: Sequence[Message] = (),
            keep_journal: bool = True, release_lease: bool = True, truncate_to: int | None = None,
            clear_control: bool = False, take_inbox: int = 0) -> Commit:
    if clear_control:
        new = new.model_copy(update={"control": None})  # the record returned says what storage now holds
    if truncate_to is not None and new.checkpoint is not None:
        # Whatever a worker holds of the transcript may be gone: it must not read on from it.
        new = new.model_copy(update={"checkpoint": new.checkpoint.model_copy(
            update={"transcript_epoch": _new_epoch()})})
    return Commit(job_id=rec.job_id, expected_version=rec.version, owner=owner, token=token, record=new,
                  append_messages=list(messages), truncate_messages_to=truncate_to, logs=list(logs),
                  events=list(events), keep_journal=keep_journal, release_lease=release_lease,
                  clear_control=clear_control, take_inbox=take_inbox)


def _new_epoch() -> str:
    """A transcript epoch (``Checkpoint.transcript_epoch``): random, so a job re-created under the same id
    never gets its predecessor's, whichever process creates it."""
    return os.urandom(8).hex()


def _fresh(phase: str, state: Any, now: float) -> Checkpoint[Any]:
    # A new epoch: a fresh checkpoint starts a job, a fork, a continued run or a truncating retry.
    return _Checkpoint(next_phase=phase, state=state, due_at=now, created_at=now, updated_at=now,
                       transcript_epoch=_new_epoch())


def _running() -> dict[str, Any]:
    return {"status": JobStatus.RUNNING, "error": None, "waiting": None, "stop_reason": None}


def _marked(history: Sequence[TurnMark], *, phases_done: int, transcript_len: int, next_phase: str | None,
            state: Any, code_version: str | None = None) -> list[TurnMark]:
    """``history`` with this turn's checkpoint appended, cut to the newest that fit both bounds."""
    try:
        text = dump_json(state, "state")
    except (InvalidInputError, ValueError):
        return list(history)  # the commit itself refuses this state and says why; no mark for it
    # The mark keeps its own copy, read back from its JSON: the phase's state object lives on (the
    # next turn's ctx.state, under continue_for), and changing it in place must not change this turn's mark.
    kept = [*history, TurnMark(phases_done=phases_done, transcript_len=transcript_len, next_phase=next_phase,
                               state=from_json(text), size=len(text) if text.isascii() else len(text.encode()),
                               code_version=code_version)][-HISTORY_LIMIT:]
    total = sum(m.size for m in kept)
    while kept and total > HISTORY_BYTES:
        total -= kept.pop(0).size
    return kept


# --- starting and restarting ---------------------------------------------------------
def create(job_id: str, *, pipeline: str, first: str, state: JSONValue, messages: list[Message],
           options: dict[str, JSONValue], now: float, trace: dict[str, str] | None = None) -> Commit:
    """A new job at ``first`` (``expected_version`` 0: storage creates it, or refuses a taken id)."""
    token = new_token()
    cp = _fresh(first, state, now).model_copy(update={"commit_id": token})
    history = _marked((), phases_done=0, transcript_len=len(messages), next_phase=first, state=state)
    record = JobRecord(job_id=job_id, pipeline=pipeline, status=JobStatus.RUNNING, checkpoint=cp, version=1,
                       transcript_len=len(messages), base_transcript_len=len(messages), initial_phase=first,
                       initial_state=state, options=options, created_at=now, updated_at=now, history=history,
                       trace=trace)
    return Commit(job_id=job_id, expected_version=0, token=token, record=record, append_messages=messages,
                  logs=[_log(now, first, "job started")],
                  events=[make_event("job_started", now, phase=first, pipeline=pipeline)])


def _check_restartable(rec: JobRecord) -> None:
    if rec.status in ACTIVE:
        raise JobConflictError(
            f"job {rec.job_id!r} is {rec.status.value}; wait for it, or cancel it before a retry")


def continue_conversation(rec: JobRecord, *, first: str, state: JSONValue, messages: list[Message],
                          pipeline: str, options: dict[str, JSONValue], now: float) -> Commit:
    """A complete job goes on: the transcript is kept and ``messages`` are appended to it."""
    if rec.status is not JobStatus.COMPLETE:
        raise JobConflictError(
            f"job {rec.job_id!r} is {rec.status.value}; new messages only continue a complete job")
    token = new_token()
    tlen = rec.transcript_len + len(messages)
    new = _moved(rec, token, now, _fresh(first, state, now), **_running(), result=None, transcript_len=tlen,
                 base_transcript_len=tlen, initial_phase=first, initial_state=state, pipeline=pipeline,
                 options=options)
    return _commit(rec, new, token, messages=messages, keep_journal=False, clear_control=True,
                   logs=[_log(now, first, "job continued with new messages")],
                   events=[make_event("job_continued", now, phase=first)])


def retry_resume(rec: JobRecord, *, now: float) -> Commit:
    """A failed or cancelled job runs again from its kept checkpoint; journaled steps are not repeated."""
    _check_restartable(rec)
    if rec.checkpoint is None:
        raise JobConflictError(f"job {rec.job_id!r} is {rec.status.value} with no checkpoint; nothing to resume")
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"attempt": rec.checkpoint.attempt + 1, "due_at": now})
    new = _moved(rec, token, now, cp, **_running())
    return _commit(rec, new, token, clear_control=True,
                   logs=[_log(now, cp.next_phase, f"job retried (resume) at phase {cp.next_phase!r}")],
                   events=[make_event("job_retried", now, phase=cp.next_phase, mode="resume")])


def retry_full(rec: JobRecord, *, first: str, state: JSONValue, now: float) -> Commit:
    """Restart from ``first`` and ``state`` (else the stored initial state), cutting the transcript back (I4)."""
    _check_restartable(rec)
    token = new_token()
    restart_state = state if state is not None else rec.initial_state
    base = rec.base_transcript_len
    # Turns past the cut are gone from the transcript: a fork must not start from them.
    history = [m for m in rec.history if m.transcript_len <= base]
    # The transcript and state go back to the run's start, as the version that started it wrote them
    # (or that wrote the last turn kept): a newer worker migrates them again, view included.
    version = rec.run_code_version or (history[-1].code_version if history else None) or rec.code_version
    new = _moved(rec, token, now, _fresh(first, restart_state, now), **_running(), result=None,
                 transcript_len=base, history=history, code_version=version)
    return _commit(rec, new, token, truncate_to=base, keep_journal=False, clear_control=True,
                   logs=[_log(now, first, "job retried (full)")],
                   events=[make_event("job_retried", now, phase=first, mode="full")])


# --- phase outcomes --------------------------------------------------------------------
Outcome = Next | Done | Fail | RetryLater | WaitForInput


def after_phase(rec: JobRecord, outcome: Outcome, out: PhaseOutput, *, owner: str, now: float,
                keep_lease: bool = False) -> Commit:
    """The commit that ends a phase with ``outcome`` (the phase ran under ``owner``'s lease)."""
    if isinstance(outcome, Next):
        return _on_next(rec, outcome, out, owner, now, keep_lease)
    if isinstance(outcome, Done):
        return _on_done(rec, outcome, out, owner, now)
    if isinstance(outcome, RetryLater):
        return _on_retry_later(rec, outcome, out, owner, now)
    if isinstance(outcome, WaitForInput):
        return _on_wait(rec, outcome, out, owner, now)
    return _on_fail(rec, outcome, out, owner, now)


def _kept(rec: JobRecord, out: PhaseOutput, **update: Any) -> Checkpoint[Any]:
    """The open checkpoint, kept with its journal (and the keys whose usage is now counted)."""
    assert rec.checkpoint is not None
    counted = [*rec.checkpoint.usage_counted, *(k for k in out.usage_keys if k not in rec.checkpoint.usage_counted)]
    return rec.checkpoint.model_copy(update={"usage_counted": counted, **update})


def _on_next(rec: JobRecord, outcome: Next, out: PhaseOutput, owner: str, now: float, keep_lease: bool) -> Commit:
    assert rec.checkpoint is not None
    token = new_token()
    tlen = rec.transcript_len + len(out.messages)
    # The transcript only grows here: same epoch (a record from before epochs gets one from this commit on).
    cp = _Checkpoint(next_phase=outcome.next_phase, state=outcome.state, due_at=now + outcome.delay,
                     created_at=now, updated_at=now, commit_id=token,
                     transcript_epoch=rec.checkpoint.transcript_epoch or _new_epoch())
    history = _marked(rec.history, phases_done=rec.phases_done + 1, transcript_len=tlen,
                      next_phase=outcome.next_phase, state=outcome.state, code_version=rec.code_version)
    new = _moved(rec, token, now, cp, stamped=True, transcript_len=tlen, usage=rec.usage + out.usage,
                 phases_done=rec.phases_done + 1, history=history)
    # The lease is kept only to run the next phase at once (the runner's continue_for).
    return _commit(rec, new, token, owner=owner, messages=out.messages, logs=out.logs, events=out.events,
                   keep_journal=False, release_lease=not (keep_lease and outcome.delay == 0),
                   take_inbox=out.take_inbox)


def _on_done(rec: JobRecord, outcome: Done, out: PhaseOutput, owner: str, now: float) -> Commit:
    phase = _phase_of(rec)
    token = new_token()
    reason = outcome.reason or "done"
    tlen = rec.transcript_len + len(out.messages)
    history = _marked(rec.history, phases_done=rec.phases_done + 1, transcript_len=tlen, next_phase=None,
                      state=rec.checkpoint.state if rec.checkpoint is not None else None,
                      code_version=rec.code_version)
    new = _moved(rec, token, now, None, status=JobStatus.COMPLETE, result=outcome.result, stop_reason=reason,
                 transcript_len=tlen, usage=rec.usage + out.usage, phases_done=rec.phases_done + 1,
                 history=history)
    commit = _commit(rec, new, token, owner=owner, messages=out.messages, keep_journal=False, clear_control=True,
                     take_inbox=out.take_inbox,
                     logs=[*out.logs, _log(now, phase, "job complete")],
                     events=[*out.events, make_event("job_finished", now, phase=phase, reason=reason)])
    # Storage refuses it while messages this turn did not take wait: see done_and_continued.
    commit.ends_run = True
    return commit


def done_and_continued(rec: JobRecord, outcome: Done, out: PhaseOutput, messages: list[Message], *, owner: str,
                       now: float) -> Commit:
    """The run ends with ``outcome`` and the conversation goes on with ``messages``, in one commit.

    The last turn's commit when messages were sent while it ran (its
    ``ends_run`` commit was refused): ``messages`` are those after the ones
    the turn took (``out.take_inbox``), and this commit takes them too. One
    commit, so no crash can leave a complete job with messages nobody reads.
    """
    done = _on_done(rec, outcome, out, owner, now)
    if rec.initial_phase is None:  # a record from before runs kept their start: the next run takes them first
        return done.model_copy(update={"ends_run": False})
    more = continue_conversation(done.record, first=rec.initial_phase, state=rec.initial_state, messages=messages,
                                 pipeline=rec.pipeline, options=rec.options, now=now)
    return more.model_copy(update={
        "expected_version": rec.version, "owner": owner,
        "record": more.record.model_copy(update={"version": rec.version + 1}),
        "append_messages": [*done.append_messages, *more.append_messages],
        "logs": [*done.logs, *more.logs], "events": [*done.events, *more.events],
        "take_inbox": out.take_inbox + len(messages)})


def _on_retry_later(rec: JobRecord, outcome: RetryLater, out: PhaseOutput, owner: str, now: float) -> Commit:
    # Same phase again later; journaled steps survive so they are not repeated.
    assert rec.checkpoint is not None
    token = new_token()
    cp = _kept(rec, out, attempt=rec.checkpoint.attempt + 1, due_at=now + outcome.delay)
    new = _moved(rec, token, now, cp, usage=rec.usage + out.usage)
    phase = cp.next_phase
    return _commit(rec, new, token, owner=owner,
                   logs=[*out.logs, _log(now, phase, f"retrying phase in {outcome.delay:.1f}s: {outcome}", "warn")],
                   events=[make_event("retry_scheduled", now, phase=phase, delay=outcome.delay, reason=str(outcome))])


def _on_wait(rec: JobRecord, outcome: WaitForInput, out: PhaseOutput, owner: str, now: float) -> Commit:
    token = new_token()
    cp = _kept(rec, out)
    waiting = {**outcome.details, "reason": outcome.reason, "call_id": outcome.call_id}
    new = _moved(rec, token, now, cp, status=JobStatus.WAITING, waiting=waiting, usage=rec.usage + out.usage,
                 children=_with_children(rec.children, outcome.details))
    kind = "approval_requested" if outcome.details.get("kind") == "approval" else "job_waiting"
    return _commit(rec, new, token, owner=owner,
                   logs=[*out.logs, _log(now, cp.next_phase, f"waiting: {outcome.reason}", "warn")],
                   events=[make_event(kind, now, phase=cp.next_phase, **{**outcome.details, "reason": outcome.reason})])


def _with_children(known: list[str], details: dict[str, Any]) -> list[str]:
    """``known`` plus the child jobs a wait for children names (the parent's side of the lineage)."""
    if details.get("kind") != CHILDREN:
        return known
    started = [str(c.get("child")) for c in details.get("calls") or [] if isinstance(c, dict) and c.get("child")]
    return [*known, *(c for c in started if c not in known)]


def _on_fail(rec: JobRecord, outcome: Fail, out: PhaseOutput, owner: str | None, now: float) -> Commit:
    # The last good checkpoint stays, journal included, for a "resume" retry (I9);
    # the model calls the failed attempt paid for are counted all the same.
    token = new_token()
    cp = _kept(rec, out) if rec.checkpoint is not None else None
    new = _moved(rec, token, now, cp, status=JobStatus.ERROR, error=outcome.error, usage=rec.usage + out.usage)
    phase = _phase_of(rec)
    return _commit(rec, new, token, owner=owner, clear_control=True,
                   logs=[*out.logs, _log(now, phase, outcome.error, "error")],
                   events=[make_event("job_failed", now, phase=phase, error=outcome.error)])


def save_state(rec: JobRecord, state: JSONValue, *, owner: str, now: float) -> Commit:
    """Persist ``state`` mid-phase: same phase, journal and lease kept."""
    assert rec.checkpoint is not None
    token = new_token()
    new = _moved(rec, token, now, rec.checkpoint.model_copy(update={"state": state}))
    return _commit(rec, new, token, owner=owner, release_lease=False)


# --- operators and people --------------------------------------------------------------------
def pause(rec: JobRecord, *, owner: str, now: float) -> Commit:
    """A running job stops at this turn boundary (the caller holds the lease: no turn is in flight)."""
    if rec.status is not JobStatus.RUNNING:
        raise JobConflictError(f"job {rec.job_id!r} is {rec.status.value}; only a running job can be paused")
    token = new_token()
    new = _moved(rec, token, now, rec.checkpoint, status=JobStatus.PAUSED)
    phase = _phase_of(rec)
    return _commit(rec, new, token, owner=owner, clear_control=True, logs=[_log(now, phase, "job paused")],
                   events=[make_event("job_paused", now, phase=phase)])


def resume(rec: JobRecord, *, now: float) -> Commit:
    """A paused job runs again from its checkpoint, due now (no turn can be in flight: no lease needed)."""
    if rec.status is not JobStatus.PAUSED:
        raise JobConflictError(f"job {rec.job_id!r} is {rec.status.value}; only a paused job can be resumed")
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"due_at": now}) if rec.checkpoint is not None else None
    new = _moved(rec, token, now, cp, status=JobStatus.RUNNING)
    phase = _phase_of(rec)
    return _commit(rec, new, token, clear_control=True, logs=[_log(now, phase, "job resumed")],
                   events=[make_event("job_resumed", now, phase=phase)])


def cancel(rec: JobRecord, *, owner: str | None, now: float, forced: bool = False) -> Commit:
    """The job is cancelled, its checkpoint kept. ``owner=None`` fences off a turn in flight (force)."""
    if rec.status in FINAL:
        raise JobConflictError(f"job {rec.job_id!r} is already {rec.status.value}; nothing to cancel")
    token = new_token()
    new = _moved(rec, token, now, rec.checkpoint, status=JobStatus.CANCELLED, waiting=None)
    phase = _phase_of(rec)
    why = "job cancelled" + (" (forced: a turn in flight was discarded)" if forced else "")
    return _commit(rec, new, token, owner=owner, release_lease=owner is not None, clear_control=True,
                   logs=[_log(now, phase, why, "warn")], events=[make_event("job_cancelled", now, phase=phase)])


def supply_inputs(rec: JobRecord, entries: dict[str, JSONValue], *, resume: bool, now: float, why: str,
                  event: Event) -> Commit:
    """Add what a person supplied to the open checkpoint, optionally setting the job running again.

    Fenced on the version only: the job is waiting or failed, so no turn is in
    flight, and two people acting at once cannot both win (the loser's commit
    expects a version that has moved on).
    """
    assert rec.checkpoint is not None
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"inputs": {**rec.checkpoint.inputs, **entries}})
    if resume:
        new = _moved(rec, token, now, cp.model_copy(update={"due_at": now}), **_running())
    else:
        new = _moved(rec, token, now, cp)
    return _commit(rec, new, token, logs=[_log(now, cp.next_phase, why)], events=[event])


# --- child runs (pipelines.engine.children) ---------------------------------------------------
def create_child(job_id: str, *, parent_job: str, parent_call: str, pipeline: str, first: str, state: JSONValue,
                 messages: list[Message], options: dict[str, JSONValue], now: float, depth: int = 1) -> Commit:
    """A new job started by the call ``parent_call`` of ``parent_job``, ``depth`` parents below its family's
    root; its record names both (the ownership ``start_child`` checks when it finds the job again)."""
    commit = create(job_id, pipeline=pipeline, first=first, state=state, messages=messages, options=options, now=now)
    record = commit.record.model_copy(update={"parent_job": parent_job, "parent_call": parent_call, "depth": depth})
    event = make_event("job_started", now, phase=first, pipeline=pipeline, parent_job=parent_job,
                       parent_call=parent_call)
    return commit.model_copy(update={"record": record, "events": [event]})


def children_done(rec: JobRecord, entries: dict[str, JSONValue], usage: Usage, *, owner: str, now: float) -> Commit:
    """A job waiting for its children runs again, their outcomes in its open checkpoint and their usage in its own.

    ``entries`` land in the checkpoint's ``inputs`` (``tool:<call id>`` is what
    the model reads), so the woken turn reuses them instead of calling again;
    the usage is added once, by this compare-and-set. The caller holds the
    lease (``owner``) and keeps it to run the turn at once.
    """
    assert rec.checkpoint is not None
    token = new_token()
    cp = rec.checkpoint.model_copy(update={"inputs": {**rec.checkpoint.inputs, **entries}, "due_at": now})
    new = _moved(rec, token, now, cp, **_running(), usage=rec.usage + usage)
    phase = cp.next_phase
    calls = sorted(k.removeprefix("child:") for k in entries if k.startswith("child:"))
    return _commit(rec, new, token, owner=owner, release_lease=False,
                   logs=[_log(now, phase, f"child jobs finished: {', '.join(calls)}")],
                   events=[make_event("children_finished", now, phase=phase, calls=calls)])


def child_failed(rec: JobRecord, error: str, usage: Usage, *, owner: str, now: float) -> Commit:
    """A job waiting for its children fails because one failed (``on_child_error="fail"``); checkpoint kept."""
    return _on_fail(rec, Fail(error), PhaseOutput(usage=usage), owner, now)


# --- forks -----------------------------------------------------------------------------------
def turn_mark(rec: JobRecord, at_turn: object) -> TurnMark:
    """The checkpoint ``rec`` committed at turn ``at_turn``; :class:`InvalidInputError` if it is not kept."""
    if isinstance(at_turn, bool) or not isinstance(at_turn, int) or at_turn < 0:
        raise InvalidInputError(f"at_turn must be an int >= 0, got {at_turn!r}")
    for mark in rec.history:
        if mark.phases_done == at_turn:
            return mark
    kept = f"turns {rec.history[0].phases_done}..{rec.history[-1].phases_done}" if rec.history else "no turns"
    raise InvalidInputError(
        f"job {rec.job_id!r} has no checkpoint for turn {at_turn}: its record keeps {kept} (at most "
        f"{HISTORY_LIMIT} turns, pipelines.engine.transitions.HISTORY_LIMIT; older records kept none)")


def fork(src: JobRecord, mark: TurnMark, *, new_job_id: str, messages: list[Message],
         options: dict[str, JSONValue], run: bool, now: float, request: str | None = None) -> Commit:
    """A new job ``new_job_id`` that goes on from ``src`` as it was after the turn ``mark`` (``src`` untouched).

    ``messages`` are the first ``mark.transcript_len`` messages of ``src``. The
    fork is paused (``run``: running, due now) at the phase that was next; a
    turn that ended the job gives a complete fork (continue it with new
    messages). Its history is ``src``'s up to that turn, so forks fork too.
    ``request`` (what was asked, see ``App.fork``) is kept on the record.
    """
    token = new_token()
    phase = mark.next_phase
    cp = None if phase is None else _fresh(phase, mark.state, now).model_copy(update={"commit_id": token})
    status = JobStatus.COMPLETE if cp is None else (JobStatus.RUNNING if run else JobStatus.PAUSED)
    same_end = cp is None and src.status is JobStatus.COMPLETE and mark.phases_done == src.phases_done
    record = JobRecord(
        job_id=new_job_id, pipeline=src.pipeline, status=status, checkpoint=cp, version=1,
        result=src.result if same_end else None, stop_reason=src.stop_reason if same_end else None,
        transcript_len=len(messages), base_transcript_len=len(messages), initial_phase=phase or src.initial_phase,
        initial_state=mark.state, options=options, phases_done=mark.phases_done, created_at=now, updated_at=now,
        history=[m for m in src.history if m.phases_done <= mark.phases_done], forked_from=src.job_id,
        # The version that wrote that turn: a newer worker migrates the fork as it did the original.
        at_turn=mark.phases_done, code_version=mark.code_version or src.code_version, fork_request=request)
    why = f"job forked from {src.job_id!r} at turn {mark.phases_done}"
    return Commit(job_id=new_job_id, expected_version=0, token=token, record=record, append_messages=messages,
                  logs=[_log(now, phase, why)],
                  events=[make_event("job_forked", now, phase=phase, forked_from=src.job_id,
                                     at_turn=mark.phases_done, pipeline=src.pipeline)])


# --- applying -------------------------------------------------------------------------------
