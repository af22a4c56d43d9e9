"""What a ``pipelines worker`` leaves behind when it dies: nothing that runs on, nothing that claims to live.

Whatever lives with a lease is renewed with it and released with it. RQ's
forking worker runs each job in a work-horse (in a process group of its
own) and RQ's scheduler in a child process that holds a lock on the queues.
A ``kill -9`` of the worker alone used to leave both running: the horse
committed its turn after its worker was gone, and the orphaned scheduler
kept renewing its lock, so a replacement worker started no scheduler. And
RQ records an idle worker's heartbeat only every ~7 minutes, so a dead
worker looked alive to ``pipelines health`` for minutes.

:class:`Lifeline`, a mixin over RQ's workers (see :mod:`adapters.rq.priority`):

* the horse gets ``SIGKILL`` when its worker dies: the turn it ran is
  abandoned as if the machine had died, and the job's lease, no longer
  renewed, lets another worker run the turn again (I3, I7);
* the scheduler child gets ``SIGTERM``, RQ's own stop: it releases its lock
  within a second, and the next worker to start takes it;
* the worker sets :func:`alive_key` with a TTL of ``alive_ttl`` seconds and
  renews it every ``alive_every`` from a thread on a connection of its own;
  it deletes it when it stops. ``pipelines health`` counts a worker alive
  only while that key exists (workers that mark their RQ record with
  :data:`ALIVE_FIELD`; others by RQ's heartbeat);
* a worker started under a fixed name (``--name``: systemd, a StatefulSet)
  takes over the RQ registration a dead worker of that name left (RQ keeps
  it up to ~8 minutes and refuses the name meanwhile), once that worker's
  alive key has lapsed (:func:`claim_name`); a live one is refused;
* the beat puts the worker's RQ registration back when Redis lost it (a
  restart without persistence, ``FLUSHALL``): RQ never rebuilds it, and
  ``pipelines health`` would find no worker while this one serves jobs.

Children learn of their parent's death from Linux's ``PR_SET_PDEATHSIG``;
elsewhere a thread of theirs watches ``os.getppid()``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import threading
import time
from typing import Any

import redis

from adapters.redis.held import pool_only_process
from adapters.redis.pending import one_question_process
from pipelines.engine.errors import ConfigurationError

__all__ = ["ALIVE_FIELD", "Lifeline", "alive_key", "claim_name", "watch_parent"]

logger = logging.getLogger(__name__)

ALIVE_FIELD = "pipelines_alive_ttl"
"""The field of RQ's worker record saying that the worker keeps :func:`alive_key` (its value: the TTL)."""

_PR_SET_PDEATHSIG = 1
try:
    # Looked up here, not in a child just forked: there it makes one foreign call and nothing else.
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def alive_key(worker_name: str) -> str:
    """The key a live ``pipelines worker`` named ``worker_name`` keeps (on its queues' Redis)."""
    return f"pipelines:worker-alive:{worker_name}"


def watch_parent(sig: int, parent: int, *, poll: float = 0.5) -> None:
    """In a child that ``parent`` just forked: get ``sig`` when ``parent`` dies (at once if it already has)."""
    if _prctl is None or _prctl(_PR_SET_PDEATHSIG, sig) != 0:
        threading.Thread(target=_poll_parent, args=(sig, parent, poll), name="pipelines-parent-watch",
                         daemon=True).start()
    if os.getppid() != parent:  # it died before the watch was set: nothing else would tell
        os.kill(os.getpid(), sig)


def _poll_parent(sig: int, parent: int, poll: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll)
    os.kill(os.getpid(), sig)


def _child_started(worker: Lifeline) -> None:
    """After-fork hook of every multiprocessing child (RQ's scheduler is one): live with the worker that forked it."""
    parent = multiprocessing.parent_process()
    # A process some phase starts in a horse runs this too; only the worker's own children are its to end.
    if parent is not None and parent.pid == worker.lifeline_pid:
        watch_parent(signal.SIGTERM, worker.lifeline_pid)


def claim_name(worker: Any, *, poll: float = 0.2) -> None:
    """Before RQ registers ``worker``: clear the registration a dead worker of its name left; refuse a live one.

    RQ refuses a name while a registration without a death date exists, and
    a worker killed with ``kill -9`` leaves one for up to its TTL (~8
    minutes). It is proven dead only when it kept :func:`alive_key` (its
    record has :data:`ALIVE_FIELD`) and that key lapsed: waited for here, at
    most its TTL, and a renewal seen meanwhile means it lives.
    :class:`ConfigurationError` when it lives or cannot be judged.
    """
    conn: redis.Redis = worker.connection
    death, ttl_field, pid, host = conn.hmget(worker.key, ["death", ALIVE_FIELD, "pid", "hostname"])
    if not conn.exists(worker.key) or death is not None:
        return  # no registration, or a worker that stopped: RQ takes the name
    who = f"{worker.name!r} (pid {_text(pid)} on {_text(host)})"
    if ttl_field is None:
        raise ConfigurationError(
            f"an RQ worker named {who} is registered and keeps no alive key, so it cannot be proven dead; stop "
            f"it, start this worker with another --name, or wait {conn.ttl(worker.key)} s for RQ's registration "
            f"to expire")
    key = alive_key(worker.name)
    deadline = time.monotonic() + float(_text(ttl_field)) + 1
    last = conn.pttl(key)
    while last >= 0 and time.monotonic() < deadline:
        time.sleep(poll)
        left = conn.pttl(key)
        if left > last:
            break  # renewed: it lives
        last = left
    # Claimed with NX: of two workers starting under one name, one goes on.
    if last >= 0 or not conn.set(key, str(os.getpid()), nx=True, px=int(float(_text(ttl_field)) * 1000)):
        raise ConfigurationError(f"a worker named {who} is alive (it renews {key}); stop it first, or start this "
                                 f"one with another --name")
    from rq import Worker

    dead = Worker.find_by_key(worker.key, connection=conn, serializer=worker.serializer)
    if dead is not None:
        dead.register_death()  # type: ignore[no-untyped-call]  # RQ's own: out of its sets, marked dead, gone in 60 s
    logger.warning("worker %s: took over the registration of a dead worker of that name %s", worker.name, who)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _Beat:
    """The thread that keeps :func:`alive_key` of one worker, on a client of its own (a fork never shares it)."""

    def __init__(self, connection: redis.Redis, key: str, every: float, ttl: float, worker: Any = None) -> None:
        self.worker = worker  # whose RQ registration is put back when it vanished (None: from stop() on)
        pool = connection.connection_pool
        self.client = redis.Redis(connection_pool=pool.__class__(connection_class=pool.connection_class,
                                                                 **pool.connection_kwargs))
        self.key, self.every, self.ttl_ms = key, every, max(1, int(ttl * 1000))
        self.failing = False
        self.stopping = threading.Event()
        self.beat()  # once before the work loop, so the worker is alive when it takes its first job
        self.thread = threading.Thread(target=self.run, name="pipelines-alive", daemon=True)
        self.thread.start()

    def beat(self) -> None:
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.set(self.key, str(os.getpid()), px=self.ttl_ms)
                worker = self.worker
                if worker is not None:  # is its RQ registration still there?
                    pipe.hexists(worker.key, ALIVE_FIELD)
                    pipe.sismember(worker.redis_workers_keys, worker.key)
                    pipe.hexists(worker.key, "death")
                replies = pipe.execute()
            if worker is not None and not (replies[1] and replies[2]) and not replies[3]:
                self.register_again(worker)
        except redis.RedisError as exc:
            if not self.failing:  # once per outage, not every few seconds
                logger.warning("could not renew %s (%s); trying again every %gs", self.key, exc, self.every)
            self.failing = True
            return
        if self.failing:
            logger.warning("renewed %s again", self.key)
        self.failing = False

    def register_again(self, worker: Any) -> None:
        """Put back ``worker``'s RQ registration, which RQ never rebuilds once Redis lost it.

        A Redis restart without persistence, or a ``FLUSHALL``, drops the
        worker's record and RQ's sets of workers while the worker goes on
        serving: ``pipelines health``, ``rq info`` and the web page would
        count it nowhere until it restarted.
        """
        from rq import worker_registration

        state = getattr(worker, "_state", None) or "idle"
        # RQ's WorkerStatus is a (str, Enum): str() of it is "WorkerStatus.IDLE"; RQ stores its value.
        data = {**worker.serialize(), "state": str(getattr(state, "value", state))}
        with self.client.pipeline() as pipe:
            pipe.hset(worker.key, mapping=data)
            worker_registration.register(worker, pipe)
            pipe.expire(worker.key, int(worker.worker_ttl) + 60)
            if self.worker is None:  # stop() began meanwhile: a worker that stops stays unregistered
                return
            pipe.execute()
        logger.warning("worker %s: its RQ registration was gone (Redis restarted without its data?); "
                       "registered it again", worker.name)

    def run(self) -> None:
        while not self.stopping.wait(self.every):
            self.beat()

    def stop(self) -> None:
        self.worker = None
        self.stopping.set()
        self.thread.join(self.every + 1)
        with contextlib.suppress(redis.RedisError):
            self.client.delete(self.key)
        self.client.close()
        self.client.connection_pool.disconnect()  # its own pool: a client given one leaves it open on close()


class Lifeline:
    """Mixin over an RQ worker: its horse and scheduler end with it; it keeps :func:`alive_key` (module docstring)."""

    alive_every: float = 3.0
    alive_ttl: float = 10.0
    lifeline_pid: int = 0
    name: str
    connection: redis.Redis
    _beat: _Beat | None = None

    def serialize(self) -> dict[str, Any]:
        data: dict[str, Any] = super().serialize()  # type: ignore[misc]
        data[ALIVE_FIELD] = f"{self.alive_ttl:g}"
        return data

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        self.lifeline_pid = os.getpid()
        # RQ forks its scheduler with multiprocessing, whose after-fork hooks run in the child before its work.
        multiprocessing.util.register_after_fork(self, _child_started)
        claim_name(self)
        super().bootstrap(*args, **kwargs)  # type: ignore[misc]
        self._beat = _Beat(self.connection, alive_key(self.name), self.alive_every, self.alive_ttl, self)

    def main_work_horse(self, job: Any, queue: Any) -> None:
        if self.lifeline_pid:  # 0: forked by a worker that never bootstrapped (RQ's work() always does)
            watch_parent(signal.SIGKILL, self.lifeline_pid)
        one_question_process()  # a horse runs one job: its first question costs no connection of its own
        pool_only_process()  # nor do the turn's calls (adapters/redis/held.py)
        super().main_work_horse(job, queue)  # type: ignore[misc]

    def teardown(self) -> None:
        if self._beat is not None and os.getpid() == self.lifeline_pid:
            self._beat.worker = None  # RQ registers the death next: the beat must not register it again
        try:
            super().teardown()  # type: ignore[misc]
        finally:
            beat, self._beat = self._beat, None
            if beat is not None and os.getpid() == self.lifeline_pid:  # never from a horse
                beat.stop()
