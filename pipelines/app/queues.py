"""What the App's scheduler tells about its queues and workers, for the workers page: queue depths, live
workers, and whether a due job's advance still waits in a queue. Read only: nothing here enqueues, moves or
deletes a message.

The storage says what is due (I7); the queue is the fast path. A job that is
due, held by no worker and whose advance is in no queue was lost by the queue
(``pipelines advance --due`` sends it again). How much of this a scheduler
tells depends on it: RQ (queues, registries, workers and what each runs), the
in-process memory scheduler (its pending advances), the local scheduler (its
requests and its worker threads, this process's only), Celery on a Redis broker
(queue depths, and the worker processes with what each runs: see
:mod:`adapters.celery.lifeline`); any other says nothing and the page says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipelines.app.face import App
from pipelines.engine.models import JobRecord

__all__ = ["QueueRow", "Report", "WorkerRow", "age", "alive_workers", "report"]


@dataclass
class QueueRow:
    name: str
    priority: str
    waiting: int  # ready now
    scheduled: int | None  # delayed (a retry's backoff, a delay); None: the queue does not tell
    running: int | None = None  # taken by a worker (RQ's started registry)


@dataclass
class WorkerRow:
    name: str
    alive: bool
    state: str
    job_id: str | None = None  # the job whose advance it runs now
    since: float | None = None  # when it started that advance
    detail: str = ""


@dataclass
class Report:
    scheduler: str
    queues: list[QueueRow] = field(default_factory=list)
    workers: list[WorkerRow] | None = None  # None: this scheduler does not tell
    note: str = ""
    is_queued: Callable[[JobRecord], bool] | None = field(default=None, repr=False)

    def queued(self, records: list[JobRecord]) -> set[str] | None:
        """Which of ``records`` have their advance in a queue; ``None`` when the scheduler does not tell."""
        return None if self.is_queued is None else {r.job_id for r in records if self.is_queued(r)}


def report(app: App) -> Report:
    """What the App's scheduler tells about its queues and workers."""
    scheduler = app.scheduler
    name = type(scheduler).__name__
    rq = _rq_class()
    if rq is not None and isinstance(scheduler, rq):
        return _rq_report(scheduler, name)
    from adapters.memory import MemoryScheduler

    if isinstance(scheduler, MemoryScheduler):
        return _memory_report(scheduler, name)
    from adapters.local import LocalScheduler

    if isinstance(scheduler, LocalScheduler):
        return _local_report(scheduler, name)
    celery = _celery_class()
    if celery is not None and isinstance(scheduler, celery):
        return _celery_report(scheduler, name)
    return Report(scheduler=name, note=f"{name} does not report its queues or workers")


def _rq_class() -> type | None:
    try:
        from adapters.rq import RQScheduler
    except ImportError:  # rq not installed: this app cannot be using it
        return None
    return RQScheduler


def _celery_class() -> type | None:
    try:
        from adapters.celery import CeleryScheduler
    except ImportError:  # celery not installed: this app cannot be using it
        return None
    return CeleryScheduler


def _celery_report(scheduler: Any, name: str) -> Report:
    from redis.exceptions import RedisError

    from adapters.celery import lifeline

    client = lifeline.broker_client(scheduler.celery)
    if client is None:
        return Report(scheduler=name, note="Celery's queues and workers are reported only with a Redis broker")
    try:
        names = [(scheduler.queue_for("interactive"), "interactive"), (scheduler.queue_for("background"), "background")]
        rows = [QueueRow(name=q, priority=p, waiting=lifeline.queue_depth(client, q), scheduled=None)
                for q, p in names]
        workers = [WorkerRow(name=f"{entry.get('host', '?')} pid {entry.get('pid', '?')}", alive=True,
                             state="busy" if entry.get("running") else "idle", job_id=job_id, since=since,
                             detail="Celery worker process") for entry in lifeline.read_workers(client,
                                                                                                scheduler.namespace)
                   for job_id, since in (entry.get("running") or [(None, None)])]
    except RedisError as exc:  # the broker is down: the page still renders, and says so
        return Report(scheduler=name, note=f"Celery's Redis broker did not answer: {type(exc).__name__}: {exc}")
    finally:
        client.close()
    ttl = lifeline.alive_ttl(scheduler.celery)
    note = (f"Celery worker processes keep a key on the broker, renewed every few seconds: one killed drops off "
            f"within {ttl:g} s. A delayed advance (a countdown) waits inside a worker, so none is counted as "
            "scheduled, and the queue does not say which jobs it holds.")
    return Report(scheduler=name, queues=rows, workers=workers, note=note)


def _request_rows(scheduler: Any, queue: str) -> tuple[list[QueueRow], set[str]]:
    """The requests an in-process scheduler holds (``advances()``), as queue rows named ``queue``, and their jobs."""
    now = scheduler.now()
    advances = scheduler.advances()
    rows = [QueueRow(name=queue, priority=p, waiting=sum(1 for due, q, _ in advances if q == p and due <= now),
                     scheduled=sum(1 for due, q, _ in advances if q == p and due > now))
            for p in ("interactive", "background")]
    return rows, {job_id for _, _, job_id in advances}


def _memory_report(scheduler: Any, name: str) -> Report:
    rows, pending = _request_rows(scheduler, "in-process")
    return Report(scheduler=name, queues=rows, workers=None, is_queued=lambda r: r.job_id in pending,
                  note="advances run in this process (drain / run_due): there are no worker processes")


def _local_report(scheduler: Any, name: str) -> Report:
    rows, _ = _request_rows(scheduler, "this process")
    workers = [WorkerRow(name=thread, alive=True, state="busy" if job_id else "idle", job_id=job_id, since=since,
                         detail=f"thread of pid {os.getpid()}") for thread, job_id, since in scheduler.threads()]
    note = ("worker threads of this process; other processes sharing the storage file run their own and are "
            "not listed (their jobs show as held)" if workers else
            "no worker thread runs in this process (start() was not called): its due work waits for a process "
            "on the same storage file that runs some")
    # Its queue is the storage (I7): a due job no request of this process names is claimed by a poll within
    # ``poll`` + ``grace`` seconds, by this process or another on the file. Nothing due is ever lost.
    return Report(scheduler=name, queues=rows, workers=workers, is_queued=lambda record: True, note=note)


def _rq_report(scheduler: Any, name: str) -> Report:
    from rq import Worker
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from adapters.rq import rq_job_id

    conn = scheduler.connection
    queues = dict(scheduler.queues)
    rows = [QueueRow(name=q.name, priority=p, waiting=q.count, scheduled=q.scheduled_job_registry.count,
                     running=q.started_job_registry.count) for p, q in queues.items()]
    names = {q.name for q in queues.values()}
    workers = [w for w in Worker.all(connection=conn) if names & set(w.queue_names())]
    alive = {w.name for w in alive_workers(conn, workers)}
    out = Report(scheduler=name, queues=rows, workers=[])
    for w in workers:
        row = WorkerRow(name=w.name, alive=w.name in alive, state=str(w.get_state()),
                        detail=f"{w.hostname or '?'} pid {w.pid}")
        current = w.get_current_job_id()
        if current:
            try:
                job = Job.fetch(current, connection=conn, serializer=JSONSerializer)
                row.job_id = str(job.args[0]) if job.args else None
                row.since = _seconds(job.started_at)
            except Exception:  # noqa: BLE001 - the message finished or expired between the two reads
                row.job_id = None
        assert out.workers is not None
        out.workers.append(row)

    def queued(record: JobRecord) -> bool:
        rq_id = rq_job_id(record.job_id, record.version, scheduler.namespace)
        for q in queues.values():
            if conn.lpos(q.key, rq_id) is not None or conn.zscore(q.scheduled_job_registry.key, rq_id) is not None \
                    or conn.zscore(q.started_job_registry.key, rq_id) is not None:
                return True
        return False

    out.is_queued = queued
    return out


def _seconds(when: datetime | None) -> float | None:
    if when is None:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def age(since: float | None, now: float | None = None) -> str:
    """``since`` as a short age ("12 s", "3 min")."""
    if since is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - since)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def alive_workers(connection: Any, workers: list[Any]) -> list[Any]:
    """The workers of ``workers`` that are alive: by their alive key if they keep one, else by RQ's heartbeat."""
    from adapters.rq.lifeline import ALIVE_FIELD, alive_key

    pipe = connection.pipeline(transaction=False)
    for w in workers:
        pipe.hget(w.key, ALIVE_FIELD)
        pipe.exists(alive_key(w.name))
    replies = pipe.execute()
    now = datetime.now(UTC)
    alive = []
    for w, keeps_key, key_exists in zip(workers, replies[::2], replies[1::2], strict=True):
        if keeps_key is not None:
            beating = bool(key_exists)
        else:  # a worker that keeps no alive key (a plain `rq worker`)
            beating = w.last_heartbeat is not None and (
                now - w.last_heartbeat.replace(tzinfo=UTC)).total_seconds() <= max(60, w.worker_ttl)
        if beating:
            alive.append(w)
    return alive
