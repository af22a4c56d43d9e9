"""Persisted data: job records, checkpoints, log entries, commits.

Everything here is a pydantic v2 model that travels as JSON, in storage and on
the queue. Fields added later must carry defaults so old records still load.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import InvalidJobIdError, StateNotSerializableError, ValueTooLargeError

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_VALUE_BYTES",
    "Checkpoint",
    "Commit",
    "Event",
    "JobRecord",
    "JobStatus",
    "JSONValue",
    "LogEntry",
    "LogLevel",
    "Message",
    "Usage",
    "check_messages",
    "check_size",
    "dump_json",
    "dump_events",
    "dump_logs",
    "to_json_value",
    "validate_job_id",
]

JSONValue = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""

Message = dict[str, Any]
"""One transcript message in the OpenAI chat format (role, content, tool_calls, ...)."""

LogLevel = Literal["info", "warn", "error"]

# Job ids end up inside Redis keys ("{<id>}" hash tags) and RQ job ids, so the
# alphabet is closed: no braces, spaces, newlines or look-alike unicode.
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,200}")

S = TypeVar("S")

MAX_VALUE_BYTES = 8 * 1024 * 1024
"""The largest JSON text storage takes for one value: a transcript message, a step
result, a log or event line, or a job record with its state. A larger one is refused
with :class:`ValueTooLargeError` before anything is written. Change it here
(``pipelines.models.MAX_VALUE_BYTES = ...``) if your jobs need more."""


def validate_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is valid, else raise :class:`InvalidJobIdError` naming the problem."""
    if not isinstance(job_id, str):
        raise InvalidJobIdError(f"job id must be a string, got {type(job_id).__name__}")
    if not JOB_ID_PATTERN.fullmatch(job_id):
        if not job_id:
            why = "it is empty"
        elif len(job_id) > 200:
            why = f"it is {len(job_id)} characters long (at most 200)"
        else:
            bad = next(c for c in job_id if not JOB_ID_PATTERN.fullmatch(c))
            why = f"it contains {bad!r}"
        raise InvalidJobIdError(f"invalid job id {job_id[:60]!r}: {why}; allowed are 1-200 of [A-Za-z0-9._:-]")
    return job_id


def check_size(text: str, what: str) -> str:
    """Return ``text`` if it fits in ``MAX_VALUE_BYTES``, else raise :class:`ValueTooLargeError` naming ``what``."""
    limit = MAX_VALUE_BYTES
    # len() counts characters; only a text that could be too long pays for encoding.
    if len(text) * 4 > limit and len(size := text.encode()) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(size) / 1048576:.1f} MiB of JSON, above the {limit / 1048576:.1f} MiB limit "
            "(pipelines.models.MAX_VALUE_BYTES)"
        )
    return text


def dump_json(value: Any, what: str) -> str:
    """Compact JSON text of ``value`` for storage; not JSON-able or too large raises, naming ``what``."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def check_messages(messages: Sequence[Any], what: str) -> list[Message]:
    """``messages`` in JSON form, each a dict with a ``role``; else :class:`StateNotSerializableError`."""
    checked: list[Message] = to_json_value(list(messages), what=what)
    for m in checked:
        if not isinstance(m, dict) or "role" not in m:
            raise StateNotSerializableError(f"a transcript message must be a dict with a 'role', got {m!r:.80}")
    return checked


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def to_json_value(value: Any, *, what: str = "value") -> JSONValue:
    """Convert ``value`` (a pydantic model or plain JSON data) into plain JSON data.

    The result is what storage will hand back later, so callers see the same
    thing on a fresh run and on a replay. Anything JSON cannot carry (sets,
    objects, NaN, non-string keys) raises :class:`StateNotSerializableError`.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if _plain(value):
        return value  # already exactly its JSON form: skip the round trip (hot path)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    loaded = json.loads(text, parse_constant=_reject_constant)
    # json.dumps silently turns tuples into lists and int keys into strings; a
    # value that changes shape on the way back would behave differently on
    # replay, so it is rejected instead (== sees (1,) != [1] and {1: 2} != {"1": 2}).
    if loaded != value:
        raise StateNotSerializableError(
            f"{what} does not survive a JSON round trip (tuples, non-string keys or the like); use lists and str keys"
        )
    return loaded


def _plain(value: Any) -> bool:
    """True for data made only of dict/list/str/int/finite float/bool/None (exact types, str keys).

    Written as loops with the leaf types tested inline: it runs on every
    journaled step, message and event, and recursion per leaf costs more than
    the JSON round trip it replaces.
    """
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return True
    if t is float:
        return math.isfinite(value)
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                return False
            tv = type(v)
            if not (tv is str or tv is int or tv is bool or v is None) and not _plain(v):
                return False
        return True
    if t is list:
        for v in value:
            tv = type(v)
            if not (tv is str or tv is int or tv is bool or v is None) and not _plain(v):
                return False
        return True
    return False


class JobStatus(StrEnum):
    """Where a job is in its life. Values are the lower-case strings."""

    IDLE = "idle"
    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    COMPLETE = "complete"
    ERROR = "error"
    CANCELLED = "cancelled"


class LogEntry(BaseModel):
    """One line of a job's human-readable log."""

    model_config = ConfigDict(frozen=True)

    timestamp: float
    phase: str | None = None
    level: LogLevel = "info"
    message: str


class Event(BaseModel):
    """One entry of a job's ordered event log (beside the human log).

    ``id`` is assigned by storage when the event is committed and works as a
    cursor: ``storage.events(job_id, after=id)`` returns what came later.
    Types: job_started, job_retried, job_continued, turn_started,
    model_response, tool_call, tool_result, approval_requested, job_waiting,
    retry_scheduled, job_finished, job_failed, job_cancelled, job_paused,
    job_resumed.
    """

    model_config = ConfigDict(frozen=True)

    id: str = ""
    timestamp: float
    type: str
    turn: int | None = None
    phase: str | None = None
    data: dict[str, JSONValue] = Field(default_factory=dict)


class Usage(BaseModel):
    """Model usage accumulated over a job's life, retries included."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    unknown_cost_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            model_calls=self.model_calls + other.model_calls,
            unknown_cost_calls=self.unknown_cost_calls + other.unknown_cost_calls,
        )


class Checkpoint(BaseModel, Generic[S]):
    """Where a running job resumes: the next phase and its state.

    ``journal`` holds the results of ``ctx.step`` calls made inside the
    current phase attempt; it is cleared by every commit that moves on.
    """

    next_phase: str
    state: S
    version: int = 0
    attempt: int = 0
    due_at: float = 0.0
    journal: dict[str, JSONValue] = Field(default_factory=dict)
    transcript_len: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    # The token of the commit that wrote this checkpoint: unique per commit,
    # so a worker can tell "this is exactly the state I committed" (caches).
    commit_id: str = ""


class JobRecord(BaseModel):
    """Everything storage keeps about a job, except its transcript and logs."""

    job_id: str
    pipeline: str = "default"
    status: JobStatus = JobStatus.IDLE
    error: str | None = None
    checkpoint: Checkpoint[JSONValue] | None = None
    result: JSONValue = None
    version: int = 0
    transcript_len: int = 0
    # Where a "full" retry goes back to: the transcript length right after this
    # run's initial messages, the first phase and the initial state.
    base_transcript_len: int = 0
    initial_phase: str | None = None
    initial_state: JSONValue = None
    usage: Usage = Field(default_factory=Usage)
    # Why the last run ended: "done", "max_turns", "stop_when", "truncated", "budget", ...
    stop_reason: str | None = None
    # Set while status is "waiting": why, and which tool call (if any) needs a person.
    waiting: dict[str, JSONValue] | None = None
    phases_done: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0


class Commit(BaseModel):
    """One atomic write: the new record plus the turn's appends (I1).

    Storage applies it only if the stored version is ``expected_version`` and,
    for a worker's commit (``owner`` set), the live lease is ``owner``'s; otherwise it raises
    :class:`~pipelines.errors.StaleVersionError` and changes nothing (I2). A
    commit whose ``token`` is already the stored one was applied before (its
    reply was lost and the client retried): storage returns without writing.
    """

    job_id: str
    expected_version: int
    owner: str | None = None
    token: str
    record: JobRecord
    append_messages: list[Message] = Field(default_factory=list)
    truncate_messages_to: int | None = None
    logs: list[LogEntry] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    keep_journal: bool = False
    release_lease: bool = True

    @property
    def due_at(self) -> float | None:
        """The due-index score: set while running, absent otherwise."""
        cp = self.record.checkpoint
        if self.record.status is JobStatus.RUNNING and cp is not None:
            return cp.due_at
        return None


def dump_logs(entries: Sequence[LogEntry]) -> list[str]:
    """Log entries as the JSON lines storage keeps (size-checked)."""
    return [check_size(e.model_dump_json(), "a log entry") for e in entries]


def dump_events(events: Sequence[Event]) -> list[str]:
    """Events as the JSON lines storage keeps: no ``id`` (storage assigns it) and no default fields."""
    return [check_size(e.model_dump_json(exclude={"id"}, exclude_defaults=True), f"event {e.type!r}") for e in events]
