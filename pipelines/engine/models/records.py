"""The job record and what it holds: status, checkpoint, turn history, usage, log entries and events.

Everything here is a pydantic v2 model that travels as JSON, in storage and on
the queue. Fields added later must carry defaults so old records still load.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Final, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from pipelines.engine.models.values import JSONValue

__all__ = [
    "FINISHED_STATUSES",
    "NO_USAGE",
    "RUN_STARTS",
    "first_run_start",
    "Checkpoint",
    "Event",
    "JobRecord",
    "JobStatus",
    "LogEntry",
    "LogLevel",
    "TurnMark",
    "Usage",
]

LogLevel = Literal["info", "warn", "error"]

S = TypeVar("S")


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
    ``turn`` (an agent turn's events): the job's turn over its whole life, its
    phases done before it plus one (what ``App.fork(at_turn=...)`` and the web
    page go by), not the run's count, which restarts with each run.
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


RUN_STARTS: Final = frozenset({"job_started", "job_continued", "job_retried"})
"""The event types that start a run of a job (created, a conversation continued, retried): a reader of its
stream starts a run's message, or its count of turns, at each."""


def first_run_start(events: Sequence[Event]) -> int | None:
    """The place in ``events`` of the first that starts a run (:data:`RUN_STARTS`), or ``None``.

    Where a storage's live stream is cut: it keeps the run in flight, whose every part a client resuming
    the run's message from a cursor needs (``pipelines.web.sse``).
    """
    return next((i for i, e in enumerate(events) if e.type in RUN_STARTS), None)



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
    usage: Usage = NO_USAGE  # shared: Usage is frozen (and a dump that leaves defaults out makes none)
    # Why the last run ended: "done", "max_turns", "stop_when", "truncated", "content_filter", "budget", ...
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
    dropped: Usage = Field(default=NO_USAGE, exclude=True)
    # How many times in a row the job's current turn lost its lease without committing (its worker died, or
    # stalled past the lease): kept beside the lease like ``control``, counted by the storage when a lease
    # that ran out is taken over, filled in on load; any commit starts it again from 0 (the runner's
    # ``max_interrupted_turns``).
    interrupted: int = Field(default=0, exclude=True)

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
    # The parent's transcript epoch when the call started the child (Checkpoint.transcript_epoch: drawn anew by
    # each life, full retry and run of the parent): a call id repeated in another run or life is another call.
    parent_epoch: str | None = None
    children: list[str] = Field(default_factory=list)
    # How many parents up the family's root is (0: not a child); bounded by children.MAX_DEPTH.
    depth: int = 0
    # A conversation's title, named by a title agent after its first run (best effort).
    title: str | None = None
