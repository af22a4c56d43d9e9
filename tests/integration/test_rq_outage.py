"""An RQ worker of ours goes on through a Redis outage in RQ's bookkeeping (adapters.rq.recovery.RidesOutOutages).

A real redis-server (appendonly) is stopped by a job as it ends, so RQ's
record of that job's end finds the connection refused, and started again a
second later on the same port with the same data. RQ's own worker quits
there; ours outlives it and takes the next job once Redis is back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from adapters.rq.priority import PrioritySimpleWorker, PriorityWorker
from tests.apps import outage_jobs
from tests.redis_server import RedisServer, find_redis_server
from tests.rq_workers import without_commands

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    srv = RedisServer(binary, extra_args=["--appendonly", "yes"])
    srv.start()
    try:
        yield srv
    finally:
        srv.cleanup()


def _restart_when_stopped(server: RedisServer, down: float) -> threading.Thread:
    """Start ``server`` again ``down`` seconds after it exits (the job stops it; we are its parent)."""
    proc = server.proc
    assert proc is not None

    def watch() -> None:
        proc.wait(60)
        time.sleep(down)
        server.start()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _run(server: RedisServer, cls: type[Any], *, then_work: float = 0.0, log: str = "") -> list[str]:
    """What ran of the job queued after the outage job, with a worker of ``cls`` in burst mode."""
    assert server.proc is not None
    outage_jobs.REDIS_PID, outage_jobs.REDIS_PORT = server.proc.pid, server.port
    # No retries in the client: the refusal reaches RQ instead of being waited out by redis-py.
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    queue = Queue("outage", connection=client, serializer=JSONSerializer)
    queue.enqueue("tests.apps.outage_jobs.outage", then_work, log)
    after = queue.enqueue("tests.apps.outage_jobs.mark", "after", log)
    restart = _restart_when_stopped(server, 1.0)
    worker = without_commands(cls)([queue], connection=client, serializer=JSONSerializer)  # tests/rq_workers.py
    worker.outage_pause = 0.2
    worker.job_monitoring_interval = 1  # a forking worker's watch of its horse meets the outage too
    try:
        with contextlib.suppress(redis.ConnectionError):  # RQ's own teardown may meet the outage too
            worker.work(burst=True, logging_level="CRITICAL")
        restart.join(30)
        after.refresh()
        return ["after"] if after.get_status() == "finished" else []
    finally:
        client.close()


def test_rq_s_own_worker_quits_when_redis_is_down_as_it_records_a_job(server: RedisServer) -> None:
    assert _run(server, SimpleWorker) == []  # what the test below proves ours no longer does


@pytest.mark.parametrize("cls", [PrioritySimpleWorker, PriorityWorker])
def test_our_worker_outlives_the_outage_and_takes_the_next_job(server: RedisServer, cls: type[Any]) -> None:
    assert _run(server, cls) == ["after"]


def test_a_horse_still_working_when_the_outage_ends_its_watch_is_waited_for(server: RedisServer,
                                                                            tmp_path: Any) -> None:
    # RQ's watch of the horse (a heartbeat each job_monitoring_interval) fails while the horse works on:
    # the worker waits for that horse before it takes the next job, so it never runs two at once.
    log = tmp_path / "order"
    assert _run(server, PriorityWorker, then_work=2.5, log=str(log)) == ["after"]
    assert log.read_text().splitlines() == ["outage ended", "after"]
