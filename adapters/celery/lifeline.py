"""What a Celery worker tells the workers page: that it lives, and which job each of its processes runs.

Celery's own ways to ask a worker (``inspect``) need the worker to answer, which
a worker of the solo pool cannot do while it runs a task (so busy and dead look
alike), and its heartbeats are events that only a monitor listening at the time
sees. So, like a ``pipelines worker`` (:mod:`adapters.rq.lifeline`), every
process of a Celery worker that runs advances keeps a key of its own on the
broker's Redis, renewed from a thread of its own::

    pipelines:celery-worker:<namespace>:<hostname>:<pid>
        {"host": "w1@box", "pid": 4242, "started": 1796..., "running": [["job-7", 1796...]]}

with a TTL of :data:`ALIVE_TTL` seconds, renewed every third of it, and deleted
when the process stops. A process killed with ``kill -9`` drops off the page
within the TTL. An advance is listed once it has run :data:`LIST_AFTER`
seconds, and taken off when it ends: a page refreshed by a person never sees
the turns that take less, and those (most turns of a busy worker) cost no
write at all, where writing at each start and end cost two round trips a turn.

The processes that run tasks are found by Celery's signals: the solo pool and
each child of the prefork pool send ``worker_process_init``; a pool that sends
nothing (threads, gevent) starts its lifeline with its first task. Only a broker
on Redis carries the keys (:func:`broker_client` is ``None`` otherwise, and the
page says the workers are not reported).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
import time
import weakref
from typing import Any

import redis

from pipelines.engine.errors import ConfigurationError

__all__ = ["ALIVE_TTL", "KEY_PREFIX", "LIST_AFTER", "alive_ttl", "broker_client", "install", "queue_depth",
           "read_workers", "worker_key"]

logger = logging.getLogger(__name__)

ALIVE_TTL = 10.0
"""Seconds a worker process's key lives without being renewed (it is renewed every third of that); a Celery app
sets its own with ``celery.conf.phaserunner_alive_ttl = S`` (1-3600)."""
LIST_AFTER = 0.5
"""Seconds an advance runs before the worker's key lists it (its end is written at once once it is listed)."""
KEY_PREFIX = "pipelines:celery-worker:"
# kombu's Redis transport keeps a queue's messages of priority p (when priorities are used) in "<queue>\x06\x16<p>".
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = (3, 6, 9)

# The namespace of each Celery app whose advance task is registered (the worker's keys are under it).
_NAMESPACES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_installed = False
_install_lock = threading.Lock()
_lifeline: _Lifeline | None = None  # this process's, once it runs tasks


def broker_client(celery_app: Any) -> redis.Redis | None:
    """A client of ``celery_app``'s broker when the broker is Redis; ``None`` for any other broker."""
    url = celery_app.conf.broker_url
    if isinstance(url, list | tuple):
        url = url[0] if url else None
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def alive_ttl(celery_app: Any) -> float:
    """``celery_app``'s ``phaserunner_alive_ttl`` setting, else :data:`ALIVE_TTL` (a bad value is named and refused)."""
    value = celery_app.conf.get("phaserunner_alive_ttl", ALIVE_TTL)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 3600:
        raise ConfigurationError(f"celery conf phaserunner_alive_ttl must be seconds in [1, 3600], got {value!r}")
    return float(value)


def worker_key(namespace: str, hostname: str, pid: int) -> str:
    """The key a worker process ``pid`` of Celery worker ``hostname`` keeps while it lives."""
    return f"{KEY_PREFIX}{namespace}:{hostname}:{pid}"


class _Lifeline:
    """The key of one worker process: what it runs, renewed from a daemon thread on a client of its own."""

    def __init__(self, client: redis.Redis, namespace: str, hostname: str, ttl: float = ALIVE_TTL,
                 list_after: float = LIST_AFTER) -> None:
        self.client, self.pid, self.hostname = client, os.getpid(), hostname
        self.key = worker_key(namespace, hostname, self.pid)
        self.ttl_ms = max(1, int(ttl * 1000))
        self.every = ttl / 3
        self.list_after = list_after
        self.started = time.time()
        self.running: dict[int, tuple[str, float]] = {}  # thread id -> (job id, since): a threads pool runs several
        self.listed: frozenset[tuple[str, float]] = frozenset()  # the advances the last write listed
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # wakes the thread when an advance starts
        self.failing = False
        self.stopping = threading.Event()
        self.write()  # alive before its first task
        self.thread = threading.Thread(target=self.run, name="pipelines-celery-alive", daemon=True)
        self.thread.start()

    def write(self) -> None:
        while True:
            with self.lock:
                now = time.time()
                # Those that ran long enough, and those listed already (never taken off while they run).
                shown = [r for r in self.running.values() if now - r[1] >= self.list_after or r in self.listed]
                value = json.dumps({"host": self.hostname, "pid": self.pid, "started": self.started,
                                    "running": sorted(shown, key=lambda r: r[1])})
            try:
                self.client.set(self.key, value, px=self.ttl_ms)
            except redis.RedisError as exc:
                if not self.failing:  # once per outage, not every few seconds
                    logger.warning("could not renew %s (%s); trying again every %gs", self.key, exc, self.every)
                self.failing = True
                return
            self.failing = False
            with self.lock:
                self.listed = frozenset(shown)
                running = set(self.running.values())
            # An advance that ended while this was sent saw it unlisted and wrote nothing: write again.
            if running.issuperset(shown):
                return

    def _next_write(self, last: float) -> float:
        """When the thread writes next (time.time()): the renewal, or an advance's listing if that is sooner."""
        due = last + self.every
        for job_id, since in self.running.values():
            if (job_id, since) not in self.listed:
                due = min(due, since + self.list_after)
        return due

    def run(self) -> None:
        last = time.time()
        while not self.stopping.is_set():
            with self.changed:
                wait = self._next_write(last) - time.time()
                if wait > 0:
                    self.changed.wait(wait)
                if self._next_write(last) > time.time():
                    continue  # woken by a start whose listing is not due yet (or by stop)
            if self.stopping.is_set():
                return
            self.write()
            last = time.time()

    def started_job(self, job_id: str) -> None:
        with self.changed:
            self.running[threading.get_ident()] = (job_id, time.time())
            self.changed.notify()

    def ended_job(self) -> None:
        with self.lock:
            found = self.running.pop(threading.get_ident(), None)
            listed = found is not None and found in self.listed
        if listed:
            self.write()  # the page must not show a finished advance as running

    def stop(self) -> None:
        if os.getpid() != self.pid:  # a process forked from this one: the key is not its to delete
            return
        self.stopping.set()
        with self.changed:
            self.changed.notify()
        with contextlib.suppress(redis.RedisError):
            self.client.delete(self.key)


def install(celery_app: Any, namespace: str) -> None:
    """Have the processes of a Celery worker of ``celery_app`` keep their keys under ``namespace``.

    Called where the advance task is registered (every process that loads the app's module); the
    signal handlers do nothing outside a Celery worker.
    """
    global _installed
    _NAMESPACES.setdefault(celery_app, namespace)
    with _install_lock:
        if _installed:
            return
        _installed = True
    from celery import signals  # type: ignore[import-untyped]

    signals.worker_process_init.connect(_process_init, weak=False)
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_ended, weak=False)
    signals.worker_shutdown.connect(_shutdown, weak=False)
    signals.worker_process_shutdown.connect(_shutdown, weak=False)


def _start(celery_app: Any, hostname: str) -> _Lifeline | None:
    """This process's lifeline, started on first use; ``None`` when its app registered no namespace here
    or its broker is not Redis."""
    global _lifeline
    if _lifeline is not None and _lifeline.pid == os.getpid():
        return _lifeline
    namespace = _NAMESPACES.get(celery_app)
    client = None if namespace is None else broker_client(celery_app)
    if client is None or namespace is None:
        return None
    _lifeline = _Lifeline(client, namespace, hostname, alive_ttl(celery_app))
    atexit.register(_lifeline.stop)
    return _lifeline


def _process_init(sender: Any = None, **_: Any) -> None:
    # Sent by the solo pool in the worker's process and in every child of the prefork pool, with the
    # worker's hostname only: the Celery app is the current one (a prefork child sets it), else the one
    # app of this process that registered the advance task (an app made with set_as_current=False).
    from celery import current_app

    try:
        apps = list(_NAMESPACES.keys())
        current = current_app._get_current_object()
        chosen = current if current in apps else apps[0] if len(apps) == 1 else None
        if chosen is not None:
            _start(chosen, str(sender or "celery"))
    except Exception:  # the page's report must never stop a worker from starting
        logger.warning("could not start the worker's alive key", exc_info=True)


def _task_started(task: Any = None, args: Any = None, **_: Any) -> None:
    from adapters.celery.scheduler import ADVANCE_TASK

    if task is None or getattr(task, "name", None) != ADVANCE_TASK:
        return
    # ``task.apply()`` runs the advance in the caller's process (a web process, a test, a script): that
    # process is no worker, and a key renewed for as long as it lives would list it as one.
    if getattr(getattr(task, "request", None), "is_eager", False):
        return
    try:
        line = _start(task.app, str(getattr(task.request, "hostname", None) or "celery"))  # this process's, if any
        if line is not None and args:
            line.started_job(str(args[0]))
    except Exception:  # telling the page must never fail a turn
        logger.debug("could not note the task on the alive key", exc_info=True)


def _task_ended(**_: Any) -> None:
    line = _lifeline
    if line is not None and line.pid == os.getpid():
        with contextlib.suppress(Exception):
            line.ended_job()  # nothing to do unless this thread started an advance


def _shutdown(**_: Any) -> None:
    line = _lifeline
    if line is not None:
        line.stop()


def read_workers(client: redis.Redis, namespace: str) -> list[dict[str, Any]]:
    """The live worker processes under ``namespace``: each key's JSON (host, pid, started, running)."""
    keys = sorted(client.scan_iter(match=f"{KEY_PREFIX}{namespace}:*", count=1000))
    out = []
    for raw in client.mget(keys) if keys else []:
        if raw is None:  # expired between the scan and the read
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def queue_depth(client: redis.Redis, queue: str) -> int:
    """Messages waiting in ``queue`` on a Redis broker (kombu's list, and its priority lists)."""
    pipe = client.pipeline(transaction=False)
    for name in (queue, *(f"{queue}{_PRIORITY_SEP}{p}" for p in _PRIORITY_STEPS)):
        pipe.llen(name)
    return int(sum(pipe.execute()))
