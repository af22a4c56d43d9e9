"""Real RQ workers with the jobs on a real Redis Cluster (the queues on a plain Redis, as RQ requires).

The worker tests of tests/system/test_workers.py run again here, unchanged:
their ``app`` and ``cluster`` fixtures are replaced by ones that put the
jobs on the session's 3-master cluster. The failover test kills a master
while workers run, with ``replicas=1`` so every acknowledged write is on
the replica that takes over.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
import redis
from rq import Worker
from rq.serializers import JSONSerializer

import tests.apps
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import JobStatus, worker
from pipelines.app import App
from pipelines.engine.errors import ConfigurationError
from tests.redis_cluster import ClusterServers
from tests.system.conftest import Cluster, wait_for
from tests.system.test_workers import (  # noqa: F401 - collected here again, with this module's fixtures
    statuses,
    test_a_worker_killed_mid_phase_is_recovered_by_another_workers_sweep,
    test_two_workers_run_30_multi_phase_jobs_to_completion,
)

pytestmark = pytest.mark.redis


def _forget_redis_app() -> None:
    # The module reads its environment once, at import: drop it, so the next test imports it afresh.
    sys.modules.pop("tests.apps.redis_app", None)
    if hasattr(tests.apps, "redis_app"):
        delattr(tests.apps, "redis_app")
    worker.forget_apps()


def _app(monkeypatch: pytest.MonkeyPatch, redis_url: str, cluster_url: str, replicas: int = 0) -> App:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("REDIS_CLUSTER_URL", cluster_url)
    monkeypatch.setenv("PIPELINES_REPLICAS", str(replicas))
    monkeypatch.delenv("FAKE_OPENAI_BASE", raising=False)
    _forget_redis_app()
    from tests.apps import redis_app

    return redis_app.app


@pytest.fixture(autouse=True)
def _fresh_redis_app() -> Iterator[None]:
    yield
    _forget_redis_app()


@pytest.fixture
def app(redis_url: str, redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> App:
    """``tests.apps.redis_app:app`` with its jobs on the session's cluster, as the workers load it."""
    return _app(monkeypatch, redis_url, redis_cluster_url)


@pytest.fixture
def cluster(cluster: Cluster, redis_cluster_url: str) -> Cluster:
    cluster.env["REDIS_CLUSTER_URL"] = redis_cluster_url
    return cluster


def test_the_jobs_are_on_the_cluster_and_the_queues_are_not(app: App, redis_url: str) -> None:
    storage = app.storage
    assert isinstance(storage, RedisStorage) and storage.cluster and storage.layout.buckets == 64
    app.run_pipeline("multi", job_id="where", initial_state={"n": 1})
    plain = redis.Redis.from_url(redis_url)
    assert plain.keys("pr:*") == []  # no job key on the queues' Redis
    assert storage.get_job("where") is not None
    scheduler = app.scheduler
    assert isinstance(scheduler, RQScheduler) and scheduler.queue.count == 1
    plain.close()


def test_rq_is_refused_a_cluster_connection_by_name(redis_cluster_url: str) -> None:
    storage = RedisStorage.from_url(redis_cluster_url, cluster=True)
    with pytest.raises(ConfigurationError, match="RQ does not support Redis Cluster"):
        RQScheduler(storage.client)
    with pytest.raises(ConfigurationError, match=r"pass connection=redis\.Redis"):
        RQScheduler.for_storage(storage)
    with pytest.raises(ConfigurationError, match="buckets >= 1"):
        RedisStorage(storage.client, buckets=0)
    storage.close()


def test_no_job_is_lost_or_committed_twice_when_a_master_fails_over(
    fresh_redis_cluster: ClusterServers, redis_url: str, monkeypatch: pytest.MonkeyPatch, cluster: Cluster,
) -> None:
    url = fresh_redis_cluster.url
    cluster.env["REDIS_CLUSTER_URL"] = url
    cluster.env["PIPELINES_REPLICAS"] = "1"
    cluster.env["PIPELINES_LEASE"] = "3"
    app = _app(monkeypatch, redis_url, url, replicas=1)
    plain = redis.Redis.from_url(redis_url)
    for name in ("w1", "w2"):
        cluster.worker(name, "--simple", "--sweep-interval", "0.5", "--sweep-grace", "2")
    wait_for("2 workers", lambda: len(Worker.all(connection=plain, serializer=JSONSerializer)) == 2, 20,
             cluster.logs)

    jobs = [f"fo-{i}" for i in range(180)]
    first = jobs[:150]
    for i, job_id in enumerate(first):
        app.run_pipeline("multi", job_id=job_id, initial_state={"n": i})
    wait_for("some jobs to finish", lambda: JobStatus.COMPLETE in statuses(app, first).values(), 30,
             cluster.logs)
    victim = fresh_redis_cluster.masters()[0]
    fresh_redis_cluster.stop(victim)  # SIGKILL, with jobs still in flight: the workers' writes retry
    in_flight = [j for j, s in statuses(app, first).items() if s is not JobStatus.COMPLETE]
    assert in_flight, "every job had finished before the master was killed: the test proves nothing"
    fresh_redis_cluster.wait_failover(victim, timeout=30)
    # The promoted replica has no replica of its own: with replicas=1 its writes wait (fail closed) until
    # the old master is back, as a replica this time.
    fresh_redis_cluster.rejoin(victim)
    for i, job_id in enumerate(jobs[150:], start=150):
        app.run_pipeline("multi", job_id=job_id, initial_state={"n": i})

    wait_for("every job to complete", lambda: set(statuses(app, jobs).values()) == {JobStatus.COMPLETE}, 90,
             lambda: f"{statuses(app, jobs)}\n{cluster.logs()}")
    for i, job_id in enumerate(jobs):
        rec = app.storage.get_job(job_id)
        assert rec is not None and rec.result["n"] == (i + 1) * 10 + 1
        # Three phases, three commits: a turn rolled back by the failover and run again would still count 3,
        # but its log line would be written twice ("two" is logged once per run of phase two).
        assert rec.phases_done == 3 and rec.version == 4
        assert [e.message for e in app.storage.logs(job_id)].count("two") == 1
    assert app.storage.due_jobs(time.time() + 3600) == []
    plain.close()
