"""The :class:`~adapters.base.Scheduler` port on RQ: every advance is an RQ job.

Only data crosses the queue (I8). An RQ job here is::

    func   "<the worker's advance>"           (an import string, never a callable: WorkerEntry.advance)
    args   [job_id, version]                  (JSON)
    kwargs {"app": "pkg.mod:app"}             (only when the scheduler names its app)

and every Queue, Job and registry this module touches uses RQ's
``JSONSerializer``; nothing is pickled. The message carries data, never a
choice of code: ``pipelines worker`` runs no other function and no callback
(:mod:`adapters.rq.entry`), and only its own app. The function's path is the
App's to tell (:class:`~adapters.base.WorkerEntry`, given to :meth:`RQScheduler.bind`
when the App is built): this module never names the composing layer.

One RQ job id per turn (see :mod:`adapters.rq.ids`): a worker that enqueued its
successor under its own id would re-run forever, and enqueuing an id that
is still waiting is a harmless duplicate we skip.

Delays use ``Queue.enqueue_at`` (workers must run RQ's scheduler: ``pipelines worker`` does; ``rq worker
--with-scheduler`` otherwise). RQ keeps whole seconds (a delay is sent for the second at or after its end) and its
scheduler moves due work once a second: up to :meth:`RQScheduler.lateness` late, never early; what comes early
anyway (two machines' clocks), within :attr:`RQScheduler.precision`, the runner holds until its time. One that RQ's
scheduler has not moved :data:`SCHEDULER_LATE` seconds after its time is lost: the sweep's requeue sends it again.

Redis errors are translated here, at the edge: connection problems become
:class:`~pipelines.engine.errors.StorageUnavailableError`, anything else
:class:`~pipelines.engine.errors.StorageError`.
"""

from __future__ import annotations

import math
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, cast

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RQJobStatus
from rq.serializers import JSONSerializer

from adapters.base import Feature, SchedulerHost
from adapters.redis.keys import check_prefix
from adapters.redis.pending import SideConnections
from adapters.redis.storage import DEFAULT_PREFIX
from adapters.rq.ids import RQJobRef, decode_rq_job_id, escape, parse_rq_job_id, rq_job_id
from pipelines.engine.errors import ConfigurationError, InvalidInputError, StorageError, StorageUnavailableError
from pipelines.engine.models import validate_job_id

if TYPE_CHECKING:
    from adapters.redis.storage import RedisStorage

__all__ = [
    "QUEUE_LISTING_INTERVAL",
    "RQJobRef",
    "RQScheduler",
    "SCHEDULER_LATE",
    "decode_rq_job_id",
    "parse_rq_job_id",
    "rq_job_id",
]

DEFAULT_JOB_TIMEOUT = 900
"""RQ kills a horse after this many seconds; keep it above the longest phase."""
DEFAULT_RESULT_TTL = 300
"""Finished RQ jobs (a short string result) are kept this long, then vanish."""
DEFAULT_FAILURE_TTL = 7 * 24 * 3600
"""Failed RQ jobs stay in the failed registry this long, for inspection."""

QUEUE_LISTING_INTERVAL = 60.0
"""Seconds between this process's additions of a queue to RQ's set of queues (``rq:queues``), which
RQ would send with every enqueue: the set changes only when a queue is made or deleted."""

# RQ states in which an enqueued advance may still run, if its message is where RQ takes it from (the
# queue, the scheduled registry): a message lost between RQ's writes keeps "created" or "queued" in no
# list. Any other state (started, finished, failed, ...) may be a message lost or done: enqueued again.
_PENDING = {RQJobStatus.QUEUED, RQJobStatus.SCHEDULED, RQJobStatus.DEFERRED, RQJobStatus.CREATED}

SCHEDULER_LATE = 5.0
"""Seconds past its time after which a delayed advance still in RQ's scheduled registry counts as lost.

RQ's scheduler is one process per queue (the holder of a lock) that moves due
messages to the queue every second. An exception (a Redis restart) ends it, and
RQ's workers only try to start another at their maintenance, every 10 minutes:
meanwhile the registry holds due messages that nothing moves. One that late is
taken out of the registry and enqueued again (the sweep's recovery of I7).
"""


@contextmanager
def _redis_errors(what: str) -> Iterator[None]:
    """Translate redis-py exceptions into phaserunner's (the adapter edge)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StorageUnavailableError(f"{what}: Redis unreachable: {exc}") from exc
    except redis.RedisError as exc:
        raise StorageError(f"{what}: Redis error: {exc}") from exc


class RQScheduler:
    """Schedules advances as RQ jobs on ``queue`` (see the module docstring).

    ``app``: the import path of the :class:`~pipelines.app.App` workers should
    use (``"pkg.mod:app"``); when ``None`` the worker's own app is used.
    ``namespace``: the key prefix of the storage whose jobs this scheduler
    advances; it is part of every RQ job id, so apps sharing one Redis never
    overwrite each other's RQ jobs (:meth:`for_storage` takes it from the
    storage).
    ``job_timeout``/``result_ttl``/``failure_ttl`` go on every RQ job
    explicitly; RQ's ``ttl`` is never set, because a job not started in time
    would silently vanish.
    """

    features: ClassVar[frozenset[Feature]] = frozenset({
        Feature.BACKLOG, Feature.BACKLOG_PROBE, Feature.NAMED_QUEUES, Feature.HOSTED, Feature.LATE_DELIVERY})
    def lateness(self) -> float:
        """How late a delayed advance may arrive: its whole second, then RQ's scheduler, which looks every second."""
        return 2.0

    def __init__(
        self,
        connection: redis.Redis,
        *,
        queue: str = "pipelines",
        app: str | None = None,
        job_timeout: int = DEFAULT_JOB_TIMEOUT,
        result_ttl: int = DEFAULT_RESULT_TTL,
        failure_ttl: int = DEFAULT_FAILURE_TTL,
        precision: float = 1.0,
        namespace: str = DEFAULT_PREFIX,
    ) -> None:
        check_prefix(namespace, "an RQ namespace")
        if isinstance(connection, redis.RedisCluster):
            # RQ's queue operations span several keys (queue, registries, job hashes) with no hash tags.
            raise ConfigurationError("RQ does not support Redis Cluster: give the scheduler a plain Redis for the "
                                     "queues (RQScheduler.for_storage(storage, connection=redis.Redis(...)))")
        if not queue or not isinstance(queue, str):
            raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
        if app is not None and ":" not in app:
            raise ConfigurationError(f"app must look like 'package.module:app', got {app!r}")
        for name, value in (("job_timeout", job_timeout), ("result_ttl", result_ttl), ("failure_ttl", failure_ttl)):
            if not isinstance(value, int) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
        self.connection = connection
        self._side = SideConnections(connection)  # where probe_work_waiting asks, beside the pool
        self.namespace = namespace
        self.queue_name = queue
        self.app = app
        self.job_timeout = job_timeout
        self.result_ttl = result_ttl
        self.failure_ttl = failure_ttl
        self.precision = float(precision)
        self._entry: str | None = None  # what a message names for the worker to run: the App tells (bind)
        self._listed: dict[str, float] = {}  # queue key -> when this process last added it to RQ's set of queues
        self.queue = Queue(queue, connection=connection, serializer=JSONSerializer)
        #: Queues by priority, highest first: ``pipelines worker`` listens on them in this order.
        self.queues: dict[str, Queue] = {
            "interactive": self.queue,
            "background": Queue(f"{queue}-background", connection=connection, serializer=JSONSerializer),
        }

    def bind(self, host: SchedulerHost) -> None:
        """Name ``host``'s worker entry (:attr:`~adapters.base.WorkerEntry.advance`) in every message from now on."""
        self._entry = host.worker_entry.advance

    @property
    def entry_point(self) -> str:
        """The function every message names; :class:`ConfigurationError` before an App is built with this scheduler."""
        if self._entry is None:
            raise ConfigurationError("this RQScheduler is part of no App yet, so it does not know what a worker "
                                     "runs: build App(storage=..., scheduler=this scheduler) before scheduling")
        return self._entry

    @classmethod
    def for_storage(cls, storage: RedisStorage, *, queue: str = "pipelines", app: str | None = None,
                    connection: redis.Redis | None = None, **options: Any) -> RQScheduler:
        """A scheduler namespaced by ``storage``'s key prefix, on its Redis client or on ``connection``.

        ``connection``: a plain Redis for the queues, required when the
        storage is on a Redis Cluster (RQ does not support Cluster); the jobs
        stay in the cluster. ``options`` are the other keyword arguments of
        the constructor (``job_timeout``, ``result_ttl``, ``failure_ttl``,
        ``precision``).
        """
        if "namespace" in options:
            raise ConfigurationError("for_storage takes the namespace from the storage")
        try:  # a RedisStorage, or a wrapper that hands its attributes on (OffloadingStorage)
            client, prefix, cluster = storage.client, storage.prefix, storage.cluster
        except AttributeError:
            raise ConfigurationError(f"RQScheduler.for_storage needs a RedisStorage (its queues live on that Redis), "
                                     f"got {type(storage).__name__}; for {type(storage).__name__} use its own "
                                     "scheduler, or RQScheduler(redis.Redis(...), ...)") from None
        if connection is None and cluster:
            raise ConfigurationError("the storage is on a Redis Cluster, which RQ does not support: pass "
                                     "connection=redis.Redis(...) for the queues")
        return cls(connection or client, queue=queue, app=app, namespace=prefix, **options)

    # --- Scheduler -----------------------------------------------------------
    def now(self) -> float:
        return time.time()

    def schedule_advance(
        self, job_id: str, delay: float = 0.0, *, pipeline: str = "default", version: int | None = None,
        priority: str | None = None,
    ) -> None:
        """Enqueue ``advance_job(job_id, version)`` now, or after ``delay`` seconds via RQ's scheduler.

        The same ``(job_id, version)`` still waiting in RQ is not enqueued twice.
        ``priority="background"`` sends it to the background queue (``<queue>-background``).
        """
        validate_job_id(job_id)
        if not isinstance(delay, int | float) or delay < 0 or delay != delay:
            raise InvalidInputError(f"delay must be a number of seconds >= 0, got {delay!r}")
        rq_id = self._rq_id(job_id, version)
        self._send(rq_id, job_id, version, delay, pipeline, at_front=False, queue=self._queue_for(priority))

    def _queue_for(self, priority: str | None) -> Queue:
        queue = self.queues.get(priority or "interactive")
        if queue is None:
            raise InvalidInputError(f"priority must be one of {', '.join(self.queues)}, got {priority!r}")
        return queue

    def queue_for(self, priority: str | None = None) -> str:
        """The name of the queue advances of ``priority`` (default: ``interactive``) go to."""
        return str(self._queue_for(priority).name)

    @property
    def queue_names(self) -> list[str]:
        """The queues a worker listens on, highest priority first."""
        return [q.name for q in self.queues.values()]

    def work_waiting(self, priority: str | None = None) -> bool:
        """Whether an advance of ``priority`` or a higher one waits in its queue (one round trip)."""
        return self._waiting_now(self._queue_keys(priority))

    def probe_work_waiting(self, priority: str | None = None) -> Callable[[], bool]:
        """:meth:`work_waiting` asked now, answered when the returned function is called.

        The ``LLEN`` commands are written at once and their replies read by the
        call, so the round trip overlaps whatever the caller does in between
        (the runner: the phase it then commits). They go on a connection of
        this thread's own, beside the client's pool
        (:class:`adapters.redis.pending.SideConnections`), so nothing the caller
        does meanwhile waits for a connection. Call it in every case; a
        second question asked on a thread before the first is answered is
        answered at once.
        """
        keys = self._queue_keys(priority)
        pending = self._side.ask([("LLEN", key) for key in keys])
        if pending is None:
            waiting = self._waiting_now(keys)
            return lambda: waiting

        def answer() -> bool:
            with _redis_errors("reading queue lengths"):
                return any(int(n) > 0 for n in pending.replies())

        return answer

    def _queue_keys(self, priority: str | None) -> list[str]:
        """The keys of the queues of ``priority`` and those above it."""
        queues = list(self.queues.values())
        return [q.key for q in queues[: queues.index(self._queue_for(priority)) + 1]]

    def _waiting_now(self, keys: list[str]) -> bool:
        with _redis_errors("reading queue lengths"):
            pipe = self.connection.pipeline(transaction=False)
            for key in keys:
                pipe.llen(key)
            return any(int(n) > 0 for n in pipe.execute())

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> bool:
        """Enqueue an advance the queue lost (a dead worker's turn) at the *front* of the queue.

        What the sweep uses: a recovered job has already waited a lease and a
        sweep interval, so it does not queue again behind the whole backlog.
        Returns whether a message was sent: ``False`` when the turn's message
        still waits in the queue or RQ's scheduled registry (a job queued
        behind busy workers is not lost).
        """
        validate_job_id(job_id)
        rq_id = self._rq_id(job_id, version)
        return self._send(rq_id, job_id, version, 0.0, pipeline, at_front=True, queue=self._queue_for(priority))

    def _send(self, rq_id: str, job_id: str, version: int | None, delay: float, pipeline: str, *,
              at_front: bool, queue: Queue | None = None) -> bool:
        """Enqueue ``rq_id`` unless its message still waits; whether a message was sent."""
        q = queue or self.queue
        with _redis_errors(f"scheduling job {job_id!r}"):
            try:
                self._enqueue(rq_id, job_id, version, delay, pipeline, unique=True, at_front=at_front, queue=q)
            except DuplicateJobError:
                if not self._still_pending(rq_id, q):
                    self._enqueue(rq_id, job_id, version, delay, pipeline, unique=False, at_front=at_front, queue=q)
                elif self._due_later(rq_id, q, delay):
                    # The message waiting under this id is due later than this one (a job deleted and made
                    # again under its id, whose old run had a turn waiting a day at this version): it must not
                    # hold this one back. Sent under an id of its own (one: a sweep sends it once), and the
                    # later one finds its turn done.
                    return self._send(f"{rq_id}-a", job_id, version, delay, pipeline, at_front=at_front, queue=q)
                else:
                    return False  # it still waits where RQ takes it from
        return True

    # --- helpers -------------------------------------------------------------
    def _rq_id(self, job_id: str, version: int | None) -> str:
        if version is not None:
            return rq_job_id(job_id, version, self.namespace)
        # Without a version there is no turn to name; a random id never collides
        # with "-v<digits>" ids, and duplicates are the runner's business (I6).
        return f"{escape(job_id, self.namespace)}-x{uuid.uuid4().hex}"

    def _enqueue(self, rq_id: str, job_id: str, version: int | None, delay: float, pipeline: str, *,
                 unique: bool, at_front: bool = False, queue: Queue | None = None) -> Job:
        q = queue or self.queue
        func = self.entry_point  # refuses before anything is sent when no App told it
        options: dict[str, Any] = {
            "args": [job_id, version],
            "kwargs": {"app": self.app} if self.app is not None else {},
            "job_id": rq_id,
            "job_timeout": self.job_timeout,
            "result_ttl": self.result_ttl,
            "failure_ttl": self.failure_ttl,
            "description": f"advance {job_id} v{version} ({pipeline})",
            "unique": unique,
        }
        if delay > 0:
            # RQ keeps a delayed job's time in whole seconds, cut down (and moves what is due by the whole
            # second): the second at or after the due time, so that it never arrives early.
            at = datetime.fromtimestamp(math.ceil(time.time() + delay), tz=UTC)
            return cast(Job, q.enqueue_at(at, func, **options))
        # RQ adds the queue to its set of queues (what `rq info` and Queue.all() list) before every enqueue,
        # in a round trip of its own unless given a pipeline. Given ours, that SADD waits in it: it goes with
        # RQ's own writes when they wait there too (an enqueue that is not unique), else (a unique enqueue runs
        # its script at once) only when this process has not listed the queue for QUEUE_LISTING_INTERVAL.
        with self.connection.pipeline() as pipe:
            job = q.enqueue(func, at_front=at_front, pipeline=pipe, **options)
            now = time.monotonic()
            if not unique or now - self._listed.get(q.key, -QUEUE_LISTING_INTERVAL) >= QUEUE_LISTING_INTERVAL:
                pipe.execute()
                self._listed[q.key] = now
        return job

    def _due_later(self, rq_id: str, queue: Queue, delay: float) -> bool:
        """Whether the pending message ``rq_id`` waits in RQ's scheduled registry past ``delay`` from now."""
        at = self.connection.zscore(queue.scheduled_job_registry.key, rq_id)
        return at is not None and float(at) > time.time() + delay + SCHEDULER_LATE

    def _still_pending(self, rq_id: str, queue: Queue | None = None) -> bool:
        q = queue or self.queue
        try:
            job = Job.fetch(rq_id, connection=self.connection, serializer=JSONSerializer)
        except NoSuchJobError:
            return False
        if job.get_status(refresh=False) not in _PENDING:
            return False
        # Whatever its status says, only a message RQ will take waits: one in the queue, or in the
        # scheduled registry. RQ 3 moves a message to an intermediate list when a worker takes it,
        # before marking it started (a worker killed in between leaves it "queued" in no queue), and a
        # message lost between RQ's writes keeps "created"; we never make RQ dependencies, so nothing
        # would ever move one "deferred".
        if self.connection.lpos(q.key, rq_id) is not None:
            return True
        registry = q.scheduled_job_registry.key
        at = self.connection.zscore(registry, rq_id)
        if at is None:
            return False
        if at > time.time() - SCHEDULER_LATE:
            return True  # not yet due, or due a moment ago: RQ's scheduler moves it
        # No scheduler moved it (see SCHEDULER_LATE): the caller enqueues it again now. Taken out of
        # the registry first, so a scheduler started later does not deliver it a second time.
        self.connection.zrem(registry, rq_id)
        return False

    def fetch(self, rq_id: str) -> Job:
        """The RQ job ``rq_id``, read with the JSON serializer (for tests and tools)."""
        with _redis_errors(f"fetching RQ job {rq_id!r}"):
            return Job.fetch(rq_id, connection=self.connection, serializer=JSONSerializer)


_DEPRECATED_ADVANCE_FUNC = "pipelines.worker.advance_job"  # the old alias's value (see __getattr__)


def __getattr__(name: str) -> str:
    # Deprecated for one release: the App tells its scheduler what a worker runs (App.worker_entry), so this
    # adapter no longer names the composing layer; the one exception is this alias, until it goes.
    if name == "ADVANCE_FUNC":
        warnings.warn(f"{__name__}.ADVANCE_FUNC is deprecated (the App tells its scheduler the worker's entry: "
                      "App.worker_entry); it goes in the next release", DeprecationWarning, stacklevel=2)
        return _DEPRECATED_ADVANCE_FUNC
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
