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

Modules
-------
The ports are split by side: :mod:`adapters.base.run` (what the engine needs
to run a job), :mod:`adapters.base.read` (what readers need),
:mod:`adapters.base.storage` (the whole :class:`Storage` and its optional
capabilities), :mod:`adapters.base.scheduling` (the scheduler port) and
:mod:`adapters.base.features` (the :class:`Feature` declarations). Import
them from here.
"""

from __future__ import annotations

from adapters.base.features import FEATURE_PROTOCOLS, Feature
from adapters.base.read import (
    AsyncLiveStore,
    CountingIndex,
    HistoryStore,
    JobIndex,
    LiveStore,
    ReadStore,
    RecentHistory,
    page_cursor,
    parse_cursor,
)
from adapters.base.run import (
    FENCED_KEPT,
    INBOX_OPEN,
    FencedAnswers,
    InboxStore,
    JobStore,
    LeaseHistory,
    LeaseState,
    LeaseStore,
    RunStore,
    StepBeforeCommit,
    StepPublisher,
)
from adapters.base.scheduling import (
    AdvanceFn,
    Backlog,
    BacklogProbe,
    HostedScheduler,
    InProcessScheduler,
    LateDelivery,
    NamedQueues,
    Scheduler,
    SchedulerHost,
    WorkerEntry,
)
from adapters.base.storage import (
    ClaimingStore,
    FinishedEntry,
    FlowCapable,
    FlowStore,
    KeyPrefixed,
    RetentionStore,
    Storage,
    VersionedSchema,
)

__all__ = [
    "AdvanceFn",
    "AsyncLiveStore",
    "ClaimingStore",
    "HostedScheduler",
    "KeyPrefixed",
    "SchedulerHost",
    "WorkerEntry",
    "CountingIndex",
    "FlowCapable",
    "Backlog",
    "BacklogProbe",
    "FEATURE_PROTOCOLS",
    "FENCED_KEPT",
    "Feature",
    "FencedAnswers",
    "FlowStore",
    "RecentHistory",
    "HistoryStore",
    "INBOX_OPEN",
    "InProcessScheduler",
    "LateDelivery",
    "InboxStore",
    "JobIndex",
    "JobStore",
    "LeaseHistory",
    "LeaseState",
    "LeaseStore",
    "LiveStore",
    "NamedQueues",
    "ReadStore",
    "FinishedEntry",
    "RetentionStore",
    "RunStore",
    "Scheduler",
    "StepBeforeCommit",
    "StepPublisher",
    "VersionedSchema",
    "Storage",
    "page_cursor",
    "parse_cursor",
]
