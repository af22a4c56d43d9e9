"""An RQ worker of ours goes on through a Redis outage in RQ's bookkeeping (adapters.rq_recovery.RidesOutOutages).

A real redis-server (appendonly) is stopped by a job as it ends, so RQ's
record of that job's end finds the connection refused, and started again a
second later on the same port with the same data. RQ's own worker quits
there; ours outlives it and takes the next job once Redis is back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from adapters.rq_priority import PrioritySimpleWorker
from tests.apps import outage_jobs
from tests.redis_server import RedisServer, find_redis_server

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    srv = RedisServer(binary, extra_args=["--appendonly", "yes"])
    srv.start()
    outage_jobs.SERVER, outage_jobs.RAN[:] = srv, []
    try:
        yield srv
    finally:
        for thread in outage_jobs.RESTARTS:
            thread.join(30)
        outage_jobs.SERVER, outage_jobs.RESTARTS[:] = None, []
        srv.cleanup()


def _run(server: RedisServer, cls: type[Any]) -> None:
    # No retries in the client: the refusal reaches RQ instead of being waited out by redis-py.
    client = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    queue = Queue("outage", connection=client, serializer=JSONSerializer)
    queue.enqueue("tests.apps.outage_jobs.outage", 1.0)
    queue.enqueue("tests.apps.outage_jobs.mark", "after")
    worker = cls([queue], connection=client, serializer=JSONSerializer)
    worker.outage_pause = 0.2
    try:
        worker.work(burst=True, logging_level="CRITICAL")
    finally:
        client.close()


def test_rq_s_own_worker_quits_when_redis_is_down_as_it_records_a_job(server: RedisServer) -> None:
    with contextlib.suppress(redis.ConnectionError):  # its teardown may meet the outage too
        _run(server, SimpleWorker)  # what the test below proves ours no longer does
    assert outage_jobs.RAN == []


def test_our_worker_outlives_the_outage_and_takes_the_next_job(server: RedisServer) -> None:
    _run(server, PrioritySimpleWorker)
    assert outage_jobs.RAN == ["after"]
