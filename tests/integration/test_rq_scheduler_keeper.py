"""Our RQ workers start RQ's scheduler again when it ends, against a real redis-server and real processes.

RQ's scheduler is a forked process that any exception ends (a Redis restart),
and RQ starts another only at its 10-minute maintenance; until then delayed
advances wait in the scheduled registry (adapters.rq.recovery.SchedulerKeeper).
"""

from __future__ import annotations

import gc
import os
import signal
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer

from adapters.memory import MemoryStorage
from adapters.rq import RQScheduler
from adapters.rq.priority import PrioritySimpleWorker, PriorityWorker
from pipelines.app import App
from tests.system.conftest import wait_for

pytestmark = pytest.mark.redis


@pytest.fixture
def make_worker(r: redis.Redis) -> Iterator[Any]:
    """Workers on queue "keep" that check their scheduler on every take; their scheduler processes end after."""
    made: list[Any] = []

    def make(cls: type[Any] = PrioritySimpleWorker) -> Any:
        worker = cls([RQScheduler(r, queue="keep").queue], connection=r, serializer=JSONSerializer)
        worker.scheduler_check_every = 0.0
        made.append(worker)
        return worker

    yield make
    for worker in made:
        scheduler = worker.scheduler
        if scheduler is None:
            continue
        process = scheduler._process
        if process is not None and process.is_alive():
            os.kill(process.pid, signal.SIGKILL)
            process.join(10)
        if scheduler._connection is not None:
            scheduler._connection.close()


def _start(worker: Any, *, burst: bool = False) -> None:
    """RQ's own start of the scheduler (what ``work(with_scheduler=True)`` calls).

    RQ's ``RQScheduler.start()`` drops the client its locks were taken on
    without closing it; the ResourceWarning that gives is RQ's, not ours.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        worker._start_scheduler(burst=burst)
        gc.collect()


@pytest.mark.parametrize("cls", [PrioritySimpleWorker, PriorityWorker])
def test_a_scheduler_that_ended_is_started_again_and_moves_due_advances(r: redis.Redis, make_worker: Any,
                                                                    cls: type[Any]) -> None:
    worker = make_worker(cls)
    _start(worker)
    first = worker.scheduler._process
    assert first is not None and first.is_alive()
    assert worker.keep_scheduler() is False  # running: nothing to do
    os.kill(first.pid, signal.SIGKILL)  # as an exception ends it, without releasing its lock
    first.join(10)
    assert r.get("rq:scheduler-lock:keep") is not None  # the lock outlives it (a minute)

    assert worker.keep_scheduler() is True
    second = worker.scheduler._process
    assert second is not first and second.is_alive()
    # ... and it does the scheduler's work: a due delayed advance reaches the queue.
    sched = RQScheduler(r, queue="keep")
    App(storage=MemoryStorage(), scheduler=sched)  # the App tells its scheduler what a worker runs
    sched.schedule_advance("later", 0.5, version=1)
    wait_for("the scheduler to move the advance", lambda: sched.queue.get_job_ids() == ["pr_nlater-v1"], 15)
    assert ScheduledJobRegistry(queue=sched.queue).get_job_ids() == []


def test_a_scheduler_is_checked_at_most_every_scheduler_check_every_seconds(make_worker: Any) -> None:
    worker = make_worker()
    worker.scheduler_check_every = 3600.0
    _start(worker)
    first = worker.scheduler._process
    assert worker.keep_scheduler() is False  # the first check: running
    os.kill(first.pid, signal.SIGKILL)
    first.join(10)
    assert worker.keep_scheduler() is False  # not due a check yet
    assert worker.scheduler._process is first
    worker._scheduler_checked -= 3600.0
    assert worker.keep_scheduler() is True


def test_a_scheduler_held_by_another_worker_is_not_started_twice(r: redis.Redis, make_worker: Any) -> None:
    holder, other = make_worker(), make_worker()
    _start(holder)
    _start(other)
    assert holder.scheduler._process is not None and other.scheduler._process is None
    assert other.keep_scheduler() is False  # the lock is the holder's, whose scheduler runs
    assert other.scheduler._process is None
    os.kill(holder.scheduler._process.pid, signal.SIGKILL)
    holder.scheduler._process.join(10)
    assert other.keep_scheduler() is False  # its lock stays (a minute) under the holder's name
    r.delete("rq:scheduler-lock:keep")  # ... until it expires
    assert other.keep_scheduler() is True
    assert holder.keep_scheduler() is False  # now the other's


def test_a_burst_worker_starts_no_scheduler_process(make_worker: Any) -> None:
    worker = make_worker()
    _start(worker, burst=True)  # moves what is due once, then releases the lock
    assert worker.keep_scheduler() is False
    assert worker.scheduler._process is None


def test_a_worker_run_without_a_scheduler_starts_none(make_worker: Any) -> None:
    worker = make_worker()
    assert worker.keep_scheduler() is False
    assert worker.scheduler is None
