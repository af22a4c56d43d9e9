"""Starting a job: creating it, continuing a complete conversation, the two retries, and forking it at a turn."""

from __future__ import annotations

from pipelines.engine.errors import InvalidInputError, JobConflictError
from pipelines.engine.events import make_event
from pipelines.engine.models import Commit, JobRecord, JobStatus, JSONValue, Message, TurnMark
from pipelines.engine.tokens import new_token
from pipelines.engine.transitions.building import (
    ACTIVE,
    HISTORY_LIMIT,
    _commit,
    _fresh,
    _log,
    _marked,
    _moved,
    _running,
)

__all__ = ["continue_conversation", "create", "fork", "retry_full", "retry_resume", "turn_mark"]


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
    # A start state given (by the caller's code) is the run's start from now on: a later full retry
    # without one goes back to it.
    given = {} if state is None else {"initial_state": state}
    new = _moved(rec, token, now, _fresh(first, restart_state, now), **_running(), result=None,
                 transcript_len=base, history=history, code_version=version, **given)
    return _commit(rec, new, token, truncate_to=base, keep_journal=False, clear_control=True,
                   logs=[_log(now, first, "job retried (full)")],
                   events=[make_event("job_retried", now, phase=first, mode="full")])


def turn_mark(rec: JobRecord, at_turn: object) -> TurnMark:
    """The checkpoint ``rec`` committed at turn ``at_turn``; :class:`InvalidInputError` if it is not kept."""
    if isinstance(at_turn, bool) or not isinstance(at_turn, int) or at_turn < 0:
        raise InvalidInputError(f"at_turn must be an int >= 0, got {at_turn!r}")
    for mark in rec.history:
        if mark.phases_done == at_turn:
            return mark
    kept = f"turns {_spans([m.phases_done for m in rec.history])}" if rec.history else "no turns"
    raise InvalidInputError(
        f"job {rec.job_id!r} has no checkpoint for turn {at_turn}: its record keeps {kept} (at most "
        f"{HISTORY_LIMIT} turns, pipelines.engine.transitions.HISTORY_LIMIT; a full retry drops the turns of "
        "the run it cut; older records kept none)")


def _spans(turns: list[int]) -> str:
    """``[0, 2, 3, 4]`` as ``"0, 2..4"``: the turns a record keeps, with its gaps."""
    spans: list[list[int]] = []
    for t in turns:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)


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
        # A run of the fork starts as the source's runs do (a conversation that goes on after the fork's
        # run ends, a full retry): from the source's start, not the state of the turn it was forked at.
        transcript_len=len(messages), base_transcript_len=len(messages), initial_phase=src.initial_phase or phase,
        initial_state=src.initial_state if src.initial_phase is not None else mark.state, options=options,
        phases_done=mark.phases_done, created_at=now, updated_at=now,
        history=[m for m in src.history if m.phases_done <= mark.phases_done], forked_from=src.job_id,
        # The version that wrote that turn: a newer worker migrates the fork as it did the original. Its runs
        # start as the source's do (initial state above), written by the version that started the source's.
        at_turn=mark.phases_done, code_version=mark.code_version or src.code_version, fork_request=request,
        run_code_version=src.run_code_version if src.initial_phase is not None else None,
        # As deep in its family as the source: a fork of a child starts no deeper chain than the child could.
        depth=src.depth)
    why = f"job forked from {src.job_id!r} at turn {mark.phases_done}"
    return Commit(job_id=new_job_id, expected_version=0, token=token, record=record, append_messages=messages,
                  logs=[_log(now, phase, why)],
                  events=[make_event("job_forked", now, phase=phase, forked_from=src.job_id,
                                     at_turn=mark.phases_done, pipeline=src.pipeline)])
