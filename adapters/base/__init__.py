"""The two ports of phaserunner: where state lives, and how the next advance is triggered.

Both are ``typing.Protocol``s: an adapter implements the methods, no base
class needed. ``tests/contract`` holds the suite every storage adapter must
pass; the contract is written here once.

Storage contract
----------------
* Storage is the source of truth (I7). Records, transcripts and logs go in
  and come out as JSON: whatever a backend could not store is rejected by
  every backend, the in-memory one included.
* ``commit`` is one atomic compare-and-set (I1, I2): it applies the whole
  :class:`~pipelines.engine.models.Commit` (record, transcript appends or truncation,
  logs, due index, journal clear, lease release) only if the stored version
  equals ``commit.expected_version`` and, when ``commit.owner`` is set (a
  worker's commit), the live lease is held by that owner; a commit without
  an owner (a control operation: retry, cancel) checks the version only.
  Otherwise it raises ``StaleVersionError`` and changes nothing.
  Re-applying a commit whose token is already stored is a no-op (a retried
  command whose reply was lost).
* The transcript is append-only between commits; only a commit with
  ``truncate_messages_to`` shortens it (a "full" retry). Reads never see the
  messages of an uncommitted turn (I4).
* A lease is an owner token with a time to live (I3). ``acquire_lease``
  succeeds only if the lease is free, expired, or already the caller's.
* ``record_step`` journals one step result, fenced like a commit: it raises
  ``StaleVersionError`` if the job's version is no longer ``version`` or
  ``owner`` (when given) does not hold the live lease.
* A pause/cancel request (``request_control``) is kept beside the record,
  returned on it (``record.control``) by every load, reported by ``commit``,
  and dropped by a commit with ``clear_control``.
* An invariant between two records is checked in the same atomic step that
  writes. The inbox and the status are such a pair: a run never completes
  past messages sent to it, and a finished job's inbox never grows (nothing
  would read it). So ``send`` appends only while the status is one of
  :data:`INBOX_OPEN` (checked inside the write: one script, one lock), and a
  commit with ``ends_run`` raises ``InboxNotEmptyError`` (nothing written)
  while the inbox holds more than the commit takes.
* Events are appended with their commit (or create) and get increasing ids;
  ``events(after=id)`` resumes a reader where it stopped.
* The due index holds every running job with its ``due_at``; ``due_jobs``
  reads it (I7: ``pipelines advance --due`` recovers lost messages from it).
* The listing indexes (every job, and one per status, by ``updated_at``)
  move with the record in the same atomic write; ``list_jobs`` pages through
  them newest first with a cursor (:func:`page_cursor`) and ``count_jobs``
  counts without reading records.

Scheduler contract
------------------
``schedule_advance`` asks for ``advance_phase(job_id)`` to run after
``delay`` seconds, at least once (``requeue``: now, ahead of other work
where the queue allows). ``tests/contract`` runs the same suite over every
scheduler. Delivery may be duplicated, early or late:
the runner tolerates all three (I6). ``now`` is the scheduler's clock, which
the runner uses for due times (the memory scheduler's clock is virtual).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol, runtime_checkable

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    Message,
    Usage,
    validate_job_id,
)

__all__ = [
    "AdvanceFn",
    "AsyncLiveStore",
    "CountingIndex",
    "FlowCapable",
    "Backlog",
    "BacklogProbe",
    "FEATURE_PROTOCOLS",
    "Feature",
    "FlowStore",
    "RecentHistory",
    "HistoryStore",
    "INBOX_OPEN",
    "InProcessScheduler",
    "InboxStore",
    "JobIndex",
    "JobStore",
    "LeaseStore",
    "LiveStore",
    "NamedQueues",
    "ReadStore",
    "RetentionStore",
    "RunStore",
    "Scheduler",
    "StepPublisher",
    "VersionedSchema",
    "Storage",
    "page_cursor",
    "parse_cursor",
]

INBOX_OPEN: tuple[JobStatus, ...] = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
"""The statuses in which a job takes messages into its inbox: a turn will still read them."""

AdvanceFn = Callable[[str], object]
"""What a scheduler calls to advance one job: ``fn(job_id)`` (its return value is ignored)."""


@runtime_checkable
class JobStore(Protocol):
    """Records and their atomic writes."""

    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record with its current journal and pending control request, or ``None`` for an unknown job."""
        ...

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` atomically or not at all (see the module docstring).

        Returns what a worker that keeps the lease must know as it stands
        after the commit: a pending control request (``"pause"``/``"cancel"``)
        and how many messages wait in the job's inbox.
        """
        ...

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal one step result under ``version``; fenced like ``commit``."""
        ...

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        """Count the usage of an attempt that was fenced off after paying (a model call it cannot commit).

        Outside the version fence, beside the record; loads report it as
        ``record.dropped``. A call re-sent with the same ``token`` counts once.
        """
        ...

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Store (or clear, with ``None``) a pause/cancel request beside the record; ``False`` for an unknown job.

        Never touches the record or its version, so a turn in flight still commits.
        """
        ...

    def delete_job(self, job_id: str) -> bool:
        """Remove a job and everything it owns; ``False`` if it did not exist."""
        ...


@runtime_checkable
class InboxStore(Protocol):
    """Messages sent to a running job (``app.send``), taken into the transcript at its next turn boundary.

    Sending is outside the version fence (a turn in flight still commits); a
    commit takes messages from the front (``Commit.take_inbox``) atomically
    with the turn that put them in the transcript, so each joins exactly once.
    The status is checked by the write itself, on both sides (see the
    storage contract): ``send`` against :data:`INBOX_OPEN`, a commit that
    ends the run (``Commit.ends_run``) against the inbox's length.
    """

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Append ``messages`` to the inbox; its new length, or ``None`` for an unknown job.

        Raises :class:`~pipelines.engine.errors.JobConflictError` naming the
        status, nothing appended, when the job's status (read in the same
        atomic step) is not one of :data:`INBOX_OPEN`.
        """
        ...

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting, in the order they were sent."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Who is running a job's phase right now (I3)."""

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the job's lease for ``ttl`` seconds and return the record.

        ``None`` when the job is unknown or another owner holds a live lease.
        """
        ...

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease if ``owner`` still holds it."""
        ...

    def release_lease(self, job_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        ...

    def lease_owner(self, job_id: str) -> str | None:
        """The owner of the live lease, if any."""
        ...


@runtime_checkable
class HistoryStore(Protocol):
    """What a job committed, read back: transcript, human log, events."""

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Committed transcript messages ``[start:stop]`` in order."""
        ...

    def logs(self, job_id: str) -> list[LogEntry]:
        """The job's log entries in the order they were committed."""
        ...

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Committed events in order, each with its ``id``; only those after the cursor ``after``."""
        ...


@runtime_checkable
class RecentHistory(Protocol):
    """A storage that reads a job's history from its end (a capability: memory, Redis and SQLite have it).

    A page shows a long job's latest events and log lines, a page at a time,
    at the cost of that page: not the whole history read to show its end.
    """

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, each with its ``id``; only those before the cursor ``before``."""
        ...

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """Up to ``limit`` log entries that come before the job's last ``skip`` (oldest first), and how many
        entries the job has."""
        ...


@runtime_checkable
class LiveStore(Protocol):
    """The live stream of a job: every committed event again, plus ephemeral parts a worker publishes.

    Text deltas are published outside any commit (the committed transcript
    stays the truth); a reader follows parts from a cursor, across turns,
    workers and crashes, and blocks on the storage for new ones (no polling).
    """

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts (``text_delta``, ``attempt_started``); nothing for an unknown job."""
        ...

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor ``after``, each with its ``id``; waits up to ``block`` seconds for one."""
        ...


@runtime_checkable
class AsyncLiveStore(Protocol):
    """A storage whose live stream ``async`` code reads without a thread (a capability: memory and Redis have it).

    ``aread_live`` is :meth:`LiveStore.read_live` for an event loop: the same
    parts, cursors and errors, but its wait holds no thread (a future the
    publisher resolves, or one ``XREAD BLOCK`` per event loop shared by every
    follower in it), so a thousand idle SSE clients cost no worker of the
    default executor. ``app.astream`` uses it; for a storage without it each
    read runs ``read_live`` in a thread.
    """

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """``read_live`` for ``async`` code: waits up to ``block`` seconds without holding a thread."""
        ...


@runtime_checkable
class JobIndex(Protocol):
    """Finding jobs: what is due (I7), and listings for people."""

    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Ids of running jobs whose ``due_at <= now``, earliest first."""
        ...

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Up to ``limit`` jobs, optionally only those in ``status``, newest ``updated_at`` first (ties: id).

        ``before`` is :func:`page_cursor` of the last job of the previous page:
        the listing goes on after it, whatever moved since (a job updated
        meanwhile moves to the front, it does not shift the pages).
        """
        ...


@runtime_checkable
class CountingIndex(Protocol):
    """A :class:`JobIndex` that counts jobs from its listing indexes (memory and Redis do).

    A port of its own, so a storage written before it (or a wrapper) is still a :class:`Storage`.
    """

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs there are (in ``status``), from the index: no record is read."""
        ...

    def reindex(self) -> int:
        """Put jobs written before the listing indexes existed into them; how many were (re)indexed."""
        ...


@runtime_checkable
class StepPublisher(Protocol):
    """A storage that journals a step and publishes live-stream parts in one write (a capability).

    The agent turn journals the model's answer with the last of its streamed
    text this way: one round trip instead of two. A storage without it gets
    ``record_step`` then ``publish``.
    """

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """``record_step``, then ``publish(parts)`` only if the step was journaled; a re-sent call publishes once."""
        ...


@runtime_checkable
class RunStore(JobStore, LeaseStore, InboxStore, Protocol):
    """What the engine needs to run a job: load, lease, journal, commit, the inbox, and publishing live parts.

    (``publish`` is declared on :class:`LiveStore`; a turn's live parts go through
    :mod:`pipelines.engine.writer`.)
    """

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts (``text_delta``, ``attempt_started``); nothing for an unknown job."""
        ...


@runtime_checkable
class ReadStore(HistoryStore, JobIndex, Protocol):
    """What readers need (the App's read model, the web page, the CLI): transcripts, logs, events with their
    cursors, the live stream, listings."""

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor ``after``, each with its ``id``; waits up to ``block`` seconds for one."""
        ...


@runtime_checkable
class Storage(RunStore, ReadStore, LiveStore, Protocol):
    """Where jobs, transcripts, logs, journals and leases live: the engine's port and the readers' together."""


class Feature(StrEnum):
    """An optional capability of an adapter, declared once by its class in ``features`` (see
    :func:`pipelines.engine.capabilities.has`); each stands for the protocol in :data:`FEATURE_PROTOCOLS`."""

    STEP_AND_PUBLISH = "step_and_publish"  # StepPublisher: journal a step and publish its parts in one write
    ASYNC_LIVE = "async_live"  # AsyncLiveStore: a follower's wait holds no thread
    COUNTS = "counts"  # CountingIndex: counts from the listing indexes, and reindex
    RETENTION = "retention"  # RetentionStore: a delete fenced on the version, and the finished index
    FLOW = "flow"  # FlowCapable: shared rate limits and concurrency slots in the storage
    BACKLOG = "backlog"  # Backlog: whether work of a priority waits in the queue
    BACKLOG_PROBE = "backlog_probe"  # BacklogProbe: ask that question without waiting for the answer
    IN_PROCESS = "in_process"  # InProcessScheduler: runs advances in this process (attach, drain)
    NAMED_QUEUES = "named_queues"  # NamedQueues: says which queue a run waits on
    SCHEMA = "schema"  # VersionedSchema: a file with a schema version that `pipelines migrate` upgrades
    RECENT = "recent"  # RecentHistory: a job's latest events and log lines, read from the end


@runtime_checkable
class Scheduler(Protocol):
    """Triggers an advance of a job, now or after a delay.

    ``precision``: how early (seconds) a delayed delivery may arrive; the
    runner accepts a message that early instead of dropping it (RQ: ~1 s).
    """

    precision: float

    def schedule_advance(
        self, job_id: str, delay: float = 0.0, *, pipeline: str = "default", version: int | None = None,
        priority: str | None = None,
    ) -> None:
        """Ask for ``job_id`` to be advanced after ``delay`` seconds (at least once).

        ``priority`` (``"interactive"``, the default, or ``"background"``):
        where the queue allows, interactive work is taken first.
        """
        ...

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        """Ask again, now, for an advance the queue lost (the sweep); ahead of other work where possible."""
        ...

    def now(self) -> float:
        """The scheduler's clock, in seconds since the epoch."""
        ...


@runtime_checkable
class InProcessScheduler(Scheduler, Protocol):
    """A scheduler that runs advances itself, in this process (the memory scheduler).

    It is attached once to the function that advances a job (the App's), and
    ``drain()`` runs what is scheduled. Queue schedulers have no such thing:
    their workers load the app by its import path.
    """

    def attach(self, advance: AdvanceFn) -> None:
        """Use ``advance(job_id)`` for every advance from now on."""
        ...

    def drain(self, *, max_advances: int = 1_000_000) -> int:
        """Run advances until none is scheduled; returns how many ran."""
        ...


@runtime_checkable
class Backlog(Protocol):
    """A scheduler that can tell whether work is waiting (optional; RQ and memory have it).

    The runner asks it before it keeps a job under ``continue_for``: a worker
    hands the job back as soon as other work of the same or a higher priority
    waits, so a busy conversation never makes a new one wait behind it.
    """

    def work_waiting(self, priority: str | None = None) -> bool:
        """Whether an advance of ``priority`` (or a higher one) is queued and due now."""
        ...


@runtime_checkable
class BacklogProbe(Protocol):
    """A :class:`Backlog` that can ask without waiting for the answer (optional; RQ has it).

    The runner asks before it runs a phase under ``continue_for`` and reads
    the answer when it commits that phase, so the question's round trip
    overlaps the phase instead of delaying it.
    """

    def probe_work_waiting(self, priority: str | None = None) -> Callable[[], bool]:
        """``work_waiting(priority)`` asked now; the returned function gives its answer (call it in every case)."""
        ...


@runtime_checkable
class FlowCapable(Protocol):
    """A storage that keeps flow-control state itself (memory and Redis do): the App uses it by default."""

    def flow_store(self) -> FlowStore:
        """The :class:`FlowStore` sharing this storage (and its clock or server)."""
        ...


@runtime_checkable
class FlowStore(Protocol):
    """Shared flow-control state (:mod:`pipelines.engine.flow`): rate buckets and concurrency slots.

    Every method is one atomic check-and-take; none ever waits. A refusal is
    the number of seconds after which trying again makes sense. ``now`` is the
    caller's clock (the memory twin's; Redis uses its own, one for all workers).
    """

    def take_rate(self, model: str, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                  now: float) -> float:
        """Take one request and ``tokens`` from ``model``'s bucket: 0 when granted, else seconds to wait."""
        ...

    def adjust_rate(self, model: str, tokens: int) -> None:
        """Take ``tokens`` more (or give back, when negative) from ``model``'s token bucket."""
        ...

    def block_rate(self, model: str, seconds: float, *, now: float) -> None:
        """Refuse every take of ``model`` for ``seconds`` (a provider's 429 with Retry-After)."""
        ...

    def take_slot(self, key: str, member: str, *, limit: int, ttl: float, now: float) -> float:
        """Hold one of ``limit`` slots of ``key`` for ``ttl`` seconds: 0 when held, else seconds to wait."""
        ...

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        """Extend ``member``'s live slot of ``key`` to ``ttl`` seconds from now; ``False`` (nothing written) if
        it holds none (released, or run out: a slot is never taken back past the limit here)."""
        ...

    def release_slot(self, key: str, member: str) -> None:
        """Give ``member``'s slot of ``key`` back (a no-op if it holds none)."""
        ...


@runtime_checkable
class NamedQueues(Protocol):
    """A queue scheduler that names the queue a run of each priority waits on (for people: hints, health)."""

    def queue_for(self, priority: str | None = None) -> str:
        """The name of the queue advances of ``priority`` (default: the highest) are sent to."""
        ...


@runtime_checkable
class VersionedSchema(Protocol):
    """A storage whose file keeps a schema version (SQLite): ``pipelines migrate`` upgrades it in place."""

    path: str  # where the data lives (a file's absolute path)

    def migrate(self) -> tuple[int, int]:
        """Upgrade the schema to this library's version; ``(before, after)``."""
        ...


@runtime_checkable
class RetentionStore(Protocol):
    """What retention needs beyond the port (memory and Redis have it): a delete fenced on the version, and the
    index of finished jobs."""

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Delete the job and everything it stored if it is at ``if_version`` (``StaleVersionError`` if not)."""
        ...

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first."""
        ...


FEATURE_PROTOCOLS: dict[Feature, type] = {
    Feature.STEP_AND_PUBLISH: StepPublisher,
    Feature.ASYNC_LIVE: AsyncLiveStore,
    Feature.COUNTS: CountingIndex,
    Feature.RETENTION: RetentionStore,
    Feature.FLOW: FlowCapable,
    Feature.BACKLOG: Backlog,
    Feature.BACKLOG_PROBE: BacklogProbe,
    Feature.IN_PROCESS: InProcessScheduler,
    Feature.NAMED_QUEUES: NamedQueues,
    Feature.SCHEMA: VersionedSchema,
    Feature.RECENT: RecentHistory,
}
"""The protocol each feature stands for: an adapter that declares a feature implements its protocol (the
contract suites check both ways)."""


# --- listing cursors ----------------------------------------------------------------------------
def page_cursor(record: JobRecord) -> str:
    """The cursor after ``record`` in a newest-first listing: ``list_jobs(before=page_cursor(last))``."""
    return f"{record.updated_at!r}/{record.job_id}"


def parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    """``(updated_at, job_id)`` of a :func:`page_cursor`; ``InvalidInputError`` naming what is wrong."""
    if cursor is None:
        return None
    when, sep, job_id = cursor.partition("/") if isinstance(cursor, str) else ("", "", "")
    try:
        updated = float(when)
        validate_job_id(job_id)
    except (ValueError, InvalidInputError):
        updated = math.nan
    if not sep or not math.isfinite(updated):
        raise InvalidInputError(f"bad listing cursor {str(cursor)[:80]!r}: expected <updated_at>/<job id> "
                                "(from page_cursor)")
    return updated, job_id
