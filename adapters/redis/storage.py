"""``RedisStorage``: the production :class:`~adapters.base.Storage` on Redis 7 (standalone, Sentinel, Cluster).

The keys, what each holds and how they are named (unbucketed, or bucketed on a Redis Cluster) are in
:mod:`adapters.redis.keys`. The listing indexes are written by the same scripts as the records; jobs written
before they existed are put in by :meth:`RedisStorage.reindex` (``pipelines reindex``); until then a listing
reads every record instead.

Each check-then-write is one Lua script (:mod:`adapters.redis.scripts`), so a commit is atomic and costs one
round trip. Values are JSON text; nothing is pickled. redis-py retries commands after connection errors,
writes included, so every write is idempotent: a commit or create re-sent after its reply was lost finds its
own token and reports success without writing again.

``RedisStorage`` is composed of parts, each an object it holds, and its methods hand each call to one of them
(their modules say more): ``conn`` (the client, the key layout, the scripts: ``connection``), ``records``
(loading a record, what a worker remembers of it), ``writes``, ``history`` (the durable events and their
archive: ``events``), ``live``, ``recent`` and ``indexes`` (the due, finished and listing indexes: ``listing``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import redis

from adapters.base import Feature, FinishedEntry, LeaseState
from adapters.redis.connection import CLUSTER_BUCKETS, RedisConnection, connect_url
from adapters.redis.events import EventReads
from adapters.redis.keys import (
    IndexKeys,
    JobKeys,
    KeyLayout,
    check_prefix,
    finished_key,
    index_keys,
    job_keys,
    listing_keys,
)
from adapters.redis.listing import IndexReads
from adapters.redis.live import LiveReads
from adapters.redis.recent import RecentReads
from adapters.redis.records import RecordReads
from adapters.redis.values import _ttl_ms
from adapters.redis.writes import RecordWrites
from pipelines.engine.errors import ConfigurationError
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
)

__all__ = ["CLUSTER_BUCKETS", "DEFAULT_PREFIX", "JobKeys", "RedisStorage", "check_prefix", "finished_key",
           "index_keys", "job_keys", "listing_keys"]

DEFAULT_PREFIX = "pr"


class RedisStorage:
    """The :class:`~adapters.base.Storage` port on Redis (standalone, Sentinel or Cluster; no modules).

    ``RedisStorage(client, prefix=...)`` uses an existing ``redis.Redis`` or ``redis.RedisCluster`` (its own retry
    policy applies); :meth:`from_url` builds one with retries, exponential backoff and jitter. ``client`` is public
    so an RQ scheduler can share the connection (not a Cluster's: RQ needs a plain Redis). Connection failures that
    outlast the retries raise :class:`StorageUnavailableError`, other Redis errors :class:`StorageError`, and a
    stored record that does not parse :class:`CorruptRecordError`.

    ``live_ttl``: how long a finished job's live stream (its last two runs: the stream keeps only the run in flight
    and the one before, see :mod:`adapters.redis.live`) stays after the job finished; readers then get its durable
    events.

    ``buckets``: how many hash-tagged buckets the indexes are split into (:mod:`adapters.redis.keys`). ``None``
    means 0 (one global index, the layout of every earlier version) on a plain client and :data:`CLUSTER_BUCKETS` on
    a ``RedisCluster``, where 0 is refused. Every process on one prefix must use the same count: the first write (or
    ``pipelines worker``, at start) records it, and a storage with another count raises :class:`ConfigurationError`.

    ``replicas``: each write waits (``WAIT``, up to ``replica_timeout`` seconds) until that many replicas have it,
    else raises :class:`StorageUnavailableError`; with asynchronous replication (0, the default) a failover can lose
    the last writes a master acknowledged. ``failover_timeout``: on a Cluster, how long a write is retried while a
    replica takes over its slot.
    """

    #: What it can do beyond the port, declared once (pipelines.engine.capabilities; the contract suite checks it).
    features: ClassVar[frozenset[Feature]] = frozenset({
        Feature.STEP_AND_PUBLISH, Feature.ASYNC_LIVE, Feature.COUNTS, Feature.RETENTION, Feature.FLOW,
        Feature.RECENT, Feature.KEY_PREFIX, Feature.LEASE_HISTORY, Feature.FENCED_ANSWERS, Feature.STEP_BEFORE_COMMIT})

    def __init__(self, client: redis.Redis | redis.RedisCluster, *, prefix: str = DEFAULT_PREFIX,
                 live_ttl: float = 3600.0, buckets: int | None = None, replicas: int = 0,
                 replica_timeout: float = 1.0, failover_timeout: float = 15.0, archive_events: bool = True) -> None:
        #: The client, the key layout and the registered scripts, shared by every part.
        self.conn = RedisConnection(client, prefix=prefix, buckets=buckets, replicas=replicas,
                                    replica_timeout=replica_timeout, failover_timeout=failover_timeout)
        if isinstance(live_ttl, bool) or not isinstance(live_ttl, int | float) or not 0 < live_ttl < math.inf:
            raise ConfigurationError(f"live_ttl must be a finite number of seconds > 0, got {live_ttl!r}")
        #: Loading a record (with its journal, taking the lease), its lists, what a worker remembers of it.
        self.records = RecordReads(self.conn)
        #: The durable events: the stream, then a finished job's archive.
        self.history = EventReads(self.conn)
        #: Every write, one script each.
        self.writes = RecordWrites(self.conn, self.records, self.history, live_ttl=float(live_ttl),
                                   archive_finished=archive_events)
        #: Following the live stream (sync and async).
        self.live = LiveReads(self.conn, self.history)
        #: A job's latest events and log lines, newest first.
        self.recent = RecentReads(self.conn)
        #: The due, finished and listing indexes.
        self.indexes = IndexReads(self.conn)
        self._flow: Any = None

    @classmethod
    def from_url(cls, url: str, *, prefix: str = DEFAULT_PREFIX, retries: int = 5, backoff_base: float = 0.05,
                 backoff_cap: float = 1.0, socket_timeout: float = 10.0, connect_timeout: float = 2.0,
                 live_ttl: float = 3600.0, cluster: bool = False, buckets: int | None = None, replicas: int = 0,
                 archive_events: bool = True) -> RedisStorage:
        """Connect lazily to ``redis://[user:password@]host[:port][/db]`` (``rediss://`` for TLS).

        ``cluster=True``: the URL names one node of a Redis Cluster (the
        others are discovered); the indexes are split into ``buckets``
        (default :data:`CLUSTER_BUCKETS`) so no script crosses a slot.

        Connection errors are retried ``retries`` times with full-jitter
        exponential backoff (``backoff_base * 2**n``, at most ``backoff_cap``
        seconds); redis-py applies the policy both to connecting and to each
        command, so with the defaults an unreachable server is reported as
        :class:`StorageUnavailableError` after a few seconds (about 20 s at
        worst). A malformed URL raises :class:`ConfigurationError`; nothing
        connects until the first call.
        """
        client = connect_url(url, retries=retries, backoff_base=backoff_base, backoff_cap=backoff_cap,
                             socket_timeout=socket_timeout, connect_timeout=connect_timeout, cluster=cluster)
        return cls(client, prefix=prefix, live_ttl=live_ttl, buckets=buckets, replicas=replicas,
                   archive_events=archive_events)

    def close(self) -> None:
        """Close the client's connections (a later call opens new ones), as ``SQLiteStorage.close`` does.

        A journal write this thread sent without waiting (:class:`~adapters.base.StepBeforeCommit`) has its
        reply read first: what it reports (a fenced-off attempt) is not lost with the connection.
        """
        self.conn.close()

    # --- the connection's settings -------------------------------------------
    @property
    def client(self) -> Any:
        """The ``redis.Redis`` or ``redis.RedisCluster`` client (public: an RQ scheduler may share it)."""
        return self.conn.client

    def key_prefix(self) -> str:
        """The prefix of every key this storage writes (queue message ids carry it: ``for_storage``)."""
        return self.conn.prefix

    prefix = property(key_prefix)
    cluster = property(lambda self: self.conn.cluster)

    @property
    def layout(self) -> KeyLayout:
        return self.conn.layout

    @property
    def scripts(self) -> Any:
        """The registered Lua scripts (:class:`~adapters.redis.connection.Scripts`)."""
        return self.conn.scripts

    @property
    def replicas(self) -> int:
        """Replicas that must acknowledge each write (``WAIT``) before it counts; 0 = asynchronous replication."""
        return self.conn.replicas

    @property
    def replica_timeout(self) -> float:
        return self.conn.replica_timeout

    @property
    def failover_timeout(self) -> float:
        """How long a script is retried on a Cluster while a replica takes over a failed master."""
        return self.conn.failover_timeout

    @property
    def live_ttl(self) -> float:
        """How long a finished job's live stream (its last two runs) is kept; its durable events stay with the job."""
        return self.writes.live_ttl

    @property
    def archive_finished(self) -> bool:
        """Whether a commit that finishes a job archives its events (see :mod:`adapters.redis.archive`)."""
        return self.writes.archive_finished

    @archive_finished.setter
    def archive_finished(self, value: bool) -> None:
        self.writes.archive_finished = value

    @property
    def max_block(self) -> float:
        """The longest single ``XREAD BLOCK``; below the client's socket timeout."""
        return self.live.max_block

    @max_block.setter
    def max_block(self, value: float) -> None:
        self.live.max_block = value

    def keys(self, job_id: str) -> JobKeys:
        """The Redis keys of ``job_id`` (validated)."""
        return self.conn.keys(job_id)

    # The unbucketed layout's global index keys (tests and tools of a standalone Redis read them).
    @property
    def due_key(self) -> str:
        return self._global().due

    @property
    def jobs_key(self) -> str:
        return self._global().jobs

    @property
    def finished_key(self) -> str:
        return self._global().finished

    @property
    def listing_keys(self) -> list[str]:
        return list(self._global().listing)

    def _global(self) -> IndexKeys:
        if self.conn.layout.buckets:
            raise ConfigurationError(f"this storage splits its indexes into {self.conn.layout.buckets} buckets: "
                                     "read them through storage.layout.indexes")
        return self.conn.layout.indexes[0]

    # --- reading a job (RecordReads, EventReads, RecentReads, LiveReads) -------
    def get_job(self, job_id: str) -> JobRecord | None:
        """The record with its current journal, or ``None`` (one round trip).

        A job whose record is gone (deleted by hand, evicted) while an index still names it loses its other keys
        and index entries here, logged once: its records live and die together, and its due entry would
        otherwise be reported unknown by every sweep.
        """
        return self.records.load(job_id)

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the lease (``SET PX``) and read the record in one atomic round trip."""
        return self.records.load(job_id, owner, _ttl_ms(ttl))

    def lease_owner(self, job_id: str) -> str | None:
        return self.records.lease_owner(job_id)

    def lease_state(self, job_id: str) -> LeaseState:
        """The live owner, and whether the last lease taken ran out (its ``held`` mark outlived the lease key)."""
        return self.records.lease_state(job_id)

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Messages ``[start:stop]`` (Python slice semantics) read with one LRANGE."""
        return self.records.messages(job_id, start, stop)

    def logs(self, job_id: str) -> list[LogEntry]:
        return self.records.logs(job_id)

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting in the job's inbox, in the order they were sent."""
        return self.records.inbox(job_id, count)

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Events after the cursor ``after`` (a stream id): the archived ones, then the stream's (one script)."""
        return self.history.events(job_id, after=after, limit=limit)

    def archive_events(self, job_id: str) -> bool:
        """Move a finished job's events from its stream into one compressed field (see :mod:`adapters.redis.archive`).

        ``True`` if they moved; ``False`` if there was nothing to move, the job is not finished, or it moved on
        meanwhile (nothing written; try again later). Readers see the same events with the same ids either way.
        """
        return self.history.archive_events(job_id)

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, before the cursor ``before`` (a stream id)."""
        return self.recent.recent_events(job_id, before=before, limit=limit)

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """The job's last log lines (``skip`` newest ones left out), oldest first, and how many it has."""
        return self.recent.recent_logs(job_id, skip=skip, limit=limit)

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor, waiting up to ``block`` seconds for one (see :mod:`adapters.redis.live`)."""
        return self.live.read_live(job_id, after=after, limit=limit, block=block)

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """:meth:`read_live` for ``async`` code: the same parts, and the wait holds no thread."""
        return await self.live.aread_live(job_id, after=after, limit=limit, block=block)

    # --- the indexes (IndexReads) ----------------------------------------------
    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Running jobs with ``due_at <= now``, earliest first (ties by id), via ZRANGEBYSCORE."""
        return self.indexes.due_jobs(now, limit=limit)

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Jobs (optionally in ``status``), newest ``updated_at`` first, read from the listing indexes."""
        return self.indexes.list_jobs(status=status, limit=limit, before=before)

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs (in ``status``): ZCARD of a listing index (reads every record until :meth:`reindex`)."""
        return self.indexes.count_jobs(status)

    def unindexed(self) -> int:
        """About how many jobs are missing from the listing indexes (written before they existed)."""
        return self.indexes.unindexed()

    def reindex(self, *, batch: int = 500) -> int:
        """Put every job in the listing indexes and drop entries of jobs gone; how many jobs were indexed."""
        return self.indexes.reindex(batch=batch)

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first."""
        return self.indexes.finished_jobs(before, limit=limit)

    def finished_page(self, before: float, *, after: FinishedEntry | None = None,
                      limit: int = 1000) -> list[FinishedEntry]:
        """``(finish time, id)`` of jobs finished by ``before``, oldest first (ties: id), after the cursor ``after``."""
        return self.indexes.finished_page(before, after=after, limit=limit)

    # --- writing (RecordWrites) --------------------------------------------------
    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        self.writes.create_job(record, messages=messages, logs=logs, events=events)

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` in one Lua script: fenced on version and lease, idempotent by token.

        On :class:`StorageUnavailableError` the commit may or may not have
        landed; sending the same ``Commit`` again is safe (its token).
        """
        return self.writes.commit(commit)

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Append messages to the job's inbox (outside the version fence); its new length, ``None`` if unknown."""
        return self.writes.send(job_id, messages)

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts to the job's live stream (one round trip; nothing for an unknown job)."""
        self.writes.publish(job_id, parts)

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        """Count usage of a fenced-off attempt (outside the version fence; a re-sent call counts once)."""
        self.writes.add_dropped_usage(job_id, usage, token=token)

    def add_fenced_answer(self, job_id: str, usage: Usage, entry: JSONValue, *, token: str) -> None:
        """Count a fenced-off attempt's usage and keep its answer (the record hash's ``fenced``), in one script."""
        self.writes.add_fenced_answer(job_id, usage, entry, token=token)

    def fenced_answers(self, job_id: str) -> list[JSONValue]:
        return self.records.fenced_answers(job_id)

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Store (or clear) a pause/cancel request in the record hash, outside the version fence."""
        return self.writes.request_control(job_id, request)

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        return self.writes.postpone(job_id, version=version, due_at=due_at)

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal one step result under ``version``; fenced like ``commit``."""
        self.writes.record_step(job_id, version=version, owner=owner, key=key, value=value)

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal one step result and append ``parts`` to the live stream, in one script (one round trip)."""
        self.writes.record_step_and_publish(job_id, version=version, owner=owner, key=key, value=value, parts=parts)

    def record_step_before_commit(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                  parts: Sequence[Event] = (), on_refused: Callable[[], None] | None = None) -> None:
        """``record_step``, its reply read with the commit (:class:`~adapters.base.StepBeforeCommit`)."""
        self.writes.record_step_before_commit(job_id, version=version, owner=owner, key=key, value=value,
                                              parts=parts, on_refused=on_refused)

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        return self.writes.renew_lease(job_id, owner, ttl)

    def release_lease(self, job_id: str, owner: str) -> None:
        self.writes.release_lease(job_id, owner)

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Remove the job's keys and indexes in one script (``False``: none); ``if_version``: or StaleVersionError."""
        return self.writes.delete_job(job_id, if_version=if_version)

    def flow_store(self) -> Any:
        """The flow-control state on this Redis, under this prefix (a :class:`~adapters.redis.flow.RedisFlowStore`)."""
        from adapters.redis.flow import RedisFlowStore  # only apps with flow control load it

        store = self._flow
        if store is None:
            store = self._flow = RedisFlowStore(self.client, prefix=self.prefix)
        return store
