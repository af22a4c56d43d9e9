"""What a running phase sees and can do: :class:`PhaseContext`, created by the runner for each attempt.

Its writes go through :mod:`pipelines.engine.writer` (journaled steps, mid-phase saves, live parts);
the rest it buffers for the phase's commit (:class:`~pipelines.engine.phase.outcomes.PhaseOutput`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pipelines.engine import versions, writer
from pipelines.engine._aio import resolve
from pipelines.engine.env import EMPTY_ENV, RunEnv
from pipelines.engine.errors import InvalidInputError, StaleVersionError
from pipelines.engine.models import (
    NO_USAGE,
    Checkpoint,
    Event,
    JSONValue,
    LogEntry,
    LogLevel,
    Message,
    Usage,
    check_messages,
    fitting_start,
    fresh_json,
    json_data,
    to_json_value,
)
from pipelines.engine.phase.outcomes import PhaseOutput
from pipelines.engine.phase.transcript import read_transcript

if TYPE_CHECKING:
    from adapters.base import Storage

__all__ = ["INBOX_STEP", "DeltaTarget", "PhaseContext", "ToolScope"]

S = TypeVar("S")
T = TypeVar("T")

_LEVELS = ("info", "warn", "error")

INBOX_STEP = "inbox"
"""The journal key under which a phase's taken inbox messages are kept for a re-run."""

class DeltaTarget(Protocol):
    """Where a streaming model call sends its text: ``target(text)`` per piece.

    ``retries``: how often a provider stream that broke after it started may
    be tried again as the same turn; ``restart()`` is called before each such
    retry, so readers drop the abandoned attempt's text; ``flush()`` sends what
    is batched at once (the call has returned: no reason to wait).
    """

    retries: int

    def __call__(self, text: str) -> None: ...

    def restart(self) -> None: ...

    def flush(self) -> None: ...


@dataclass
class _Buffered:
    """What a phase produced besides its outcome; committed together with it."""

    logs: list[LogEntry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    usage: Usage = NO_USAGE
    usage_keys: list[str] = field(default_factory=list)
    take_inbox: int = 0


@dataclass(frozen=True)
class ToolScope:
    """What a turn's tools are told of their run: its ``context=`` and each tool's ``tools_context=`` entry."""

    context: JSONValue = None
    tool_contexts: Mapping[str, Any] = field(default_factory=dict)


class PhaseContext(Generic[S]):
    """What a running phase sees and can do. Created by the runner."""

    def __init__(
        self,
        *,
        job_id: str,
        checkpoint: Checkpoint[S],
        storage: Storage,
        owner: str | None,
        clock: Callable[[], float],
        saver: Callable[[Any], int] | None = None,
        attempt: int = 0,
        usage: Usage | None = None,
        version: int = 0,
        transcript_len: int = 0,
        options: dict[str, JSONValue] | None = None,
        inbox: int = 0,
        migrating: versions.Migrating | None = None,
        env: RunEnv | None = None,
        phases_done: int = 0,
    ) -> None:
        self.job_id = job_id
        #: Phases the job completed before this one, over its whole life (its record's ``phases_done``):
        #: the turn an event says it belongs to is this plus one, the number forks and the page go by.
        self.phases_done = phases_done
        #: What the App hands every phase it runs: child runs, flow limits, callbacks, clock
        #: (:class:`~pipelines.engine.env.RunEnv`). Explicit, so the phase sees it on any thread.
        self.env = env if env is not None else EMPTY_ENV
        self.checkpoint = checkpoint
        self.attempt = attempt
        #: Model usage of the job committed before this phase (for budgets).
        self.job_usage = usage or NO_USAGE
        #: Per-run options stored with the job (``run_agent(..., max_turns=...)``): a copy of its own, so a
        #: phase that changes one in place changes no record a storage holds (as for its state).
        self.options: dict[str, JSONValue] = fresh_json(options) if options else {}
        self._version = version
        #: How many messages sent to the job (``app.send``) were waiting when this phase started.
        self.inbox = inbox
        #: Length of the committed transcript this phase starts from.
        self.transcript_len = transcript_len
        #: Set when this worker's version is newer than the one that wrote the job: the turn whose
        #: commit upgrades it (an agent migrates its model view here; see pipelines.engine.versions).
        self.migrating = migrating
        self._storage = storage
        self._owner = owner
        self._clock = clock
        self._saver = saver
        #: When this run of the phase started (the scheduler's clock): an agent turn's ``turn_started``.
        self.started_at = clock()
        # What a person supplied (approvals, recorded outcomes) reads like any
        # journaled step; a step the phase itself journaled wins.
        # (The inputs as copies of their own: a replay hands them to the phase, which may change them in place.)
        inputs = fresh_json(checkpoint.inputs) if checkpoint.inputs else {}
        self._journal: dict[str, JSONValue] = {**inputs, **checkpoint.journal}
        self._recorded_at: dict[str, float] = {}  # when this attempt journaled each step (timelines)
        self._lock = threading.Lock()
        self._buffer = _Buffered()
        self._on_commit: list[tuple[Callable[[Checkpoint[Any]], None], bool]] = []  # (fn, reads_only)
        #: Tells this run of the phase apart from any other (a crash re-run, a lease taken over): a
        #: client of the live stream drops the text of an attempt once a newer one starts.
        self.attempt_id = (owner or "local")[-12:]
        #: Where a streaming model call sends text as it arrives (set by the agent turn around its call).
        self.on_delta: DeltaTarget | None = None
        #: What the tools of this phase are told of their run (``ToolContext.context`` and
        #: ``tool_context``): set by the agent turn while its tools run, ``None`` otherwise.
        self.tool_scope: ToolScope | None = None

    # --- reading -----------------------------------------------------------
    @property
    def phase(self) -> str:
        return self.checkpoint.next_phase

    @property
    def state(self) -> S:
        return self.checkpoint.state

    @property
    def job_turn(self) -> int:
        """The turn this phase runs, counted over the job's life: what its events say (forks and the page go by it)."""
        return self.phases_done + 1

    @property
    def version(self) -> int:
        """The job's version this phase runs at (journal writes are fenced on it)."""
        return self._version

    @property
    def journal(self) -> dict[str, JSONValue]:
        """A copy of the step results journaled so far in this phase attempt."""
        with self._lock:
            return dict(self._journal)

    @property
    def appended(self) -> int:
        """How many transcript messages this attempt queued so far (``append_messages``): its commit's span."""
        return len(self._buffer.messages)

    def messages(self, start: int = 0) -> list[Message]:
        """The committed transcript from ``start`` (this phase's own appends are not in it yet)."""
        return read_transcript(self._storage, self.job_id, start, self.transcript_len)

    # --- writing -----------------------------------------------------------
    def log(self, message: str, level: LogLevel = "info") -> None:
        """Add a log line; it is stored with this phase's commit."""
        if level not in _LEVELS:
            raise InvalidInputError(f"log level must be one of {_LEVELS}, got {level!r}")
        entry = LogEntry(timestamp=self._clock(), phase=self.phase, level=level, message=str(message))
        with self._lock:
            self._buffer.logs.append(entry)

    def emit(self, type_: str, *, turn: int | None = None, **data: Any) -> None:
        """Add an event to the job's event log; it is stored with this phase's commit (if it moves on)."""
        self.emit_at(self._clock(), type_, turn=turn, **data)

    def emit_at(self, timestamp: float, type_: str, *, turn: int | None = None, **data: Any) -> None:
        """:meth:`emit` an event of something that happened at ``timestamp`` (the scheduler's clock), earlier."""
        event = Event(timestamp=timestamp, type=type_, turn=turn, phase=self.phase,
                      data=json_data(data, lambda: f"data of event {type_!r}"))
        with self._lock:
            self._buffer.events.append(event)

    def part(self, type_: str, *, turn: int | None = None, **data: Any) -> Event:
        """An ephemeral live-stream part of this attempt (see :meth:`publish_parts`)."""
        return Event(timestamp=self._clock(), type=type_, turn=turn, phase=self.phase,
                     data={"attempt": self.attempt_id, **data})

    def publish_parts(self, parts: list[Event]) -> None:
        """Send ephemeral parts to the job's live stream now (``text_delta``, ``attempt_started``).

        Unlike :meth:`emit`, they are not committed: readers see them at once,
        and the committed transcript stays the truth.
        """
        writer.publish_live(self._storage, self.job_id, parts)

    def append_messages(self, messages: list[Message]) -> None:
        """Queue transcript messages; they are appended atomically with the commit."""
        checked = check_messages(messages, f"messages of job {self.job_id!r}")
        with self._lock:
            self._buffer.messages.extend(checked)

    def take_inbox(self) -> list[Message]:
        """The messages sent to the job since its last turn (``app.send``), in order; ``[]`` when none.

        Journaled, so a re-run after a crash takes exactly the same ones; the phase's commit (moving on, or
        completing) removes them from the inbox, so each joins the transcript once. As many as fit in one
        journal step are taken (``MAX_VALUE_BYTES``); the rest wait for the next turn (or run).
        """
        found, taken = self.recorded(INBOX_STEP)
        if not found:
            taken = fitting_start(self._storage.inbox(self.job_id, self.inbox)) if self.inbox > 0 else []
            if taken:
                self.record(INBOX_STEP, taken)
        messages: list[Message] = list(taken or [])
        with self._lock:
            self._buffer.take_inbox = len(messages)
        return messages

    def count_dropped(self, usage: Usage, *, answer: JSONValue | None = None, turn: int | None = None) -> None:
        """Count the usage of work this attempt paid for and can no longer commit (it was fenced off).

        Stored at once, outside the version fence, so budgets and the job's usage include model calls of
        attempts that never committed. ``answer`` (what the model said, JSON) is kept with it for the page's
        view of turn ``turn``'s model call, where the storage keeps such answers.
        """
        entry: JSONValue | None = None
        if answer is not None:
            entry = {"turn": turn, "attempt": self.attempt, "attempt_id": self.attempt_id, "at": self._clock(),
                     "answer": answer}
        writer.add_dropped_usage(self._storage, self.job_id, usage, token=f"{self.attempt_id}:{self._version}",
                                 answer=entry)

    def add_usage(self, usage: Usage, *, key: str | None = None) -> None:
        """Count model usage for this job; stored with the commit, whatever the phase's outcome.

        ``key``: the journal step that holds this answer. Usage under a key that an earlier commit of this
        phase already counted (the turn waited for a person, or failed and is resumed) is not counted again.
        """
        if key is not None and key in self.checkpoint.usage_counted:
            return
        with self._lock:
            self._buffer.usage = self._buffer.usage + usage
            if key is not None:
                self._buffer.usage_keys.append(key)

    def save_state(self, state: Any) -> None:
        """Persist ``state`` now, mid-phase: a crash re-runs this phase from it.

        Journaled steps and this phase's buffered logs and messages are kept.
        """
        if self._saver is None:
            raise RuntimeError("save_state is not available outside the runner")
        self._version = self._saver(state)
        self.checkpoint = self.checkpoint.model_copy(update={"state": state})

    def step(self, key: str, fn: Callable[[], T | Awaitable[T]], *,
             publish: Callable[[JSONValue], Sequence[Event]] | None = None,
             before_commit: Callable[[JSONValue], bool] | None = None,
             on_refused: Callable[[JSONValue], None] | None = None) -> JSONValue:
        """Run ``fn`` once per phase attempt and journal its result under ``key``.

        On a re-run after a crash the journaled result is returned and ``fn`` is not called. The value
        returned is always the JSON form of ``fn``'s result (a pydantic model comes back as a dict), on the
        first run and on a replay alike. ``fn`` may be ``async def``.

        ``publish(value)``, called only when ``fn`` ran, returns live-stream parts (see :meth:`part`) that
        go out with the journal write, in the same round trip where the storage can (the agent turn sends
        the last of its streamed text this way); they are published only if the step is journaled.

        ``before_commit(value)``: whether nothing but the commit follows this step, given its value
        (see :meth:`record`); ``on_refused(value)`` is then called if the storage finds the write refused
        only after this returned (a fenced-off attempt's bookkeeping, else done where it raises).
        """
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"step key must be a non-empty string, got {key!r}")
        with self._lock:
            if key in self._journal:
                return self._journal[key]
        value = to_json_value(resolve(fn()), what=f"result of step {key!r}")
        last = before_commit is not None and before_commit(value)
        refused = None if on_refused is None else lambda: on_refused(value)
        try:
            self.record(key, value, parts=publish(value) if publish is not None else (), before_commit=last,
                        on_refused=refused)
        except StaleVersionError as exc:
            exc.unrecorded = value  # computed (maybe paid for) but fenced off: the caller may still count it
            raise
        return value

    async def astep(self, key: str, fn: Callable[[], Awaitable[T] | T]) -> JSONValue:
        """``step`` for ``async def`` phases: awaits ``fn`` on the running loop."""
        with self._lock:
            if key in self._journal:
                return self._journal[key]
        result = fn()
        if hasattr(result, "__await__"):
            result = await result
        value = to_json_value(result, what=f"result of step {key!r}")
        self.record(key, value)
        return value

    def recorded(self, key: str) -> tuple[bool, JSONValue]:
        """``(True, value)`` if ``key`` is journaled in this attempt, else ``(False, None)``."""
        with self._lock:
            if key in self._journal:
                return True, self._journal[key]
        return False, None

    def record(self, key: str, value: JSONValue, *, parts: Sequence[Event] = (), before_commit: bool = False,
               on_refused: Callable[[], None] | None = None) -> None:
        """Journal ``value`` under ``key`` now (fenced: a stale worker gets ``StaleVersionError``).

        ``parts`` are published to the live stream once the value is journaled
        (in the same write when the storage is a :class:`~adapters.base.StepPublisher`).
        ``before_commit``: nothing with effects outside the job runs after this write but the
        phase's commit; a storage that can (a :class:`~adapters.base.StepBeforeCommit`) then sends
        it without waiting for its reply, and a fenced-off worker learns so at the commit (calling
        ``on_refused()`` then, if given).
        """
        writer.record_step(self._storage, self.job_id, version=self.version, owner=self._owner, key=key,
                           value=value, parts=parts, before_commit=before_commit, on_refused=on_refused)
        with self._lock:
            self._journal[key] = value
            self._recorded_at[key] = self._clock()

    def recorded_at(self, key: str) -> float:
        """When this attempt journaled ``key`` (the scheduler's clock); now, if an earlier attempt or a person did."""
        with self._lock:
            at = self._recorded_at.get(key)
        return self._clock() if at is None else at

    def journaled_here(self, key: str) -> bool:
        """Whether this attempt journaled ``key`` itself (``False``: an earlier attempt or a person did, or nobody)."""
        with self._lock:
            return key in self._recorded_at

    def on_commit(self, fn: Callable[[Checkpoint[Any]], None], *, reads_only: bool = False) -> None:
        """Call ``fn(new_checkpoint)`` once this phase's commit has landed (moving on to a next phase).

        For in-process caches: a callback never runs for a commit that was fenced off, so what it caches
        is exactly what storage holds. Its state is a copy of the committed one: changing it changes
        nothing stored. ``reads_only=True``: ``fn`` keeps no part of the state it could change (the
        commit id, say), so no copy is made for it.
        """
        self._on_commit.append((fn, reads_only))

    # --- for the runner ----------------------------------------------------
    def take_output(self) -> PhaseOutput:
        """What the phase buffered (logs, messages, events, usage), handed over once to its commit."""
        with self._lock:
            buf, self._buffer = self._buffer, _Buffered()
        return PhaseOutput(logs=buf.logs, messages=buf.messages, events=buf.events, usage=buf.usage,
                           usage_keys=buf.usage_keys, take_inbox=buf.take_inbox)

    def run_on_commit(self, checkpoint: Checkpoint[Any]) -> None:
        """Call the ``on_commit`` callbacks once the phase's commit has landed (a failing one is logged)."""
        # Each runs once: handed over like the output, so a callback that refers to this context (a
        # closure over it) does not keep it, and all the turn held, alive in a reference cycle.
        fns, self._on_commit = self._on_commit, []
        own = None
        for fn, reads_only in fns:
            given = checkpoint
            if not reads_only and type(checkpoint.state) in (dict, list):
                # A copy of the state: a storage may keep the committed checkpoint as it is and hand it to the
                # next lease, so a cache that changes what it was given must change nothing stored.
                own = own or checkpoint.model_copy(update={"state": fresh_json(checkpoint.state)})
                given = own
            try:
                fn(given)
            except Exception:
                logging.getLogger("pipelines").warning("job %s: on_commit callback failed", self.job_id,
                                                       exc_info=True)
