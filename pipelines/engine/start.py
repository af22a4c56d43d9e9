"""Starting jobs: write a new job (or restart one) and enqueue its first advance.

Nothing here runs a phase; ``pipelines.engine.runner`` does. The commits come from
:mod:`pipelines.engine.transitions`. Bad input raises before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

import pipelines.engine.models as models  # MAX_VALUE_BYTES is a setting, read at each check
from adapters.base import Scheduler, Storage
from pipelines.engine import children, telemetry, transitions, versions, writer
from pipelines.engine.errors import (
    InvalidInputError,
    InvalidPipelineError,
    JobConflictError,
    JobNotFoundError,
    StaleVersionError,
    ValueTooLargeError,
    validation_summary,
)
from pipelines.engine.models import (
    Commit,
    JobRecord,
    JobStatus,
    JSONValue,
    Message,
    check_messages,
    dump_json,
    owned_json_value,
    validate_job_id,
)
from pipelines.engine.phase import Pipeline

__all__ = ["RETRY_MODES", "RetryMode", "check_retry_mode", "start_job"]

RetryMode = Literal["resume", "full"]
"""How a failed or cancelled job runs again: from its kept checkpoint, or from the start."""
RETRY_MODES: tuple[str, ...] = ("resume", "full")


def check_retry_mode(mode: object, *, optional: bool = True, name: str = "retry_mode") -> RetryMode | None:
    """``mode`` if it is a retry mode (or ``None`` when optional), else :class:`InvalidInputError`."""
    if mode is None and optional:
        return None
    if isinstance(mode, bool) or mode not in RETRY_MODES:
        allowed = "None, 'resume' or 'full'" if optional else "'resume' or 'full'"
        raise InvalidInputError(f"{name} must be {allowed}, got {mode!r}")
    return mode  # type: ignore[return-value]


def _initial_state(job_id: str, model: type[BaseModel] | None, state: Any) -> JSONValue:
    """``state`` in stored form, checked against the state model the first phase sees."""
    if isinstance(state, BaseModel) and model is None:
        # Stored as a dict, it would come back to the phases as a dict: say so now.
        raise InvalidInputError(
            f"initial_state of job {job_id!r} is a {type(state).__name__}, but the pipeline declares no state "
            f"model, so its phases would get a dict back; declare it: Pipeline(phases=[...], "
            f"state={type(state).__name__}) or run_pipeline(..., state_model={type(state).__name__})")
    if model is not None and isinstance(state, BaseModel) and not isinstance(state, model):
        raise InvalidInputError(f"initial_state of job {job_id!r} must be a {model.__name__}, "
                                f"got {type(state).__name__}")
    if model is not None and state is not None and not isinstance(state, model):
        try:  # checked now, as the first phase will read it: not a job that fails at its first turn
            model.model_validate(state)
        except ValidationError as exc:
            raise InvalidInputError(f"initial_state of job {job_id!r} does not validate against {model.__name__}: "
                                    f"{validation_summary(exc)}") from None
    # The engine's own copy: a record a storage keeps as it is (a retry's, a continued run's) must not
    # change when the caller changes the dict it passed.
    owned = owned_json_value(state, what=f"initial_state of job {job_id!r}")
    # The record keeps it twice (where a full retry goes back to, and the state now): said as the caller's value,
    # not as "the record is 13 MiB" for a state of 7.
    text, limit = dump_json(owned, f"initial_state of job {job_id!r}"), models.MAX_VALUE_BYTES
    room = (limit - models.STEP_ENVELOPE) // 2  # the record's other fields take some room too
    if len(text) * 4 > room and (size := len(text.encode())) > room:
        raise ValueTooLargeError(
            f"initial_state of job {job_id!r} is {size:,} bytes of JSON; its record keeps it twice (where a full "
            f"retry starts, and the state now) with its other fields within the {_size(limit)} limit: at most "
            f"{room:,} bytes (pipelines.engine.models.MAX_VALUE_BYTES); keep large data outside the state")
    return owned


def _size(n: int) -> str:
    return f"{n / 1048576:.1f} MiB" if n >= 1048576 else f"{n / 1024:.0f} KiB"


def _fresh_state(job_id: str, model: type[BaseModel] | None, state: JSONValue) -> JSONValue:
    """A new job's start state: ``state``, or the state model's defaults when none was given."""
    if state is not None or model is None:
        return state
    try:
        return owned_json_value(model(), what=f"initial_state of job {job_id!r}")
    except ValidationError as exc:
        raise InvalidInputError(f"job {job_id!r} needs an initial_state: the first phase reads a {model.__name__}, "
                                f"which has required fields ({validation_summary(exc)})") from None


def _continued(storage: Storage, rec: JobRecord, *, first: str, state: JSONValue, messages: list[Message],
               pipeline: str, options: dict[str, JSONValue], now: float) -> Commit:
    """The commit that continues a complete conversation with ``messages``.

    A complete job's inbox is empty (a run's end is refused past it), except
    one ended by a version before that check: what was sent to it then goes
    first, in the order sent, and leaves the inbox in this same commit.
    """
    left = storage.inbox(rec.job_id, rec.inbox) if rec.inbox > 0 else []
    commit = transitions.continue_conversation(rec, first=first, state=state, messages=[*left, *messages],
                                               pipeline=pipeline, options=options, now=now)
    return commit.model_copy(update={"take_inbox": len(left)}) if left else commit


def _refuse_start(existing: JobRecord, name: str, new_messages: list[Message], *, continue_completed: bool,
                  retry_mode: RetryMode | None) -> None:
    """Raise :class:`JobConflictError` for a start that may not land on ``existing`` (nothing written)."""
    job_id = existing.job_id
    if existing.pipeline != name:
        # A job id names one pipeline or agent for its life: taking it over would cut another's transcript
        # back and run it with phases it never had (or hand one agent's conversation to another).
        raise JobConflictError(f"job {job_id!r} is a job of {existing.pipeline!r}, not {name!r}: a job id "
                               "belongs to one pipeline or agent; use another id (or delete that job first)")
    complete = existing.status is JobStatus.COMPLETE and retry_mode is None
    if complete and continue_completed:
        if not new_messages and not existing.inbox:
            # Nothing new to answer: a new run would only ask the model again what it has answered.
            raise JobConflictError(f"job {job_id!r} is complete: continue the conversation with new messages "
                                   "(user=... or messages=[...]), or run it again with retry_mode='full'")
    elif new_messages:
        raise JobConflictError(
            f"job {job_id!r} exists ({existing.status.value}); new messages only continue a complete job")
    elif complete:
        # A repeated start (a retried web request, say) must not run a finished job's effects again.
        raise JobConflictError(f"job {job_id!r} is complete; run it again with retry_mode='full'")


def start_job(
    *,
    job_id: str,
    pipeline: Pipeline,
    name: str,
    storage: Storage,
    scheduler: Scheduler,
    initial_state: Any = None,
    retry_mode: RetryMode | None = None,
    initial_phase: str | None = None,
    messages: Sequence[Message] = (),
    continue_completed: bool = False,
    options: dict[str, JSONValue] | None = None,
) -> JobRecord:
    """Create, retry or continue the job ``job_id`` of ``pipeline`` (registered as ``name``); enqueue it.

    A new job starts at ``initial_phase`` (default: the first phase). For a
    job in ``error`` or ``cancelled``, ``retry_mode="resume"`` (the default
    when it has a checkpoint) goes on from the checkpoint; ``"full"``
    restarts from the first phase and ``initial_state``, cutting the
    transcript back to where this run began. ``continue_completed``: a
    ``complete`` job starts a new run with ``messages`` appended to its kept
    transcript (a conversation going on). A running, waiting or paused job
    raises :class:`JobConflictError`. Returns the record as written: the very object a storage may keep
    and hand to the next lease, so a caller that passes it on hands out a copy (``detached``).
    """
    validate_job_id(job_id)
    check_retry_mode(retry_mode)
    if initial_phase is not None and initial_phase not in pipeline.by_name:
        raise InvalidPipelineError(
            f"unknown initial_phase {initial_phase!r}; phases are {', '.join(pipeline.by_name)}")
    first = initial_phase or pipeline.first
    state = _initial_state(job_id, pipeline.state_model_of(pipeline.by_name[first]), initial_state)
    new_messages = check_messages(messages, f"initial messages of job {job_id!r}")
    opts = owned_json_value(options or {}, what=f"options of job {job_id!r}")
    now = scheduler.now()
    existing = storage.get_job(job_id)
    fresh = False
    if existing is not None:
        _refuse_start(existing, name, new_messages, continue_completed=continue_completed, retry_mode=retry_mode)
        if existing.status in transitions.FINISHED:  # an unfinished one is refused by its transition
            children.check_not_awaited(existing, storage, act="run it again")
    if existing is None:
        if retry_mode == "resume":
            raise JobNotFoundError(f"job {job_id!r} does not exist; nothing to resume")
        state = _fresh_state(job_id, pipeline.state_model_of(pipeline.by_name[first]), state)
        commit = transitions.create(job_id, pipeline=name, first=first, state=state, messages=new_messages,
                                    options=opts, now=now, trace=telemetry.run_context(job_id, name))
    elif existing.status is JobStatus.COMPLETE and continue_completed and retry_mode is None:
        commit = _continued(storage, existing, first=first, state=state, messages=new_messages, pipeline=name,
                            options=opts, now=now)
        fresh = True
    else:
        mode = retry_mode or ("resume" if existing.checkpoint is not None else "full")
        if mode == "resume":
            commit = transitions.retry_resume(existing, now=now)
        else:
            commit = transitions.retry_full(existing, first=first, state=state, now=now)
            fresh = state is not None  # a start state given by this code: this version's, as a new run's
    if commit.expected_version == 0 or fresh:
        # A new job or a new run's fresh state is this code's: marked with its version, so an older
        # worker leaves it alone (a retry keeps the stored mark: its state may await a migration).
        commit = commit.model_copy(update={"record": versions.stamp(commit.record, pipeline.version,
                                                                    new=commit.expected_version == 0, run=True)})
    try:
        writer.apply(storage, scheduler, commit)
    except StaleVersionError as exc:
        raise JobConflictError(f"job {job_id!r} changed while it was being restarted; try again") from exc
    return commit.record
