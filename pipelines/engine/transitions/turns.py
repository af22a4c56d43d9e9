"""The end of a turn: the commit for each phase outcome (next, done, retry later, wait, fail) and a mid-phase save."""

from __future__ import annotations

from typing import Any

from pipelines.engine.events import make_event
from pipelines.engine.models import Checkpoint, Commit, JobRecord, JobStatus, JSONValue, Message
from pipelines.engine.phase import Done, Fail, Next, PhaseOutput, RetryLater, WaitForInput
from pipelines.engine.tokens import new_token
from pipelines.engine.transitions.building import (
    CHILDREN,
    _Checkpoint,
    _commit,
    _log,
    _marked,
    _moved,
    _new_epoch,
    _phase_of,
)
from pipelines.engine.transitions.starts import continue_conversation

__all__ = ["Outcome", "after_phase", "done_and_continued", "save_state"]

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
    # The next run starts with this run's code: a full retry goes back to its start as this version wrote it.
    started = {"run_code_version": rec.code_version} if rec.code_version is not None else {}
    return more.model_copy(update={
        "expected_version": rec.version, "owner": owner,
        "record": more.record.model_copy(update={"version": rec.version + 1, **started}),
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
