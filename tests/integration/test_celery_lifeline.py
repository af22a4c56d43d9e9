"""A Celery worker process's alive key (adapters.celery.lifeline) on a real redis-server, and the workers report.

The system test (tests/system/test_celery_workers.py) runs real ``celery worker`` processes and
kills one; here each piece is driven directly: the key a process keeps, what it says while an
advance runs, its TTL, its removal, and the report the workers page renders from it.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

pytest.importorskip("celery", reason="the celery extra is not installed (pip install phaserunner[celery])")

import redis

from adapters.celery import CeleryScheduler, lifeline
from adapters.celery.scheduler import ADVANCE_TASK
from adapters.redis import RedisStorage
from pipelines.app import App, queues
from pipelines.engine.errors import ConfigurationError
from pipelines.web.ui import ui_app
from tests.apps.celery_app import make_celery
from tests.system.conftest import wait_for

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

pytestmark = [pytest.mark.redis]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_a_process_keeps_its_key_while_it_lives_says_what_it_runs_and_removes_it_when_it_stops(
        client: redis.Redis) -> None:
    line = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "ns", "w1@box", ttl=3.0,
                              list_after=0.3)
    try:
        key = lifeline.worker_key("ns", "w1@box", line.pid)
        assert 0 < client.pttl(key) <= 3000
        assert json.loads(client.get(key))["running"] == []  # alive before its first task

        def running() -> list[str]:
            return [r[0] for r in json.loads(client.get(key))["running"]]

        line.started_job("job-7")
        assert running() == [], "an advance is listed only once it has run list_after"
        wait_for("job-7 listed", lambda: running() == ["job-7"], timeout=2.0)
        entry = json.loads(client.get(key))
        assert entry["host"] == "w1@box" and abs(entry["running"][0][1] - time.time()) < 5
        # A threads pool runs several advances in one process: each thread's is listed.
        other = threading.Thread(target=line.started_job, args=("job-8",))
        other.start()
        other.join()
        wait_for("job-8 listed too", lambda: running() == ["job-7", "job-8"], timeout=2.0)
        line.ended_job()
        assert running() == ["job-8"], "a listed advance is taken off as soon as it ends"

        assert [e["pid"] for e in lifeline.read_workers(client, "ns")] == [line.pid]
        assert lifeline.read_workers(client, "other-ns") == []
        time.sleep(1.6)  # past half the TTL: renewed by the thread, not only set once
        assert client.pttl(key) > 1500
    finally:
        line.stop()
    assert client.exists(key) == 0 and lifeline.read_workers(client, "ns") == []


def test_an_advance_shorter_than_list_after_writes_nothing(client: redis.Redis) -> None:
    """Most turns of a busy worker: no round trip at their start or their end."""
    line = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "ns", "w2@box", ttl=30.0,
                              list_after=5.0)
    try:
        key = lifeline.worker_key("ns", "w2@box", line.pid)
        client.config_resetstat()
        for i in range(20):
            line.started_job(f"job-{i}")
            line.ended_job()
        time.sleep(0.2)  # the thread, woken by each start, has nothing to write
        assert int(client.info("commandstats").get("cmdstat_set", {}).get("calls", 0)) == 0
        assert json.loads(client.get(key))["running"] == []
    finally:
        line.stop()


def test_an_advance_that_ends_while_it_is_being_listed_is_taken_off(client: redis.Redis) -> None:
    line = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "ns", "w3@box", ttl=30.0,
                              list_after=0.0)
    try:
        real_set = line.client.set

        def set_then_end(*args: object, **kwargs: object) -> object:
            done = real_set(*args, **kwargs)
            if line.running:
                line.ended_job()  # ends now, while the listing is on its way: not listed yet, so it writes nothing
            return done

        line.client.set = set_then_end  # type: ignore[method-assign]
        with line.lock:
            line.running[threading.get_ident()] = ("job-9", time.time())  # started, its listing not yet written
        line.write()
        assert json.loads(client.get(line.key))["running"] == []
    finally:
        line.stop()


def test_an_advance_applied_eagerly_in_a_process_that_is_no_worker_starts_no_key(
        redis_url: str, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    celery = make_celery(redis_url)
    storage = RedisStorage.from_url(redis_url, prefix="lifeline-eager")
    CeleryScheduler.for_storage(celery, storage, queue="eager-q")
    monkeypatch.setattr(lifeline, "_lifeline", None)  # as in a fresh process
    try:
        # task_prerun fires for an eager apply too; the advance itself finds no such job.
        celery.tasks[ADVANCE_TASK].apply(args=["no-such-job", 1])
        assert lifeline._lifeline is None
        assert lifeline.read_workers(client, "lifeline-eager") == []
    finally:
        storage.close()


def test_a_killed_process_drops_off_within_its_ttl(client: redis.Redis) -> None:
    line = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "ns2", "w2@box", ttl=1.0)
    line.stopping.set()  # the thread stops renewing, as a process killed with kill -9 stops
    line.thread.join(2)
    assert len(lifeline.read_workers(client, "ns2")) == 1
    time.sleep(1.2)
    assert lifeline.read_workers(client, "ns2") == []


def test_a_bad_alive_ttl_setting_is_refused_by_name(redis_url: str) -> None:
    celery = make_celery(redis_url)
    celery.conf.phaserunner_alive_ttl = 0.2
    with pytest.raises(ConfigurationError, match=r"phaserunner_alive_ttl must be seconds in \[1, 3600\], got 0.2"):
        CeleryScheduler(celery, queue="q")
    celery.conf.phaserunner_alive_ttl = 4
    assert lifeline.alive_ttl(celery) == 4.0


def test_the_workers_page_lists_celery_worker_processes_and_queue_depths(redis_url: str,
                                                                         client: redis.Redis) -> None:
    celery = make_celery(redis_url)
    storage = RedisStorage.from_url(redis_url, prefix="lifeline-page")
    scheduler = CeleryScheduler.for_storage(celery, storage, queue="page-q")
    app = App(storage=storage, scheduler=scheduler, provenance=False)
    client.rpush("page-q", "m1", "m2")
    client.rpush("page-q\x06\x163", "m3")  # kombu's list of the same queue's priority-3 messages
    client.rpush("page-q-background", "m4")
    busy = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "lifeline-page", "w1@box", 5.0,
                              list_after=0.0)  # listed at its start, as one that ran long enough would be
    idle = lifeline._Lifeline(redis.Redis(connection_pool=client.connection_pool), "lifeline-page", "w2@box", 5.0)
    try:
        busy.started_job("chat-1")
        wait_for("chat-1 listed", lambda: "chat-1" in (client.get(busy.key) or b"").decode(), 2.0)
        report = queues.report(app)
        assert [(q.name, q.priority, q.waiting, q.scheduled) for q in report.queues] == [
            ("page-q", "interactive", 3, None), ("page-q-background", "background", 1, None)]
        rows = {w.name.split()[0]: w for w in report.workers or []}
        assert rows["w1@box"].job_id == "chat-1" and rows["w1@box"].state == "busy" and rows["w1@box"].since
        assert rows["w2@box"].job_id is None and rows["w2@box"].state == "idle"
        with TestClient(ui_app(app), base_url="http://127.0.0.1") as http:
            page = http.get("/workers")
        assert page.status_code == 200
        assert "w1@box" in page.text and "chat-1" in page.text and "drops off within 10 s" in page.text
    finally:
        busy.stop()
        idle.stop()
        storage.close()


def test_a_broker_that_is_not_redis_is_said_to_report_nothing(redis_url: str) -> None:
    celery = make_celery("memory://")
    storage = RedisStorage.from_url(redis_url, prefix="lifeline-mem")
    app = App(storage=storage, scheduler=CeleryScheduler.for_storage(celery, storage), provenance=False)
    report = queues.report(app)
    assert report.workers is None and "only with a Redis broker" in report.note
    storage.close()


def test_a_broker_that_does_not_answer_is_said_so_on_the_page(redis_url: str) -> None:
    celery = make_celery("redis://127.0.0.1:1/0")  # nothing listens there
    storage = RedisStorage.from_url(redis_url, prefix="lifeline-down")
    app = App(storage=storage, scheduler=CeleryScheduler.for_storage(celery, storage), provenance=False)
    report = queues.report(app)
    assert report.workers is None and "broker did not answer" in report.note and "ConnectionError" in report.note
    with TestClient(ui_app(app), base_url="http://127.0.0.1") as http:
        page = http.get("/workers")
    assert page.status_code == 200 and "broker did not answer" in page.text
    storage.close()
