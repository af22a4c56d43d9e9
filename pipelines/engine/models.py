"""Persisted data: job records, checkpoints, log entries, commits.

Everything here is a pydantic v2 model that travels as JSON, in storage and on
the queue. Fields added later must carry defaults so old records still load.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from enum import Enum, StrEnum
from typing import Any, Final, Generic, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from pydantic_core import to_json as _to_json

from pipelines.engine.errors import InvalidJobIdError, StateNotSerializableError, ValueTooLargeError

__all__ = [
    "FINISHED_STATUSES",
    "JOB_ID_PATTERN",
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_VALUE_BYTES",
    "MAX_VALUE_DEPTH",
    "Checkpoint",
    "Commit",
    "CommitReply",
    "Event",
    "JobRecord",
    "JobStatus",
    "JSONValue",
    "LogEntry",
    "LogLevel",
    "Message",
    "TurnMark",
    "Usage",
    "check_messages",
    "check_size",
    "dump_json",
    "dump_events",
    "dump_logs",
    "dump_marks",
    "dump_record",
    "dump_record_apart",
    "encode_plain",
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

_isfinite = math.isfinite  # bound once: called for every float in every value

MAX_VALUE_BYTES = 8 * 1024 * 1024
"""The largest JSON text storage takes for one value: a transcript message, a step
result, a log or event line, or a job record with its state. A larger one is refused
with :class:`ValueTooLargeError` before anything is written. Change it here
(``pipelines.engine.models.MAX_VALUE_BYTES = ...``) if your jobs need more."""


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
    if job_id in (".", ".."):
        # Both name a directory, not a job, in a URL path (the web page) and a file path (blob store).
        raise InvalidJobIdError(f"invalid job id {job_id!r}: it names a directory in a path; use another id")
    return job_id


def check_size(text: str, what: str) -> str:
    """Return ``text`` if it fits in ``MAX_VALUE_BYTES``, else raise :class:`ValueTooLargeError` naming ``what``."""
    limit = MAX_VALUE_BYTES
    # len() counts characters; only a text that could be too long pays for encoding.
    if len(text) * 4 > limit and len(size := text.encode()) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(size) / 1048576:.1f} MiB of JSON, above the {limit / 1048576:.1f} MiB limit "
            "(pipelines.engine.models.MAX_VALUE_BYTES)"
        )
    return text


def dump_json(value: Any, what: str) -> str:
    """Compact JSON text of ``value`` for storage, checked by the rules of :func:`to_json_value`.

    Not storable raises :class:`StateNotSerializableError`, too large :class:`ValueTooLargeError`,
    both naming ``what``.
    """
    plain = to_json_value(value, what=what)
    try:
        text = encode_plain(plain)
    except ValueError as exc:  # sys.set_int_max_str_digits() lowered after import
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def encode_plain(plain: Any) -> str:
    """Compact JSON text of ``plain``, data :func:`to_json_value` returned (checked already), for storage."""
    limit = sys.get_int_max_str_digits()
    if 0 < limit < MAX_INT_DIGITS:
        # Lowered after import: json.dumps applies the new limit (ValueError), so no reader fails later.
        return json.dumps(plain, allow_nan=False, separators=(",", ":"))
    # pydantic-core's encoder: several times json.dumps on plain data, the same compact text
    # except that non-ASCII stays UTF-8 instead of \u escapes (it reads back the same).
    return _to_json(plain).decode()


def check_messages(messages: Sequence[Any], what: str) -> list[Message]:
    """``messages`` in JSON form, each a dict with a ``role``; else :class:`StateNotSerializableError`."""
    # Each message is a value of its own (as storage keeps it), not a level inside a list.
    checked: list[Message] = [to_json_value(m, what=what) for m in list(messages)]
    for m in checked:
        if not isinstance(m, dict) or "role" not in m:
            raise StateNotSerializableError(f"a transcript message must be a dict with a 'role', got {m!r:.80}")
    return checked


MAX_JSON_DEPTH: Final = 200
"""How deeply lists/dicts may nest in one stored JSON document: the recursion limit of
pydantic-core's JSON parser, which reads records, logs and events back (one level deeper is
"recursion limit exceeded" on every later read). A reader's limit, so not tunable."""

# The deepest a value sits inside a stored document: record -> checkpoint -> journal -> step result.
_ENVELOPE_DEPTH: Final = 3

MAX_VALUE_DEPTH: Final = MAX_JSON_DEPTH - _ENVELOPE_DEPTH
"""How deeply lists/dicts may nest in one value (a state, result, message, step result, the data
of an event): 197, so the value reads back wherever storage puts it. Deeper is refused."""

MAX_INT_DIGITS: Final = min(4300, sys.get_int_max_str_digits() or 4300)
"""The most decimal digits an int in a value may have: pydantic-core's parser refuses longer ones
("number out of range") and ``json.loads`` applies ``sys.get_int_max_str_digits()`` (4300 unless
lowered). Longer ints are refused; store them as strings."""

_INT_BOUND: Final = 10**MAX_INT_DIGITS  # abs(n) < _INT_BOUND  <=>  n has at most MAX_INT_DIGITS digits
_ROUND_TRIP: Final = ("does not survive a JSON round trip (tuples, non-string keys or the like); "
                      "use lists and str keys")


class _RefusedError(Exception):
    """Why a value cannot be stored; the public entry points prefix it with what the value is."""


def _bad_str(text: str, where: str) -> None:
    """Refuse ``text`` if it holds a surrogate code point: UTF-8 cannot carry one, so no reader gets it back."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise _RefusedError(f"contains a lone surrogate {text[exc.start]!r} in {where} (not valid UTF-8; "
                       "decode text with errors='replace')") from None


def _big_int(n: int) -> _RefusedError:
    digits = int(n.bit_length() * 0.30103) + 1  # str(n) itself would fail past the limit
    return _RefusedError(f"has an int of about {digits} digits, more than the {MAX_INT_DIGITS} JSON readers accept "
                    "(pipelines.engine.models.MAX_INT_DIGITS); store it as a string")


def _too_deep() -> _RefusedError:
    return _RefusedError(f"nests lists/dicts deeper than {MAX_VALUE_DEPTH} levels "
                         "(pipelines.engine.models.MAX_VALUE_DEPTH), more than storage can read back")


def _not_json(why: str) -> _RefusedError:
    return _RefusedError(f"is not JSON-serialisable: {why}")


def _plain(value: Any, room: int = MAX_VALUE_DEPTH) -> bool:
    """True for data made only of dict/list/str/int/finite float/bool/None (exact types, str keys).

    The hot path: it runs on every journaled step, message and event, and
    walks the value once. On the way it enforces the readers' limits (nesting
    within ``room`` levels, int digits, no surrogates, finite floats), raising
    :class:`_RefusedError`; False means "not plain": :func:`_convert` decides.
    """
    t = type(value)
    if t is dict:
        return _plain_dict(value, room)
    if t is list:
        return _plain_list(value, room)
    if t is str:
        if not value.isascii():
            _bad_str(value, "a string")
        return True
    if t is int:
        if not -_INT_BOUND < value < _INT_BOUND:
            raise _big_int(value)
        return True
    if t is float:
        if not _isfinite(value):
            raise _not_json(f"{value!r} is not a JSON number")
        return True
    return t is bool or value is None


def _plain_dict(value: dict[Any, Any], room: int) -> bool:
    # Leaf types are tested inline: a call per leaf costs more than the check.
    if room <= 0:
        raise _too_deep()
    for k, v in value.items():
        if type(k) is not str:
            return False
        if not k.isascii():
            _bad_str(k, "a dict key")
        tv = type(v)
        if tv is str:
            if not v.isascii():
                _bad_str(v, "a string")
        elif tv is int:
            if not -_INT_BOUND < v < _INT_BOUND:
                raise _big_int(v)
        elif not (tv is bool or v is None) and not _plain(v, room - 1):
            return False
    return True


def _plain_list(value: list[Any], room: int) -> bool:
    if room <= 0:
        raise _too_deep()
    for v in value:
        tv = type(v)
        if tv is str:
            if not v.isascii():
                _bad_str(v, "a string")
        elif tv is int:
            if not -_INT_BOUND < v < _INT_BOUND:
                raise _big_int(v)
        elif not (tv is bool or v is None) and not _plain(v, room - 1):
            return False
    return True


def _convert(value: Any, room: int) -> JSONValue:
    """The plain JSON data ``value`` stands for, built anew: the slow path for what :func:`_plain` left.

    Enums of str/int become their value, subclasses of str/int/float their
    base type; tuples and non-str keys are refused, since JSON would hand back
    something else (a list, a str key) and a replay would behave differently.
    """
    if isinstance(value, Enum):
        return _convert(_enum_value(value), room)
    if isinstance(value, dict):
        if room <= 0:
            raise _too_deep()
        return {_convert_key(k): _convert(v, room - 1) for k, v in value.items()}
    if isinstance(value, list):
        if room <= 0:
            raise _too_deep()
        return [_convert(v, room - 1) for v in value]
    if isinstance(value, tuple):
        raise _RefusedError(_ROUND_TRIP)
    value = _base_scalar(value)
    if _plain(value, room):
        return value
    raise _not_json(f"Object of type {type(value).__name__} is not JSON serializable")


def _base_scalar(value: Any) -> Any:
    """A subclass of str/int/float as its base type (what JSON hands back); anything else as it is."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int) and type(value) is not bool:
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return value


def _convert_key(key: Any) -> str:
    if isinstance(key, Enum):
        key = _enum_value(key)
    if isinstance(key, str):
        text = str.__str__(key)
        if not text.isascii():
            _bad_str(text, "a dict key")
        return text
    if key is None or isinstance(key, int | float):
        raise _RefusedError(_ROUND_TRIP)  # JSON would turn the key into a string
    raise _not_json(f"a dict key of type {type(key).__name__}; keys must be str")


_ENUM_VALUE_TYPES: Final = (str, int)


def _enum_value(member: Enum) -> Any:
    value = member.value
    if type(value) in _ENUM_VALUE_TYPES:
        return value
    raise _not_json(f"{member!r} is an enum of {type(value).__name__}; only enums of str or int are stored "
                    "(as their value)")


def to_json_value(value: Any, *, what: str = "value") -> JSONValue:
    """Convert ``value`` (a pydantic model or plain JSON data) into plain JSON data.

    The result is what storage will hand back later, so callers see the same
    thing on a fresh run and on a replay. The rules, the same for every value
    storage writes:

    - dict (str keys), list, str, int, finite float, bool and None are kept;
      a pydantic model becomes ``model_dump(mode="json")``;
    - an enum member whose value is a str or int (``StrEnum``, ``IntEnum``, or
      a plain ``Enum`` of such values) becomes its value, as a key too; other
      enums are refused; subclasses of str/int/float become the base type;
    - refused with :class:`StateNotSerializableError` naming ``what`` and why:
      sets, tuples, bytes, other objects, NaN/inf, non-str keys, lists/dicts
      nested deeper than :data:`MAX_VALUE_DEPTH`, ints of more than
      :data:`MAX_INT_DIGITS` digits, and strings holding a lone surrogate
      (``"\\ud83d"``), which UTF-8 cannot carry. Storage could not read those
      back, or would read back something else.
    """
    try:
        if isinstance(value, BaseModel):
            value = _model_data(value)
        if _plain(value, MAX_VALUE_DEPTH):
            return value  # already exactly its JSON form: no copy (hot path)
        return _convert(value, MAX_VALUE_DEPTH)
    except _RefusedError as exc:
        raise StateNotSerializableError(f"{what} {exc}") from None


def json_data(data: dict[str, Any], what: Callable[[], str]) -> dict[str, Any]:
    """``data`` (a dict made for the call, like keyword arguments) in JSON form, by :func:`to_json_value`'s rules.

    ``data`` itself when it is plain already, which is what the hot path sees: then
    ``what()``, the description an error would carry, is never built.
    """
    try:
        if _plain_dict(data, MAX_VALUE_DEPTH):
            return data
    except _RefusedError:
        pass  # to_json_value says why, naming what()
    plain: dict[str, Any] = to_json_value(data, what=what())
    return plain


def _model_data(model: BaseModel) -> Any:
    try:
        return model.model_dump(mode="json")
    except (ValueError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        raise _not_json(str(exc)) from None


class JobStatus(StrEnum):
    """Where a job is in its life. Values are the lower-case strings."""

    IDLE = "idle"
    RUNNING = "running"
    WAITING = "waiting"
    PAUSED = "paused"
    COMPLETE = "complete"
    ERROR = "error"
    CANCELLED = "cancelled"


FINISHED_STATUSES = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)
"""The statuses in which a job is finished: no turn runs and no person is asked anything (the one definition;
``transitions.FINISHED``, ``streams.FINISHED`` and ``handle.FINISHED`` name it)."""


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


_EVENT_FIELDS: Final = frozenset(Event.model_fields)


class Usage(BaseModel):
    """Model usage accumulated over a job's life, retries included (frozen: sums share their operands)."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    model_calls: int = 0
    unknown_cost_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        # Most sums add nothing (a turn's usage to a record, nothing dropped): frozen, so either side serves.
        if _nothing(other):
            return self
        if _nothing(self):
            return other
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            model_calls=self.model_calls + other.model_calls,
            unknown_cost_calls=self.unknown_cost_calls + other.unknown_cost_calls,
        )


NO_USAGE: Final = Usage()
"""No usage: shared by every record, context and buffer that has none yet (frozen, so sharing is safe)."""


def _nothing(usage: Usage) -> bool:
    return not (usage.prompt_tokens or usage.completion_tokens or usage.cost_usd or usage.model_calls
                or usage.unknown_cost_calls)


class Checkpoint(BaseModel, Generic[S]):
    """Where a running job resumes: the next phase and its state.

    ``journal`` holds the results of ``ctx.step`` calls made inside the
    current phase attempt; it is cleared by every commit that moves on.
    """

    next_phase: str
    state: S
    attempt: int = 0
    due_at: float = 0.0
    journal: dict[str, JSONValue] = Field(default_factory=dict)
    # Journal entries a person supplied (an approval, a recorded tool outcome).
    # They live in the record, not the journal, so the control operation that
    # writes one is a single compare-and-set on the job's version: of two
    # people deciding the same call at once, exactly one wins.
    inputs: dict[str, JSONValue] = Field(default_factory=dict)
    # Journal keys whose model usage is already counted in the record's usage
    # (a turn that waited, failed or retries later keeps its journal: its
    # replayed model answer must not be counted twice).
    usage_counted: list[str] = Field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0
    # The token of the commit that wrote this checkpoint: unique per commit,
    # so a worker can tell "this is exactly the state I committed" (caches).
    commit_id: str = ""
    # Random, drawn when the job is created and by every commit that truncates its transcript, and
    # carried by every other commit: while it stays the same the transcript only grows, so a worker
    # holding its first k messages under this epoch reads only the rest (phases.agent_turn's cache).
    # "" (a record from before it was kept): unknown, nothing is assumed.
    transcript_epoch: str = ""


class TurnMark(BaseModel):
    """What a job committed at the end of one turn (phase): where a fork starts.

    ``phases_done`` is the turn's number over the job's whole life (continued
    conversations keep counting), ``transcript_len`` how many messages the
    transcript held then, ``next_phase`` the phase that was to run next
    (``None``: the job completed at that turn). ``size`` is the length of the
    state's JSON text, kept so the history's byte bound is cheap to enforce.
    ``code_version`` is the version that wrote that turn (``None``: unversioned,
    or a mark from before it was kept): a fork at the turn is that version's,
    so a newer worker migrates it again exactly as it migrated the original.
    """

    model_config = ConfigDict(frozen=True)

    phases_done: int
    transcript_len: int = 0
    next_phase: str | None = None
    state: JSONValue = None
    size: int = 0
    code_version: str | None = None

    # Stored as a 5-item list (6 with a code_version), not an object: the record is rewritten by every
    # commit and carries up to HISTORY_LIMIT marks, so the field names would triple what a commit writes.
    @model_validator(mode="before")
    @classmethod
    def _from_stored(cls, data: Any) -> Any:
        if isinstance(data, list) and len(data) in (5, 6):
            names = ("phases_done", "transcript_len", "next_phase", "size", "state", "code_version")
            return dict(zip(names[:len(data)], data, strict=True))
        return data

    @model_serializer(mode="plain")
    def _stored(self) -> list[Any]:
        fields = [self.phases_done, self.transcript_len, self.next_phase, self.size, self.state]
        return fields if self.code_version is None else [*fields, self.code_version]


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
    # Per-run options that travel with the job so every worker honours them
    # (max_turns, an output schema by its registered name, ...): JSON only.
    options: dict[str, JSONValue] = Field(default_factory=dict)
    # The W3C trace context of the job's run (OpenTelemetry), so every turn joins one trace.
    trace: dict[str, str] | None = None
    # A pause or cancel requested while a turn was in flight. Kept beside the
    # record, never inside it (writing the record would fence the turn off):
    # storage fills it in on load, and the commit that applies it clears it.
    control: str | None = Field(default=None, exclude=True)
    # How many messages sent to the job (app.send) wait in its inbox: kept beside
    # the record like ``control``, filled in by storage on load.
    inbox: int = Field(default=0, exclude=True)
    # Usage of attempts fenced off after paying for a model call (they never commit): kept beside the
    # record like ``control``, so budgets count every paid call (see ``total_usage``).
    dropped: Usage = Field(default_factory=Usage, exclude=True)

    @property
    def total_usage(self) -> Usage:
        """Every paid model call: committed usage plus that of attempts fenced off."""
        return self.usage + self.dropped
    # The last turns' checkpoints, oldest first (bounded: see transitions.HISTORY_LIMIT
    # and HISTORY_BYTES), so a fork can start from the state committed at an earlier turn.
    history: list[TurnMark] = Field(default_factory=list)
    # Lineage of a fork: the job it was forked from and at which turn.
    forked_from: str | None = None
    at_turn: int | None = None
    # What the fork was asked (a digest of source, turn, run and options: App.fork), written once by the
    # create: a repeated fork lands only when it asks the same (pipelines.app.App.fork).
    fork_request: str | None = None
    # The version of the pipeline or agent that last wrote the job (see pipelines.engine.versions).
    code_version: str | None = None
    # The version that started the current run (created or continued it): a "full" retry restarts
    # from that run's start, written by it, so the job is that version's again and the next turn
    # migrates its state and model view like any older job's.
    run_code_version: str | None = None
    # Child runs (an agent or pipeline used as a tool, see pipelines.engine.children): a child names
    # its parent job and the tool call it answers; a parent lists the children it started.
    parent_job: str | None = None
    parent_call: str | None = None
    children: list[str] = Field(default_factory=list)
    # How many parents up the family's root is (0: not a child); bounded by children.MAX_DEPTH.
    depth: int = 0
    # A conversation's title, named by a title agent after its first run (best effort).
    title: str | None = None


class Commit(BaseModel):
    """One atomic write: the new record plus the turn's appends (I1).

    Storage applies it only if the stored version is ``expected_version`` and,
    for a worker's commit (``owner`` set), the live lease is ``owner``'s; otherwise it raises
    :class:`~pipelines.engine.errors.StaleVersionError` and changes nothing (I2). A
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
    # Drop a pending pause/cancel request (the commit applies it or makes it moot).
    clear_control: bool = False
    # How many messages this commit took from the front of the job's inbox into the transcript.
    take_inbox: int = 0
    # The commit ends the run: storage refuses it (InboxNotEmptyError, nothing written) if the inbox
    # holds more than ``take_inbox`` messages, checked in the same atomic step that writes, so a run
    # never completes past messages sent while its last turn ran.
    ends_run: bool = False

    @property
    def due_at(self) -> float | None:
        """The due-index score: set while running, absent otherwise."""
        cp = self.record.checkpoint
        if self.record.status is JobStatus.RUNNING and cp is not None:
            return cp.due_at
        return None


# Fields whose entries are separate values (step results, a person's inputs): each entry gets the
# whole MAX_VALUE_DEPTH, as when it was journaled; the dict around them is the envelope's level.
_ENTRY_FIELDS: Final = frozenset({"journal", "inputs"})


def _check_fields(model: BaseModel, what: str, skip: frozenset[str] = frozenset()) -> None:
    """Check every stored field of ``model`` (and of the models in it) by the rules of :func:`to_json_value`.

    ``skip``: top-level fields not written with it (a record's history kept apart).
    """
    try:
        _scan(model, skip)
    except _RefusedError as exc:
        raise StateNotSerializableError(f"{what}: {''.join(reversed(exc.args[1:]))} {exc.args[0]}") from None


def _excluded(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that are never written (``Field(exclude=True)``): nothing to check there."""
    names = _EXCLUDED.get(cls)
    if names is None:
        names = _EXCLUDED[cls] = frozenset(n for n, f in cls.model_fields.items() if f.exclude)
    return names


_EXCLUDED: dict[type[BaseModel], frozenset[str]] = {}


def _scan(model: BaseModel, also: frozenset[str] = frozenset()) -> None:
    # Most fields are short ASCII strings, ints, floats or None: settled inline here, since a
    # call per field would cost more than the dump itself. The path of a refused value is built
    # only on the way out of a failure (exc.args[1:], innermost first), never on the hot path.
    skip = _excluded(type(model))
    if also:
        skip = skip | also
    for name, value in model.__dict__.items():
        t = type(value)
        if t is str:
            ok = value.isascii()
        elif t is int:
            ok = -_INT_BOUND < value < _INT_BOUND
        elif t is float:
            ok = _isfinite(value)
        elif t is dict or t is list:
            ok = not value
        else:
            ok = value is None or t is bool or t in _PLAIN_ENUMS or _stored_as_value(value)
        if not ok and name not in skip:
            _scan_field(value, name)


def _stored_as_value(value: Any) -> bool:
    """Whether ``value`` is an enum member stored as its value (a str or an int); remembers enums all of whose are."""
    if not isinstance(value, Enum):
        return False
    cls = type(value)
    if all(type(m.value) in _ENUM_VALUE_TYPES for m in cls):  # members are fixed when the class is made
        _PLAIN_ENUMS.add(cls)
        return True
    return type(value.value) in _ENUM_VALUE_TYPES


_PLAIN_ENUMS: set[type] = set()  # enum classes every member of which is stored as its value (JobStatus, ...)


def _scan_field(value: Any, name: str) -> None:
    joint = "."
    try:
        if isinstance(value, BaseModel):
            _scan(value)
        elif type(value) is list and isinstance(value[0], BaseModel) and all(isinstance(v, BaseModel) for v in value):
            for item in value:  # the record's turn history
                _scan(item)
        else:
            joint = ""
            room = MAX_VALUE_DEPTH + 1 if name in _ENTRY_FIELDS else MAX_VALUE_DEPTH
            if not _plain(value, room):
                _convert(value, room)
    except _RefusedError as exc:
        if joint and type(value) is list:  # which item: looked up only now that one was refused
            joint = f"[{next(i for i, v in enumerate(value) if _refuses(v))}]."
        exc.args = (*exc.args, joint, name) if joint else (*exc.args, name)
        raise


def _refuses(model: BaseModel) -> bool:
    try:
        _scan(model)
    except _RefusedError:
        return True
    return False


def _model_json(model: BaseModel, what: str, **options: Any) -> str:
    """``model`` as the JSON text storage keeps, after checking every field; errors name ``what``."""
    _check_fields(model, what)
    try:
        text = model.model_dump_json(**options)
    except (ValueError, RecursionError) as exc:  # a safety net: _check_fields should have said why
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def dump_record(record: JobRecord, what: str) -> str:
    """The JSON text storage keeps for ``record`` (defaults left out).

    Every field is checked first by the rules of :func:`to_json_value`, so
    what is written reads back; a bad value raises
    :class:`StateNotSerializableError` naming ``what`` and the field, a text
    over :data:`MAX_VALUE_BYTES` :class:`ValueTooLargeError`. Nothing is
    written by this function: adapters call it before touching storage.
    """
    return _model_json(record, what, exclude_defaults=True)


def dump_record_apart(record: JobRecord, what: str) -> str:
    """:func:`dump_record` without the turn history, for a storage that keeps it apart (:func:`dump_marks`)."""
    _check_fields(record, what, _HISTORY)
    try:
        text = record.model_dump_json(exclude_defaults=True, exclude=_NO_HISTORY)
    except (ValueError, RecursionError) as exc:  # a safety net: _check_fields should have said why
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


_HISTORY: Final = frozenset({"history"})
_NO_HISTORY: Final[set[str]] = {"history"}


def dump_marks(marks: Sequence[TurnMark], what: str, *, start: int = 0) -> list[str]:
    """The lines of ``marks[start:]``, for a storage that keeps a record's turn history apart, a mark a line.

    Checked like :func:`dump_record` (a refused mark is named ``history[i]``, its place in the
    record); the record itself is then dumped without its history. A history changes by a mark
    a turn but holds up to ``HISTORY_LIMIT``, so a storage that knows the lines of the marks it
    already holds (the very objects it handed out) dumps only the new ones.
    """
    lines = []
    for i in range(start, len(marks)):
        mark = marks[i]
        try:
            _scan(mark)
        except _RefusedError as exc:
            raise StateNotSerializableError(
                f"{what}: history[{i}].{''.join(reversed(exc.args[1:]))} {exc.args[0]}") from None
        lines.append(check_size(mark.model_dump_json(), what))
    return lines


class CommitReply(NamedTuple):
    """What storage reports after a commit: what a worker keeping the lease must know."""

    control: str | None = None  # a pause or cancel request still pending
    inbox: int = 0  # messages waiting in the job's inbox


def dump_logs(entries: Sequence[LogEntry]) -> list[str]:
    """Log entries as the JSON lines storage keeps (checked like :func:`dump_record`)."""
    return [_model_json(e, "a log entry") for e in entries]


def dump_events(events: Sequence[Event]) -> list[str]:
    """Events as the JSON lines storage keeps: no ``id`` (storage assigns it) and no default fields."""
    return [_event_json(e) for e in events]


_NO_ID: Final[set[str]] = {"id"}


def _event_json(e: Event) -> str:
    # The hot path (several events a turn, and every live-stream part): the same checks as
    # _model_json, inlined for the fields an event has; anything unusual takes the general path,
    # which says what is wrong.
    f = e.__dict__
    ts, turn, phase, kind, data = f["timestamp"], f["turn"], f["phase"], f["type"], f["data"]
    try:
        usual = (type(ts) is float and _isfinite(ts) and type(kind) is str and kind.isascii()
                 and (turn is None or (type(turn) is int and -_INT_BOUND < turn < _INT_BOUND))
                 and (phase is None or (type(phase) is str and phase.isascii()))
                 and type(data) is dict and (not data or _plain_dict(data, MAX_VALUE_DEPTH)))
    except _RefusedError:
        usual = False
    if not usual or len(f) != len(_EVENT_FIELDS):
        return _model_json(e, f"event {e.type!r}", exclude=_NO_ID, exclude_defaults=True)
    # What model_dump_json(exclude=_NO_ID, exclude_defaults=True) writes (the same keys, order and text),
    # without pydantic's model serializer, which costs more than the check above for an event's five fields.
    out: dict[str, Any] = {"timestamp": ts, "type": kind}
    if turn is not None:
        out["turn"] = turn
    if phase is not None:
        out["phase"] = phase
    if data:
        out["data"] = data
    text = _to_json(out).decode()
    return text if len(text) * 4 <= MAX_VALUE_BYTES else check_size(text, f"event {kind!r}")
