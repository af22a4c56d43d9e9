"""``RedisStorage``: the production :class:`~adapters.base.Storage` on Redis 7 (standalone, Sentinel, Cluster).

Key layout (every name is built by :mod:`adapters.redis.keys`, nowhere
else; on Redis Cluster the same keys are bucketed, see there)::

    <prefix>:{<job>}:record    hash  data (record JSON), version, token, jver, hist (turn history, one mark a line)
    <prefix>:{<job>}:messages  list  one JSON message per entry (append-only)
    <prefix>:{<job>}:logs      list  one JSON log entry per entry
    <prefix>:{<job>}:journal   hash  step key -> JSON result, valid while jver == version
    <prefix>:{<job>}:lease     str   owner token, SET NX PX (Redis expires it)
    <prefix>:{<job>}:events    stream the durable event log (written by commits)
    <prefix>:{<job>}:live      stream the live parts: every event again, plus text deltas
                                      (bounded; expires once the job is finished)
    <prefix>:due               zset  running job ids scored by due_at
    <prefix>:jobs              set   every job id
    <prefix>:finished          zset  finished job ids scored by the time they finished (retention)
    <prefix>:updated           zset  every job id scored by updated_at (the listing, newest first)
    <prefix>:status:<status>   zset  the job ids in one status scored by updated_at (one key per status)
    <prefix>:layout            str   the layout written under this prefix (``buckets=<n>``)

The listing indexes are written by the same scripts as the records; jobs
written before they existed are put in by :meth:`RedisStorage.reindex`
(``pipelines reindex``); until then a listing reads every record instead.

Each check-then-write is one Lua script (:mod:`adapters.redis.scripts`), so
a commit is atomic and costs one round trip. Values are JSON text; nothing is
pickled. redis-py retries commands after connection errors, writes included,
so every write is idempotent: a commit or create re-sent after its reply was
lost finds its own token and reports success without writing again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit

import redis
from pydantic import ValidationError
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from adapters.base import Feature
from adapters.redis import archive as redis_archive
from adapters.redis import scripts as redis_scripts
from adapters.redis.client import _FAILOVER_ERRORS, _check_url, _mapped, _redact, driver_info, settle_driver_info
from adapters.redis.keys import (
    IndexKeys,
    JobKeys,
    KeyLayout,
    check_prefix,
    finished_key,
    index_keys,
    job_keys,
    layout_key,
    listing_keys,
)
from adapters.redis.listing import RedisIndexReads
from adapters.redis.live import RedisLiveReads
from adapters.redis.recent import RedisRecentReads
from adapters.redis.refs import JournalValues, slice_parts
from adapters.redis.values import (
    _FINISHED,
    _KEY_TYPES,
    _LIVE_KEPT,
    _dump_parts,
    _finished_at,
    _listed,
    _load_part,
    _score,
    _stale_message,
    _text,
    _ttl_ms,
)
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InboxNotEmptyError,
    InvalidInputError,
    JobConflictError,
    PipelineError,
    StaleVersionError,
    StorageError,
    StorageUnavailableError,
)
from pipelines.engine.events import LAST_CURSOR, check_cursor
from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    Message,
    TurnMark,
    Usage,
    check_messages,
    dump_json,
    dump_logs,
    dump_record,
)

__all__ = ["CLUSTER_BUCKETS", "DEFAULT_PREFIX", "JobKeys", "RedisStorage", "check_prefix", "finished_key",
           "index_keys", "job_keys", "listing_keys"]

DEFAULT_PREFIX = "pr"
_log = logging.getLogger("pipelines")
#: The buckets a storage on a Redis Cluster client uses unless told otherwise: enough to spread
#: over a few dozen masters, few enough that walking them all (the sweep, a listing) stays cheap.
CLUSTER_BUCKETS = 64
# How many jobs' stored histories a storage remembers, and how many bytes of their lines at most
# (one per job a worker is running, usually: a history holds up to HISTORY_BYTES of state).
_BASES_KEPT = 1024
_BASES_BYTES = 32 << 20


class _Base(NamedTuple):
    """The turn history a job's record hash holds, as the commit (or create) with ``token`` wrote it.

    A commit that keeps a prefix of it sends only the marks it adds and how many it drops: the
    history changes by one mark a turn but holds up to HISTORY_LIMIT of them.
    """

    token: str
    marks: list[TurnMark]
    lines: list[str]
    size: int  # bytes of lines, for the bound


class RedisStorage(RedisIndexReads, RedisLiveReads, RedisRecentReads):
    """The :class:`~adapters.base.Storage` port on Redis (standalone, Sentinel or Cluster; no modules).

    ``RedisStorage(client, prefix=...)`` uses an existing ``redis.Redis`` or
    ``redis.RedisCluster`` (its own retry policy applies); :meth:`from_url`
    builds one with retries, exponential backoff and jitter. ``client`` is
    public so an RQ scheduler can share the connection (not a Cluster's: RQ
    needs a plain Redis). Connection failures that outlast the retries raise
    :class:`StorageUnavailableError`, other Redis errors :class:`StorageError`,
    and a stored record that does not parse :class:`CorruptRecordError`.

    ``live_ttl``: how long a finished job's live stream (its last turn: the
    stream keeps only the turn in flight, see :mod:`adapters.redis.live`)
    stays after the job finished; readers then get its durable events.

    ``buckets``: how many hash-tagged buckets the indexes are split into
    (:mod:`adapters.redis.keys`). ``None`` means 0 (one global index, the
    layout of every earlier version) on a plain client and
    :data:`CLUSTER_BUCKETS` on a ``RedisCluster``, where 0 is refused. Every
    process on one prefix must use the same count: the first write records
    it, and a storage with another count raises :class:`ConfigurationError`.

    ``replicas``: each write waits (``WAIT``, up to ``replica_timeout``
    seconds) until that many replicas have it, else raises
    :class:`StorageUnavailableError`; with asynchronous replication (0, the
    default) a failover can lose the last writes a master acknowledged.
    ``failover_timeout``: on a Cluster, how long a write is retried while a
    replica takes over its slot.
    """

    #: What it can do beyond the port, declared once (checked by pipelines.engine.capabilities; the contract
    #: suite checks the declaration against the methods).
    features: ClassVar[frozenset[Feature]] = frozenset({
        Feature.STEP_AND_PUBLISH, Feature.ASYNC_LIVE, Feature.COUNTS, Feature.RETENTION, Feature.FLOW,
        Feature.RECENT})

    def __init__(self, client: redis.Redis | redis.RedisCluster, *, prefix: str = DEFAULT_PREFIX,
                 live_ttl: float = 3600.0, buckets: int | None = None, replicas: int = 0,
                 replica_timeout: float = 1.0, failover_timeout: float = 15.0, archive_events: bool = True) -> None:
        self.client: Any = client  # redis.Redis or redis.RedisCluster: the calls used here are on both
        settle_driver_info(client)  # before a forking worker forks: no horse looks redis-py's version up again
        self.prefix = check_prefix(prefix)
        self.cluster = isinstance(client, redis.RedisCluster)
        if buckets is None:
            buckets = CLUSTER_BUCKETS if self.cluster else 0
        if self.cluster and buckets == 0:
            raise ConfigurationError("a Redis Cluster needs buckets >= 1: the global indexes would be in another "
                                     "slot than the job's keys (CROSSSLOT)")
        self.layout = KeyLayout(self.prefix, buckets)
        self._layout_checked = False
        self._bases: dict[str, _Base] = {}
        self._bases_bytes = 0
        # What each job's journal holds, so a commit sends a journaled message as a reference.
        self._steps = JournalValues(jobs=_BASES_KEPT, max_bytes=_BASES_BYTES)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(f"replicas must be an int >= 0, got {replicas!r}")
        for name, value in (("replica_timeout", replica_timeout), ("failover_timeout", failover_timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ConfigurationError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        #: Replicas that must acknowledge each write (``WAIT``) before it counts; 0 = asynchronous replication.
        self.replicas = replicas
        self.replica_timeout = float(replica_timeout)
        #: How long a script is retried on a Cluster while a replica takes over a failed master.
        self.failover_timeout = float(failover_timeout)
        if isinstance(live_ttl, bool) or not isinstance(live_ttl, int | float) or not 0 < live_ttl < math.inf:
            raise ConfigurationError(f"live_ttl must be a finite number of seconds > 0, got {live_ttl!r}")
        #: How long a finished job's live stream (its last turn) is kept; its durable events stay with the job.
        self.live_ttl = float(live_ttl)
        #: The longest single XREAD BLOCK; below the client's socket timeout.
        self.max_block = 5.0
        # register_script runs EVALSHA and reloads the script after SCRIPT FLUSH.
        self._create = client.register_script(redis_scripts.CREATE)
        self._commit = client.register_script(redis_scripts.COMMIT)
        self._step = client.register_script(redis_scripts.RECORD_STEP)
        self._load_script = client.register_script(redis_scripts.LOAD)
        self._renew = client.register_script(redis_scripts.RENEW)
        self._release = client.register_script(redis_scripts.RELEASE)
        self._delete = client.register_script(redis_scripts.DELETE)
        self._control = client.register_script(redis_scripts.CONTROL)
        self._publish = client.register_script(redis_scripts.PUBLISH)
        self._send = client.register_script(redis_scripts.SEND)
        self._dropped = client.register_script(redis_scripts.DROPPED)
        self._reindex = client.register_script(redis_scripts.REINDEX)
        self._archive = client.register_script(redis_scripts.ARCHIVE)
        self._events = client.register_script(redis_scripts.EVENTS)
        self._read_live = client.register_script(redis_scripts.READ_LIVE)
        #: Whether a commit that finishes a job archives its events (see adapters.redis.archive).
        self.archive_finished = archive_events

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        retries: int = 5,
        backoff_base: float = 0.05,
        backoff_cap: float = 1.0,
        socket_timeout: float = 10.0,
        connect_timeout: float = 2.0,
        live_ttl: float = 3600.0,
        cluster: bool = False,
        buckets: int | None = None,
        replicas: int = 0,
        archive_events: bool = True,
    ) -> RedisStorage:
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
        _check_url(url)
        retry = Retry(ExponentialWithJitterBackoff(cap=backoff_cap, base=backoff_base), retries)
        client: redis.Redis | redis.RedisCluster
        try:
            if cluster:
                if urlsplit(url).path.strip("/") not in ("", "0"):
                    raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: a Redis Cluster has only database 0")
                # The cluster client retries a command on another node after a failover (MOVED, a dead node).
                # Its nodes' clients are made inside it: the driver info goes in here, not in __init__.
                client = redis.RedisCluster.from_url(url, retry=retry, socket_timeout=socket_timeout,
                                                     socket_connect_timeout=connect_timeout, **_driver_options())
            else:  # its connections get redis-py's driver info in __init__ (settle_driver_info)
                client = redis.Redis.from_url(url, retry=retry, socket_timeout=socket_timeout,
                                              socket_connect_timeout=connect_timeout)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: {exc}") from exc
        except redis.exceptions.RedisError as exc:  # a cluster client reads the slot map when it is made
            raise StorageUnavailableError(f"Redis Cluster at {_redact(url)!r} is unreachable: {exc}") from exc
        return cls(client, prefix=prefix, live_ttl=live_ttl, buckets=buckets, replicas=replicas,
                   archive_events=archive_events)

    def keys(self, job_id: str) -> JobKeys:
        """The Redis keys of ``job_id`` (validated)."""
        return self.layout.job(job_id)

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
        if self.layout.buckets:
            raise ConfigurationError(f"this storage splits its indexes into {self.layout.buckets} buckets: "
                                     "read them through storage.layout.indexes")
        return self.layout.indexes[0]

    def _all_keys(self, job_id: str) -> list[str]:
        k, ix = self.keys(job_id), self.layout.indexes_of(job_id)
        # The order the scripts expect (KEYS[1..10]); the live stream and the finished index came last.
        # The listing indexes stay at the very end: the scripts find them counting from the end.
        return [k.record, k.messages, k.logs, k.journal, k.lease, k.events, ix.due, ix.jobs, k.live,
                ix.finished, k.inbox, *ix.listing]

    def _run(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str, *, write: bool = True) -> Any:
        """Run one of the Lua scripts: on a plain Redis directly, on a Cluster on the node of its slot.

        On a Cluster a failover makes the slot's master unreachable for a few
        seconds; redis-py retries at once and gives up within milliseconds, so
        the call is retried here with backoff until ``failover_timeout``. Every
        script is idempotent (tokens, owner checks), so re-sending is safe.
        With ``replicas``, the write is followed by ``WAIT`` on the same
        connection: acknowledged means copied to that many replicas, so a
        failover cannot roll it back.
        """
        if not self.cluster and (not self.replicas or not write):
            with _mapped(what):
                return script(keys=keys, args=args)
        deadline, pause = time.monotonic() + self.failover_timeout, 0.05
        while True:
            try:
                with _mapped(what):
                    try:
                        return self._run_on_node(script, keys, args, what, write)
                    except _FAILOVER_ERRORS:
                        if not self.cluster or time.monotonic() + pause > deadline:
                            raise
                        self.client.nodes_manager.initialize()  # read the new slot map (a replica took over)
            except StorageUnavailableError:
                if not self.cluster or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _run_on_node(self, script: Any, keys: Sequence[str], args: Sequence[Any], what: str, write: bool) -> Any:
        node = self.client.get_node_from_key(keys[0]).redis_connection if self.cluster else self.client
        if not self.replicas or not write:
            return script(keys=keys, args=args, client=node)
        pipe = node.pipeline(transaction=False)  # one connection: WAIT counts that connection's writes
        script(keys=keys, args=args, client=pipe)
        pipe.wait(self.replicas, int(self.replica_timeout * 1000))
        reply, acked = pipe.execute()
        if int(acked) < self.replicas:
            raise StorageUnavailableError(f"{what}: written, but only {acked} of {self.replicas} replicas "
                                          f"acknowledged it within {self.replica_timeout}s (a failover could lose it)")
        return reply

    def _check_layout(self, job_id: str) -> None:
        """Record this prefix's layout on first use, or refuse to run with another one (once per storage)."""
        if self._layout_checked:
            return
        key, mine = layout_key(self.prefix), self.layout.description
        with _mapped(f"checking the key layout before writing job {job_id!r}"):
            if self.layout.buckets and self.client.get(key) is None and self.client.exists(index_keys(self.prefix)[1]):
                raise ConfigurationError(
                    f"prefix {self.prefix!r} holds jobs written without buckets (its {index_keys(self.prefix)[1]!r} "
                    f"index); a storage with buckets={self.layout.buckets} would never find them: keep buckets=0 "
                    "for this prefix, or use a new prefix")
            stored = self.client.set(key, mine, nx=True, get=True)
        if stored is not None and _text(stored) != mine:
            raise ConfigurationError(
                f"the jobs under prefix {self.prefix!r} were written with {_text(stored)}, this storage uses "
                f"{mine}: every process on one prefix must use the same buckets (a job would be looked up in "
                "the wrong bucket)"
            )
        self._layout_checked = True

    def _check_read_layout(self) -> None:
        """Before the first index read: refuse a prefix whose recorded layout is another (its indexes would read empty).

        Nothing recorded yet (no job written through a storage with the guard) reads what is there.
        """
        if self._layout_checked:
            return
        with _mapped("checking the key layout before reading the indexes"):
            stored = self.client.get(layout_key(self.prefix))
        if stored is None:
            return
        if _text(stored) != self.layout.description:
            raise ConfigurationError(
                f"the jobs under prefix {self.prefix!r} were written with {_text(stored)}, this storage uses "
                f"{self.layout.description}: its index reads (the sweep, listings, gc) would find none of them")
        self._layout_checked = True

    def _check_types(self, job_id: str, reply: Any, what: str) -> None:
        """Raise CorruptRecordError for a script's ``corrupt:<role>:<type>`` reply (nothing was written)."""
        if not isinstance(reply, bytes | str) or not _text(reply).startswith("corrupt:"):
            return
        _, role, found = _text(reply).split(":", 2)
        ix = self.layout.indexes_of(job_id)
        indexes = dict(zip(redis_scripts.INDEX_ROLES, ix.listing, strict=True))
        key = ({"due": ix.due, "jobs": ix.jobs, "finished": ix.finished, **indexes}.get(role)
               or getattr(self.keys(job_id), role))
        raise CorruptRecordError(
            f"{what}: key {key!r} ({role}) is a Redis {found}, expected a {_KEY_TYPES[role]} (WRONGTYPE); "
            "nothing was written"
        )

    # --- reading -------------------------------------------------------------
    def _load(self, job_id: str, owner: str = "", ttl_ms: str = "") -> JobRecord | None:
        k, ix = self.keys(job_id), self.layout.indexes_of(job_id)
        if owner:
            self._check_layout(job_id)  # before a worker's first turn, not before every read
        # A read unless it takes the lease (the leftovers of a job whose record is gone go in a write of their own).
        reply = self._run(self._load_script, [k.record, k.journal, k.lease, ix.due, ix.jobs, ix.listing[0]],
                          [owner, ttl_ms, job_id], f"loading job {job_id!r}", write=bool(owner))
        self._check_types(job_id, reply, f"loading job {job_id!r}")
        if reply is None:
            return None
        if isinstance(reply, bytes | str):  # 'gone': no record, but an index still names the job
            self._delete_leftovers(job_id)
            return None
        hist = reply[7] if len(reply) > 7 else None
        lines = _lines(hist) if hist is not None else []
        record = self._parse(job_id, reply[0], reply[1], reply[2], reply[3], hist, self._known_marks(job_id, lines))
        if owner and hist is not None:
            # A worker commits next: remember what the record hash holds, so that commit sends a delta.
            self._remember(job_id, _text(reply[6]), record.history, lines)
        if owner:
            self._remember_journal(job_id, record, reply[1], reply[2])
        waiting = int(_text(reply[4]) or 0)
        update: dict[str, Any] = {"inbox": waiting} if waiting else {}
        if len(reply) > 5 and reply[5]:
            update["dropped"] = Usage.model_validate_json(reply[5])
        return record.model_copy(update=update) if update else record

    def _remember(self, job_id: str, token: str, marks: list[TurnMark], lines: list[str]) -> None:
        self._forget_base(job_id)
        if not token:
            return  # a hand-made record without a token: its next commit sends the history whole
        size = sum(map(len, lines))
        while self._bases and (len(self._bases) >= _BASES_KEPT or self._bases_bytes + size > _BASES_BYTES):
            # Another thread may change the dict meanwhile: this is a bound, not an exact LRU.
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                self._forget_base(next(iter(self._bases)))  # the job remembered longest ago
        self._bases[job_id] = _Base(token, list(marks), lines, size)
        self._bases_bytes += size

    def _remember_journal(self, job_id: str, record: JobRecord, jver: Any, pairs: Sequence[Any]) -> None:
        if pairs and _text(jver) == str(record.version):
            # Bytes as Redis holds them (a client made with decode_responses hands back str).
            values = {_text(k): v if isinstance(v, bytes) else str(v).encode()
                      for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
            self._steps.reset(job_id, record.version, values)
        else:
            self._steps.forget(job_id)

    def _known_marks(self, job_id: str, lines: list[str]) -> list[TurnMark] | None:
        """The marks of ``lines`` where this storage parsed them before: the remembered history's tail, then the rest.

        A history moves by a mark or two a turn but holds up to HISTORY_LIMIT of them, so a worker
        that loaded or committed the job before parses only the marks added since (a late turn reads
        like an early one). ``None``: nothing remembered matches; the record is parsed whole.
        """
        base = self._bases.get(job_id)
        if base is None or not base.lines or not lines:
            return None
        try:
            drop = base.lines.index(lines[0])
        except ValueError:
            return None
        kept = len(base.lines) - drop
        if kept > len(lines) or lines[:kept] != base.lines[drop:]:
            return None
        try:
            return [*base.marks[drop:], *(TurnMark.model_validate_json(line) for line in lines[kept:])]
        except ValidationError:
            return None  # parsed whole, the record says what is wrong with it

    def _forget_base(self, job_id: str) -> None:
        old = self._bases.pop(job_id, None)
        if old is not None:
            self._bases_bytes -= old.size

    def _history(self, job_id: str, marks: list[TurnMark]) -> tuple[list[str], str, int, int]:
        """The history's lines, and the commit's history arguments: base token, marks dropped, first added.

        The engine builds each history from the last one (drop from the front, append), so the
        marks kept are the very objects remembered; anything else is sent whole (base '').
        """
        base = self._bases.get(job_id)
        if base is not None and marks and base.marks:
            first = marks[0]
            drop = next((i for i, m in enumerate(base.marks) if m is first), -1)
            kept = len(base.marks) - drop
            if drop >= 0 and kept <= len(marks) and all(a is b for a, b in zip(marks, base.marks[drop:],
                                                                                   strict=False)):
                lines = base.lines[drop:] + [_mark_line(m) for m in marks[kept:]]
                return lines, base.token, drop, kept
        return [_mark_line(m) for m in marks], "", 0, 0

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record with its current journal, or ``None`` (one round trip).

        A job whose record is gone (deleted by hand, evicted) while an index
        still names it loses its other keys and index entries here, logged
        once: its records live and die together, and its due entry would
        otherwise be reported unknown by every sweep.
        """
        return self._load(job_id)

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the lease (``SET PX``) and read the record in one atomic round trip."""
        return self._load(job_id, owner, _ttl_ms(ttl))

    def lease_owner(self, job_id: str) -> str | None:
        with _mapped(f"reading the lease of job {job_id!r}"):
            value = self.client.get(self.keys(job_id).lease)
        return None if value is None else _text(value)

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Messages ``[start:stop]`` (Python slice semantics) read with one LRANGE."""
        if stop == 0:
            return []  # LRANGE's end is inclusive: stop-1 == -1 would mean "to the end"
        with _mapped(f"reading the transcript of job {job_id!r}"):
            lines = self.client.lrange(self.keys(job_id).messages, start, -1 if stop is None else stop - 1)
        return [self._json_line(job_id, line, "transcript message") for line in lines]

    def logs(self, job_id: str) -> list[LogEntry]:
        with _mapped(f"reading the logs of job {job_id!r}"):
            lines = self.client.lrange(self.keys(job_id).logs, 0, -1)
        try:
            return [LogEntry.model_validate_json(line) for line in lines]
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored log entry of job {job_id!r} does not parse: {exc}") from exc

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Events after the cursor ``after`` (a stream id): the archived ones, then the stream's (one script)."""
        # Checked before the limit, so a bad cursor is refused whatever the limit.
        if check_cursor(after, "event cursor") == LAST_CURSOR or limit <= 0:
            return []  # nothing sorts after the largest id, and XRANGE refuses to start past it
        start = "-" if not after else f"({after}"  # "(" makes the start exclusive (Redis >= 6.2)
        k = self.keys(job_id)
        what = f"reading the events of job {job_id!r}"
        reply = self._run(self._events, [k.record, k.events], [start, str(limit), after or ""], what, write=False)
        self._check_types(job_id, reply, what)
        blob, entries = reply
        stream = [(_text(entry_id), self._entry(fields)) for entry_id, fields in entries]
        try:
            archived = redis_archive.unpack(_text(blob)) if blob else []
        except ValueError as exc:
            raise CorruptRecordError(f"the archived events of job {job_id!r}: {exc}") from exc
        return [self._event(job_id, entry_id, raw) for entry_id, raw in redis_archive.merge(archived, stream, after,
                                                                                          limit)]

    def archive_events(self, job_id: str) -> bool:
        """Move a finished job's events from its stream into one compressed field (see :mod:`adapters.redis.archive`).

        ``True`` if they moved; ``False`` if there was nothing to move, the job
        is not finished, or it moved on meanwhile (nothing written; try again
        later). Readers see the same events with the same ids either way.
        """
        k, ix = self.keys(job_id), self.layout.indexes_of(job_id)
        what = f"archiving the events of job {job_id!r}"
        reply = self._run(self._events, [k.record, k.events], ["-", "", ""], what, write=False)
        self._check_types(job_id, reply, what)
        blob, entries = reply
        if not entries:
            return False
        stream = [(_text(entry_id), self._entry(fields)) for entry_id, fields in entries]
        old = _text(blob) if blob else ""
        try:
            archived = redis_archive.unpack(old)
        except ValueError as exc:
            raise CorruptRecordError(f"the archived events of job {job_id!r}: {exc}") from exc
        new = redis_archive.pack([*archived, *stream])
        done = _text(self._run(self._archive, [k.record, k.events, ix.finished],
                               [job_id, stream[-1][0], str(len(old)), new], what))
        self._check_types(job_id, done, what)
        return done == "ok"

    def _archive_quietly(self, job_id: str) -> None:
        # After a commit that finished the job: the commit stands whatever happens here; a job left
        # unarchived still reads the same and is archived by a later call.
        try:
            self.archive_events(job_id)
        except PipelineError as exc:
            _log.warning("job %s: its events stay in their stream (archiving failed: %s)", job_id, exc)

    @staticmethod
    def _entry(fields: Any) -> str:
        if isinstance(fields, list):  # from a script: [field, value, ...]
            fields = dict(zip(fields[::2], fields[1::2], strict=False))
        raw = (fields or {}).get(b"e") or (fields or {}).get("e") or ""
        return _text(raw)

    @staticmethod
    def _event(job_id: str, entry_id: Any, raw: Any) -> Event:
        if not isinstance(raw, str | bytes):
            raw = RedisStorage._entry(raw)
        try:
            event = _load_part(raw)
        except (ValidationError, ValueError) as exc:
            raise CorruptRecordError(f"a stored event of job {job_id!r} does not parse: {exc}") from exc
        return event.model_copy(update={"id": _text(entry_id)})

    @staticmethod
    def _json_line(job_id: str, line: Any, what: str) -> Any:
        try:
            return json.loads(line)
        except ValueError as exc:
            raise CorruptRecordError(f"a stored {what} of job {job_id!r} does not parse: {exc}") from exc

    # --- writing -------------------------------------------------------------
    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        job_id = record.job_id
        keys = self._all_keys(job_id)
        data = _dump_data(record)
        marks = [_mark_line(m) for m in record.history]
        msgs = [dump_json(m, "a transcript message") for m in messages]
        lines = dump_logs(logs)
        event_lines = _dump_parts(events)
        cp = record.checkpoint
        due = _score(cp.due_at if record.status is JobStatus.RUNNING and cp is not None else None)
        token = uuid.uuid4().hex  # lets a re-sent create recognise itself
        self._check_layout(job_id)
        args = [job_id, token, data, str(record.version), due, len(msgs), len(lines), _finished_at(record),
                *_listed(record), "\n".join(marks), *msgs, *lines, *event_lines]
        reply = self._run(self._create, keys, args, f"creating job {job_id!r}")
        self._check_types(job_id, reply, f"creating job {job_id!r}")
        if _text(reply) == "exists":
            raise JobConflictError(f"job {job_id!r} already exists")

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` in one Lua script: fenced on version and lease, idempotent by token.

        On :class:`StorageUnavailableError` the commit may or may not have
        landed; sending the same ``Commit`` again is safe (its token).
        """
        job_id = commit.job_id
        keys = self._all_keys(job_id)
        # Serialise everything first: what JSON cannot carry fails here, with nothing written (I1).
        data = _dump_data(commit.record)
        marks, base, drop, kept = self._history(job_id, commit.record.history)
        msgs = [dump_json(m, "a transcript message") for m in commit.append_messages]
        # A message the journal already holds (the model's answer) is sent as a slice of it.
        sent = self._steps.refer(job_id, msgs) if msgs else None
        lines = dump_logs(commit.logs)
        event_lines = _dump_parts(commit.events)
        owner = commit.owner
        args: list[str | int] = [
            job_id, commit.token, data, str(commit.expected_version), str(commit.record.version),
            "0" if owner is None else "1", owner or "",
            "" if commit.truncate_messages_to is None else str(int(commit.truncate_messages_to)),
            "1" if commit.keep_journal else "0", "1" if commit.release_lease else "0",
            _score(commit.due_at), len(msgs), len(lines), "1" if commit.clear_control else "0",
            "" if commit.record.status in _LIVE_KEPT else _ttl_ms(self.live_ttl),
            _finished_at(commit.record), str(int(commit.take_inbox)), *_listed(commit.record),
            base, str(drop), "\n".join(marks[kept:]), "1" if commit.ends_run else "0",
            *(sent or msgs), *lines, *event_lines,
        ]
        at, first = redis_scripts.COMMIT_ARGS.history, redis_scripts.COMMIT_ARGS.fixed
        self._forget_base(job_id)  # the stored history is unknown until this commit's reply
        self._steps.forget(job_id)  # the commit ends the journal (the next load remembers a kept one)
        reply = _text(self._run(self._commit, keys, args, f"committing job {job_id!r}"))
        if reply == "rebase":
            # The record hash is not the one the delta was computed from (recreated meanwhile?), or the
            # journal does not hold a message sent by reference: send both whole.
            args[at:at + 3] = ["", "0", "\n".join(marks)]
            args[first:first + len(msgs)] = msgs
            reply = _text(self._run(self._commit, keys, args, f"committing job {job_id!r}"))
        self._check_types(job_id, reply, f"committing job {job_id!r}")
        if reply.startswith(("stale:", "inbox:")):
            raise _refused(job_id, reply, commit)
        if commit.record.status is JobStatus.RUNNING:
            # The same worker commits the job's next turn without loading it (continue_for): a delta.
            # Its next load (the next queued turn) parses only the marks added since (_known_marks).
            self._remember(job_id, commit.token, commit.record.history, marks)
        if self.archive_finished and commit.record.status in _FINISHED:
            self._archive_quietly(job_id)
        _, pending, waiting = reply.split(":", 2)
        return CommitReply(pending or None, int(waiting or 0))

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Append messages to the job's inbox (outside the version fence); its new length, ``None`` if unknown."""
        k = self.keys(job_id)
        lines = [dump_json(m, "a message sent to the job") for m in check_messages(messages, "messages sent")]
        if not lines:
            raise InvalidInputError("send needs at least one message")
        reply = self._run(self._send, [k.record, k.inbox], [uuid.uuid4().hex, *lines],
                          f"sending messages to job {job_id!r}")
        self._check_types(job_id, reply, f"sending messages to job {job_id!r}")
        if isinstance(reply, bytes | str):  # 'closed:<status>': checked in the script that appends
            raise JobConflictError(f"job {job_id!r} is {_text(reply).removeprefix('closed:')}: "
                                   "its inbox takes no messages (nothing appended)")
        return None if int(reply) < 0 else int(reply)

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting in the job's inbox, in the order they were sent."""
        if count <= 0:
            return []
        with _mapped(f"reading the inbox of job {job_id!r}"):
            lines = self.client.lrange(self.keys(job_id).inbox, 0, count - 1)
        return [self._json_line(job_id, line, "inbox message") for line in lines]

    # --- the live stream ------------------------------------------------------
    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts to the job's live stream (one round trip; nothing for an unknown job)."""
        if not parts:
            return
        k = self.keys(job_id)
        lines = _dump_parts(parts)
        reply = self._run(self._publish, [k.record, k.live], [uuid.uuid4().hex, *lines],
                          f"publishing to the live stream of job {job_id!r}")
        self._check_types(job_id, reply, f"publishing to the live stream of job {job_id!r}")

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        """Count usage of a fenced-off attempt (outside the version fence; a re-sent call counts once)."""
        add = usage.model_dump(exclude_defaults=True)
        if not add:
            return
        reply = self._run(self._dropped, [self.keys(job_id).record], [token, json.dumps(add)],
                          f"counting dropped usage of job {job_id!r}")
        self._check_types(job_id, reply, f"counting dropped usage of job {job_id!r}")

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Store (or clear) a pause/cancel request in the record hash, outside the version fence."""
        k = self.keys(job_id)
        reply = self._run(self._control, [k.record], [request or ""],
                          f"requesting {request or 'no'} control of job {job_id!r}")
        self._check_types(job_id, reply, f"requesting control of job {job_id!r}")
        return bool(reply)

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal one step result under ``version``; fenced like ``commit``."""
        self.record_step_and_publish(job_id, version=version, owner=owner, key=key, value=value, parts=())

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal one step result and append ``parts`` to the live stream, in one script (one round trip).

        The parts are published only if the step is journaled (same fence); a
        call redis-py re-sends after a lost reply publishes them once.
        """
        k = self.keys(job_id)
        text = dump_json(value, f"result of step {key!r}")
        lines = _dump_parts(parts)
        # The text streamed with a model's answer is inside the answer: sent once (redis_refs).
        sliced = slice_parts(text, lines) if lines else None
        args = [str(version), "0" if owner is None else "1", owner or "", key, text, *(sliced or lines)]
        keys = [k.record, k.journal, k.lease, k.live] if lines else [k.record, k.journal, k.lease]
        reply = _text(self._run(self._step, keys, args, f"journaling step {key!r} of job {job_id!r}"))
        self._check_types(job_id, reply, f"journaling step {key!r} of job {job_id!r}")
        if reply == "badpart":  # the adapter's own encoding: a bug here, never the caller's input
            raise StorageError(f"journaling step {key!r} of job {job_id!r}: the script refused a live-stream "
                               "part sent as a slice of the value; nothing was written")
        if reply.startswith("stale:"):
            self._steps.forget(job_id)
            raise StaleVersionError(_stale_message(job_id, reply, f"step {key!r} at version {version} not recorded"))
        self._steps.remember(job_id, version, key, text)

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        reply = self._run(self._renew, [self.keys(job_id).lease], [owner, _ttl_ms(ttl)],
                          f"renewing the lease of job {job_id!r}")
        self._check_types(job_id, reply, f"renewing the lease of job {job_id!r}")
        return bool(reply)

    def release_lease(self, job_id: str, owner: str) -> None:
        reply = self._run(self._release, [self.keys(job_id).lease], [owner], f"releasing the lease of job {job_id!r}")
        self._check_types(job_id, reply, f"releasing the lease of job {job_id!r}")

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Remove the job's keys and index entries in one script; ``False`` if it did not exist.

        The job's own keys go whatever their type (so a corrupt job can be
        deleted); an index key of the wrong type is CorruptRecordError.
        ``if_version``: delete only if the job is still at that version, else
        :class:`StaleVersionError` with nothing deleted (the caller judged the
        job deletable at that version).
        """
        args = [job_id, "" if if_version is None else str(int(if_version))]
        reply = self._run(self._delete, self._all_keys(job_id), args, f"deleting job {job_id!r}")
        self._check_types(job_id, reply, f"deleting job {job_id!r}")
        if isinstance(reply, bytes | str) and _text(reply).startswith("stale:"):
            raise StaleVersionError(_stale_message(job_id, _text(reply), f"delete expected version {if_version}"))
        return bool(reply)

    def _delete_leftovers(self, job_id: str) -> None:
        """Delete what a job whose record is gone left (keys, index entries); a job created again is left alone."""
        what = f"deleting the leftovers of job {job_id!r}, whose record is gone"
        reply = self._run(self._delete, self._all_keys(job_id), [job_id, "", "gone"], what)
        self._check_types(job_id, reply, what)
        if isinstance(reply, bytes | str):
            return  # 'present': created again since the load saw no record
        due, keys, listed = (int(n) for n in reply)
        if due or keys or listed:  # a second loader racing the first finds nothing left: said once
            _log.warning("job %s: its record is gone (deleted outside the app, or evicted); removed %s%d leftover "
                         "key(s) (events, live stream, logs, transcript, journal, inbox) and its index entries",
                         job_id, "its due entry, " if due else "", keys)

    def flow_store(self) -> Any:
        """The flow-control state on this Redis, under this prefix (a :class:`~adapters.redis.flow.RedisFlowStore`)."""
        from adapters.redis.flow import RedisFlowStore  # only apps with flow control load it

        store = self.__dict__.get("_flow")
        if store is None:
            store = self.__dict__["_flow"] = RedisFlowStore(self.client, prefix=self.prefix)
        return store


def _driver_options() -> dict[str, Any]:
    info = driver_info()
    return {} if info is None else {"driver_info": info}


def _refused(job_id: str, reply: str, commit: Commit) -> StaleVersionError:
    """The error for a commit the script refused with nothing written: fenced off, or a run's end past its inbox."""
    if reply.startswith("inbox:"):
        waiting = int(reply.removeprefix("inbox:"))
        return InboxNotEmptyError(f"job {job_id!r}: {waiting - commit.take_inbox} message(s) sent to it wait in its "
                                  "inbox; the run does not end past them", waiting=waiting)
    return StaleVersionError(_stale_message(job_id, reply, f"commit expected {commit.expected_version}"))


def _dump_data(record: JobRecord) -> str:
    """The record's ``data`` field: its JSON without the turn history (kept in ``hist``, one mark a line)."""
    what = f"the record of job {record.job_id!r}"
    return dump_record(record.model_copy(update={"history": []}) if record.history else record, what)


def _mark_line(mark: TurnMark) -> str:
    # dump_json escapes every newline inside strings, so a mark is always one line.
    return dump_json(mark.model_dump(), "a turn mark of the record's history")


def _lines(hist: Any) -> list[str]:
    text = _text(hist)
    return text.split("\n") if text else []
