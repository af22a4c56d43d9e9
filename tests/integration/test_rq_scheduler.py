"""RQScheduler against a real redis-server: JSON-only payloads, one RQ job per turn, delays, app lookup."""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.job import JOB_ID_PATTERN as RQ_JOB_ID
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer

from adapters.memory import MemoryStorage
from adapters.redis import DEFAULT_PREFIX
from adapters.rq import (
    SCHEDULER_LATE,
    RQScheduler,
    decode_rq_job_id,
    parse_rq_job_id,
    rq_job_id,
)
from adapters.rq import scheduler as rq_scheduler
from pipelines import JobStatus, worker
from pipelines.app import App
from pipelines.engine.errors import ConfigurationError, InvalidInputError, StorageError, StorageUnavailableError
from pipelines.worker import ADVANCE_FUNC, advance_job
from tests.redis_server import free_port
from tests.rq_workers import BurstWorker

pytestmark = pytest.mark.redis

APP_PATH = "tests.apps.redis_app:app"
PICKLE_MARKERS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def scheduler(client: redis.Redis) -> RQScheduler:
    return built(RQScheduler(client, queue="q-test", app=APP_PATH, job_timeout=60, result_ttl=60, failure_ttl=600))


def built(scheduler: RQScheduler) -> RQScheduler:
    """``scheduler`` once an App is built with it: the App tells it what a worker runs (what every app does)."""
    App(storage=MemoryStorage(), scheduler=scheduler)
    return scheduler


def job_hash(client: redis.Redis, rq_id: str) -> dict[bytes, bytes]:
    raw: dict[bytes, bytes] = client.hgetall(f"rq:job:{rq_id}")  # type: ignore[assignment]
    assert raw, f"no RQ job {rq_id}"
    return raw


def run_worker(app: App, path: str | None = APP_PATH) -> None:
    """Run the queue dry in this process, with ``app`` as the worker's app (``pipelines worker --app path``)."""
    worker.use_app(app, path=path)
    sched = app.scheduler
    assert isinstance(sched, RQScheduler)
    rq_worker = BurstWorker([sched.queue], connection=sched.connection, serializer=JSONSerializer)
    rq_worker.work(burst=True, logging_level="WARNING")


# --- I8: only JSON crosses the queue ----------------------------------------------
def test_an_advance_in_redis_is_json_with_no_pickle_anywhere(client: redis.Redis, scheduler: RQScheduler) -> None:
    scheduler.schedule_advance("order:42.a_b", pipeline="multi", version=3)

    rq_id = rq_job_id("order:42.a_b", 3)
    raw = job_hash(client, rq_id)
    # RQ zlib-compresses the payload; inside it must be plain JSON.
    payload = json.loads(zlib.decompress(raw[b"data"]))
    assert payload == [ADVANCE_FUNC, None, ["order:42.a_b", 3], {"app": APP_PATH}]
    for field, value in raw.items():
        value = zlib.decompress(value) if field == b"data" else value
        assert not any(m in value for m in PICKLE_MARKERS), field
        value.decode("utf-8")  # every field is text
    assert int(raw[b"timeout"]) == 60 and int(raw[b"result_ttl"]) == 60 and int(raw[b"failure_ttl"]) == 600
    assert b"ttl" not in raw  # a job not started in time must never vanish
    assert client.lrange("rq:queue:q-test", 0, -1) == [rq_id.encode()]


def test_the_result_rq_stores_is_json_too(app: App, client: redis.Redis) -> None:
    app.run_pipeline("multi", job_id="r1", initial_state={"n": 1})
    run_worker(app)
    results = client.xrange(f"rq:results:{rq_job_id('r1', 1)}")
    assert results
    for _, fields in results:
        for value in fields.values():
            assert not any(m in value for m in PICKLE_MARKERS)
    job = app.scheduler.fetch(rq_job_id("r1", 1))  # type: ignore[attr-defined]
    assert job.return_value() == "advanced"


# --- one RQ job id per turn ---------------------------------------------------------
def test_each_turn_is_its_own_rq_job(client: redis.Redis, scheduler: RQScheduler) -> None:
    scheduler.schedule_advance("j1", version=1)
    scheduler.schedule_advance("j1", version=2)
    assert scheduler.queue.get_job_ids() == ["pr_nj1-v1", "pr_nj1-v2"]


def test_enqueues_list_their_queue_with_rq_once_an_interval_not_in_a_round_trip_each(
        client: redis.Redis, scheduler: RQScheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    def sadds() -> int:
        return int(client.info("commandstats").get("cmdstat_sadd", {}).get("calls", 0))  # type: ignore[union-attr]

    before = sadds()
    scheduler.schedule_advance("l1", version=1)
    scheduler.schedule_advance("l1", version=2)
    scheduler.requeue("l2", version=1)  # at the front
    assert scheduler.queue.get_job_ids() == ["pr_nl2-v1", "pr_nl1-v1", "pr_nl1-v2"]
    assert client.sismember("rq:queues", scheduler.queue.key)  # what `rq info` and Queue.all() list
    assert sadds() == before + 1  # RQ alone sends one with every enqueue, in a round trip of its own
    # Once the interval has passed, the next enqueue lists the queue again (a queue deleted meanwhile comes back).
    client.srem("rq:queues", scheduler.queue.key)
    monkeypatch.setattr(rq_scheduler, "QUEUE_LISTING_INTERVAL", 0.0)
    scheduler.schedule_advance("l3", version=1)
    assert client.sismember("rq:queues", scheduler.queue.key) and sadds() == before + 2
    assert scheduler.queue.get_job_ids()[-1] == "pr_nl3-v1"


def test_rq_job_ids_are_injective_valid_and_decodable() -> None:
    tricky = ["a", "a.b", "a_b", "a:b", "a_db", "a_cb", "a__b", "a-v1", "a-v1-v2", "_", "__", "._:", "-", "v1",
              "x" * 200, "a.:_.b", "a_d_c", "a_n", "_n", "n_", "a_nb", "pr_nb", "-v", "a-", "_-v1"]
    namespaces = ["pr", "ta", "tb", "a_n", "_n", "n", "_", "a.b:c", "x-v1", "-", "pr_n", ":", "."]
    seen: dict[str, tuple[str, str, int]] = {}
    for namespace in namespaces:
        for job_id in tricky:
            for version in (0, 1, 12):
                rid = rq_job_id(job_id, version, namespace)
                assert RQ_JOB_ID.fullmatch(rid), rid
                assert rid not in seen, (rid, seen.get(rid), (namespace, job_id, version))
                seen[rid] = (namespace, job_id, version)
                assert parse_rq_job_id(rid) == (namespace, job_id, version)
                assert decode_rq_job_id(rid) == (job_id, version)
                assert decode_rq_job_id(rid, namespace) == (job_id, version)
    assert rq_job_id("j", 1) == rq_job_id("j", 1, DEFAULT_PREFIX)  # the old two-argument call still works
    with pytest.raises(InvalidInputError, match="namespace 'ta', not 'tb'"):
        decode_rq_job_id(rq_job_id("j", 1, "ta"), "tb")
    for not_ours in ("not-ours", "j1-v1", "pr_nj1", "pr_n-v1", "_nj-v1", "pr_xj-v1", "pr_nj_z-v1"):
        with pytest.raises(InvalidInputError):
            decode_rq_job_id(not_ours)
    with pytest.raises(InvalidInputError):
        rq_job_id("bad id", 1)
    for bad_namespace in ("", "a b", "{x}", "é"):
        with pytest.raises(ConfigurationError, match="namespace"):
            rq_job_id("j", 1, bad_namespace)


def test_rq_job_ids_round_trip_for_random_awkward_names() -> None:
    rng = random.Random(6)  # property-style: many generated ids, reproducible
    alphabet = "_.:-aZ09nvdc"
    seen: dict[str, tuple[str, str, int]] = {}
    for _ in range(3000):
        namespace = "".join(rng.choices(alphabet, k=rng.randint(1, 6)))
        job_id = "".join(rng.choices(alphabet, k=rng.randint(1, 12)))
        if job_id in (".", ".."):  # refused as job ids (they name directories in paths)
            continue
        version = rng.choice([0, 1, 7, 10, 123456])
        rid = rq_job_id(job_id, version, namespace)
        assert RQ_JOB_ID.fullmatch(rid), rid
        assert parse_rq_job_id(rid) == (namespace, job_id, version)
        assert seen.setdefault(rid, (namespace, job_id, version)) == (namespace, job_id, version)


# --- two apps on one Redis (issue item 9) -------------------------------------------
def test_schedulers_of_two_namespaces_never_overwrite_each_others_jobs(client: redis.Redis) -> None:
    a = built(RQScheduler(client, queue="shared", namespace="ta"))
    b = built(RQScheduler(client, queue="shared", namespace="tb"))
    a.schedule_advance("chat-1", pipeline="pa", version=1)
    b.schedule_advance("chat-1", pipeline="pb", version=1)

    ids = a.queue.get_job_ids()
    assert sorted(ids) == sorted([rq_job_id("chat-1", 1, "ta"), rq_job_id("chat-1", 1, "tb")])
    assert [parse_rq_job_id(i).namespace for i in ids] == ["ta", "tb"]  # both waiting, in order
    assert a.fetch(rq_job_id("chat-1", 1, "ta")).description == "advance chat-1 v1 (pa)"  # not overwritten by B
    assert b.fetch(rq_job_id("chat-1", 1, "tb")).description == "advance chat-1 v1 (pb)"

    # A's duplicate is still recognised as waiting (not enqueued again), and B's does not hide it.
    a.schedule_advance("chat-1", pipeline="pa", version=1)
    assert len(a.queue.get_job_ids()) == 2
    # Versionless advances carry the namespace too.
    a.schedule_advance("chat-1")
    assert a.queue.get_job_ids()[-1].startswith("ta_nchat-1-x")


def test_for_storage_takes_the_client_and_the_prefix_from_the_storage(redis_url: str) -> None:
    from adapters.redis import RedisStorage

    storage = RedisStorage.from_url(redis_url, prefix="app.one:x")
    sched = built(RQScheduler.for_storage(storage, queue="fs", app=APP_PATH, job_timeout=33))
    assert sched.connection is storage.client and sched.namespace == "app.one:x"
    assert (sched.queue_name, sched.app, sched.job_timeout) == ("fs", APP_PATH, 33)
    sched.schedule_advance("j", version=2)
    assert sched.queue.get_job_ids() == [rq_job_id("j", 2, "app.one:x")]
    with pytest.raises(ConfigurationError, match="from the storage"):
        RQScheduler.for_storage(storage, namespace="other")
    storage.close()


@pytest.mark.parametrize("namespace", ["", "a b", "{tag}", "a/b"])
def test_a_bad_namespace_is_a_configuration_error(client: redis.Redis, namespace: str) -> None:
    with pytest.raises(ConfigurationError, match="namespace"):
        RQScheduler(client, namespace=namespace)


def test_a_duplicate_advance_is_enqueued_once_and_a_finished_one_runs_again(app: App) -> None:
    sched = app.scheduler
    assert isinstance(sched, RQScheduler)
    app.run_pipeline("multi", job_id="d1", initial_state={"n": 1})
    sched.schedule_advance("d1", pipeline="multi", version=1)  # a duplicate while the first still waits
    assert sched.queue.get_job_ids() == ["pr_nd1-v1"]

    run_worker(app)
    rec = app.storage.get_job("d1")
    assert rec is not None and rec.status is JobStatus.COMPLETE and rec.result["n"] == 21

    # The same turn asked for again after it ran: enqueued again, and harmless (I6).
    sched.schedule_advance("d1", pipeline="multi", version=1)
    assert sched.queue.get_job_ids() == ["pr_nd1-v1"]
    run_worker(app)
    assert sched.fetch("pr_nd1-v1").return_value() == "not_running"
    assert app.storage.get_job("d1") == rec


# --- delays -------------------------------------------------------------------------
def test_a_delayed_advance_waits_in_the_scheduled_registry(scheduler: RQScheduler) -> None:
    before = time.time()
    scheduler.schedule_advance("later", 30.0, version=4)
    registry = ScheduledJobRegistry(queue=scheduler.queue)
    assert registry.get_job_ids() == ["pr_nlater-v4"]
    at = registry.get_scheduled_time("pr_nlater-v4").timestamp()
    assert before + 29 <= at <= time.time() + 31
    assert scheduler.queue.count == 0  # nothing runs before a scheduler moves it to the queue
    assert scheduler.precision == 1.0  # what arrives that early anyway (two machines' clocks) waits in the runner


def test_a_delay_is_sent_for_the_whole_second_at_or_after_its_end(scheduler: RQScheduler) -> None:
    # RQ keeps a delayed job's time in whole seconds, cut down, and moves it once that second began: sent
    # for the second before its end, a delay of 2.3 s arrived up to a second early.
    for n, delay in enumerate((2.3, 2.7, 0.05)):
        before = time.time()
        scheduler.schedule_advance("d", delay, version=n)
        score = scheduler.connection.zscore(scheduler.queue.scheduled_job_registry.key,
                                            rq_job_id("d", n, scheduler.namespace))
        assert score is not None and score == int(score) and before + delay <= score <= time.time() + delay + 1


def test_an_advance_due_now_is_not_held_back_by_one_under_its_id_due_later(scheduler: RQScheduler) -> None:
    # A job deleted and made again under its id: its old run's turn at version 2 waits a day in RQ.
    scheduler.schedule_advance("order-7", 86400, version=2)
    scheduler.schedule_advance("order-7", 0, version=2)  # the new job's turn at version 2, due now
    old = rq_job_id("order-7", 2, scheduler.namespace)
    assert scheduler.queue.scheduled_job_registry.get_job_ids() == [old]  # kept: it finds its turn done
    assert scheduler.queue.job_ids == [f"{old}-a"]  # not skipped as a duplicate of the later one
    scheduler.schedule_advance("order-7", 0, version=2)  # a sweep sending it again: still one
    assert scheduler.queue.job_ids == [f"{old}-a"]
    scheduler.schedule_advance("order-7", 86400, version=2)  # a later one than waits: a duplicate, as before
    assert scheduler.queue.scheduled_job_registry.get_job_ids() == [old]


def test_bad_delays_are_rejected_before_anything_is_written(client: redis.Redis, scheduler: RQScheduler) -> None:
    for delay in (-1.0, float("nan")):
        with pytest.raises(InvalidInputError):
            scheduler.schedule_advance("j", delay, version=1)
    assert client.keys("rq:job:*") == []


# --- advance_job: how a worker finds the app ----------------------------------------
def test_advance_job_serves_a_payload_naming_the_worker_s_own_app_path(app: App) -> None:
    app.run_pipeline("multi", job_id="m1", initial_state={"n": 1})
    run_worker(app)  # as `pipelines worker --app APP_PATH`: the payload names that path
    rec = app.storage.get_job("m1")
    assert rec is not None and rec.status is JobStatus.COMPLETE
    assert rec.result["n"] == 21
    sched = app.scheduler
    assert isinstance(sched, RQScheduler)
    assert [sched.fetch(rq_job_id("m1", v)).return_value() for v in (1, 2, 3)] == ["advanced", "advanced", "completed"]


def test_advance_job_falls_back_to_the_worker_app_then_the_environment(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    with pytest.raises(ConfigurationError, match="no app for this advance"):
        advance_job("nope")
    monkeypatch.setenv("PIPELINES_APP", APP_PATH)
    assert advance_job("nope") == "unknown"
    worker.forget_apps()
    monkeypatch.delenv("PIPELINES_APP")
    worker.use_app(app)
    app.run_pipeline("multi", job_id="w1", initial_state={"n": 0})
    assert advance_job("w1", 1) == "advanced"


# --- continue_for's question: is other work waiting? ---------------------------------------
def in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def wait_until_redis_ran_llen(client: redis.Redis) -> None:
    """Until a connection's last command, as the server lists it, is the question's LLEN."""
    deadline = time.monotonic() + 5
    while not any(c["cmd"] == "llen" for c in client.client_list()):
        assert time.monotonic() < deadline, "the question never reached Redis"
        time.sleep(0.001)


def test_work_waiting_counts_the_queues_of_the_priority_and_those_above_it(scheduler: RQScheduler) -> None:
    assert not scheduler.work_waiting() and not scheduler.work_waiting("background")
    scheduler.schedule_advance("b", version=1, priority="background")
    assert not scheduler.work_waiting("interactive") and scheduler.work_waiting("background")
    scheduler.schedule_advance("i", version=1)
    assert scheduler.work_waiting() and scheduler.work_waiting("background")


def connections(client: redis.Redis) -> int:
    return len(client.client_list()) - 1  # without the one asking


def test_the_question_is_sent_when_asked_and_its_reply_read_when_answered(client: redis.Redis,
                                                                          scheduler: RQScheduler) -> None:
    answer = scheduler.probe_work_waiting()
    assert in_use(client) == 0  # on a connection of its own: the pool lends none for the length of a phase
    wait_until_redis_ran_llen(client)  # sent at once: the server has run it, nobody has read the reply
    scheduler.schedule_advance("later", version=1)  # on the pool's connection, meanwhile
    assert answer() is False  # Redis counted the queue when it was asked, before the advance was sent
    before = connections(client)
    assert scheduler.probe_work_waiting()() is True  # the same connection, in step, serves the next question
    assert connections(client) == before


def test_a_question_whose_reply_is_an_error_fails_and_leaves_no_half_read_connection(
        client: redis.Redis, scheduler: RQScheduler) -> None:
    client.set(scheduler.queue.key, "not a list")  # the first of the background question's two LLENs fails
    answer = scheduler.probe_work_waiting("background")
    with pytest.raises(StorageError, match=r"reading queue lengths.*WRONGTYPE"):
        answer()
    client.delete(scheduler.queue.key)
    scheduler.schedule_advance("j", version=1)
    # Read on a connection still holding the second LLEN's reply (0), this would say False.
    assert scheduler.probe_work_waiting()() is True


def test_a_question_to_an_unreachable_redis_is_unavailable_when_answered() -> None:
    dead = redis.Redis(host="127.0.0.1", port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    answer = RQScheduler(dead).probe_work_waiting()  # asking never raises: the answer says what went wrong
    with pytest.raises(StorageUnavailableError, match="Redis unreachable"):
        answer()


@pytest.mark.parametrize("pool", ["blocking", "small"])
def test_a_question_never_takes_a_connection_a_sized_pool_needs(redis_url: str, pool: str) -> None:
    # A worker sized its pool: the question must not hold a connection its phase's own writes need.
    if pool == "blocking":
        cp: redis.ConnectionPool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=0.2)
    else:
        cp = redis.ConnectionPool.from_url(redis_url, max_connections=1)
    client = redis.Redis(connection_pool=cp)
    scheduler = built(RQScheduler(client, queue=f"q-budget-{pool}"))
    answer = scheduler.probe_work_waiting()
    wait_until_redis_ran_llen(client)
    # The pool's one connection is free for the phase (were the question on it, the blocking pool would wait
    # 0.2 s and raise "No connection available", the small one raise "Too many connections").
    scheduler.schedule_advance("later", version=1)
    assert answer() is False  # still answered as it was when asked
    assert scheduler.probe_work_waiting()() is True
    scheduler.queue.empty()
    client.close()


def test_a_second_question_before_the_first_is_answered_is_answered_at_once(scheduler: RQScheduler) -> None:
    first = scheduler.probe_work_waiting()
    scheduler.schedule_advance("j", version=1)
    second = scheduler.probe_work_waiting()  # this thread's connection waits on the first: asked on the pool's
    # Answered in the other order: on one connection the second would read the first's reply.
    assert second() is True and first() is False


def test_each_thread_asks_on_its_own_connection(scheduler: RQScheduler) -> None:
    import threading

    answers: dict[str, Any] = {}
    asked = threading.Barrier(2)

    def ask(name: str) -> None:
        answer = scheduler.probe_work_waiting()
        asked.wait(5)  # both questions pending at once
        answers[name] = answer()

    threads = [threading.Thread(target=ask, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert answers == {"a": False, "b": False}


def test_a_question_asked_before_a_fork_is_not_read_in_the_child(monkeypatch: pytest.MonkeyPatch,
                                                                  scheduler: RQScheduler) -> None:
    import os

    import adapters.redis.pending as pending

    answer = scheduler.probe_work_waiting()
    child = os.getpid() + 1
    monkeypatch.setattr(pending.os, "getpid", lambda: child)  # from here on, this is a child the phase forked
    # Both hold the socket: the child reading would take the parent's reply (and the parent would wait for ever).
    with pytest.raises(StorageUnavailableError, match="asked in another process"):
        answer()
    scheduler.schedule_advance("j", version=1)
    assert scheduler.probe_work_waiting()() is True  # the child asks on a connection of its own


def test_a_process_that_lives_for_one_turn_asks_on_the_client_s_connection(monkeypatch: pytest.MonkeyPatch,
                                                                            client: redis.Redis,
                                                                            scheduler: RQScheduler) -> None:
    import os

    import adapters.redis.pending as pending

    monkeypatch.setattr(pending, "_ONE_QUESTION_PID", 0)  # restored after the test: this process is not a horse
    pending.one_question_process()  # what a forking worker's horse does first (adapters.rq.lifeline)
    child = os.getpid() + 1
    with monkeypatch.context() as forked:
        forked.setattr(pending.os, "getpid", lambda: child)  # a child of the marked process is not marked
        answer = scheduler._side.ask([("PING",)])
        assert answer is not None and answer.replies() == [b"PONG"]
    before = connections(client)
    scheduler.schedule_advance("j", version=1)
    assert scheduler.probe_work_waiting()() is True  # answered right
    assert connections(client) == before  # and no side connection made: a horse would pay a connect for it
    # A horse that asks again (continue_for kept its job for another turn) asks many: now it makes one.
    assert scheduler.probe_work_waiting()() is True
    assert connections(client) == before + 1


def test_a_turn_that_raises_under_continue_for_gives_its_question_s_connection_back(redis_url: str) -> None:
    from adapters.redis import RedisStorage
    from pipelines import Next, Phase

    client = redis.Redis.from_url(redis_url)
    storage = RedisStorage(client, prefix="probe-raise")
    scheduler = RQScheduler.for_storage(storage, queue="q-probe")
    turns: list[int] = []

    def step(ctx: Any) -> Next:
        turns.append(ctx.state)
        if ctx.state == 1:
            raise KeyboardInterrupt  # not an error the runner turns into data: it leaves advance_phase
        return Next("step", state=ctx.state + 1)

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("step", step)]}, continue_for=60.0)
    app.run_pipeline("p", job_id="j", initial_state=0)
    scheduler.queue.empty()  # the job's own advance, taken by this call: no other work waits
    with pytest.raises(KeyboardInterrupt):
        app.try_advance("j")
    assert turns == [0, 1]  # the first turn kept the lease (nothing waited) and the second ran in the same call
    assert in_use(client) == 0
    # The second turn's question was read on the way out: this thread's connection is free for the next one.
    pending = scheduler._side.ask([("PING",)])
    assert pending is not None and pending.replies() == [b"PONG"]
    client.close()


# --- errors at the edge -------------------------------------------------------------
def test_an_unreachable_redis_is_storage_unavailable() -> None:
    dead = redis.Redis(host="127.0.0.1", port=free_port(), retry=Retry(NoBackoff(), 0), socket_connect_timeout=0.5)
    with pytest.raises(StorageUnavailableError, match="Redis unreachable"):
        built(RQScheduler(dead)).schedule_advance("j", version=1)


@pytest.mark.parametrize("kwargs", [{"queue": ""}, {"app": "no-colon"}, {"job_timeout": 0}, {"result_ttl": -1}])
def test_bad_configuration_is_rejected(client: redis.Redis, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RQScheduler(client, **kwargs)


def test_the_sweep_puts_a_lost_advance_at_the_front_of_the_queue(redis_url: str) -> None:
    from adapters.redis import RedisStorage
    from pipelines import Done, Phase
    from pipelines.app import App

    storage = RedisStorage.from_url(redis_url)
    scheduler = built(RQScheduler(storage.client, queue="front"))
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", lambda ctx: Done())]})
    app.run_pipeline("p", job_id="lost")
    storage.client.delete(scheduler.queue.key)  # its message is lost
    for i in range(3):
        app.run_pipeline("p", job_id=f"fresh-{i}")  # a backlog of fresh work
    assert "lost" in app.requeue_overdue(grace=0)
    assert storage.client.llen(scheduler.queue.key) == 4  # the fresh ones, still queued, were not sent twice
    head = storage.client.lindex(scheduler.queue.key, 0)
    assert head is not None and head.decode() == rq_job_id("lost", 1)


# --- a delayed advance that RQ's scheduler never moved --------------------------------
def _late(client: redis.Redis, scheduler: RQScheduler, rq_id: str, seconds: float) -> None:
    """Make ``rq_id``'s time in the scheduled registry ``seconds`` ago (a scheduler that stopped then)."""
    client.zadd(ScheduledJobRegistry(queue=scheduler.queue).key, {rq_id: time.time() - seconds})


def test_a_delayed_advance_no_scheduler_moved_is_enqueued_again_and_leaves_the_registry(
        client: redis.Redis, scheduler: RQScheduler) -> None:
    # RQ's scheduler is one process that an exception (a Redis restart) ends, restarted by RQ only at
    # its 10-minute maintenance: a due message can sit in the registry that long.
    scheduler.schedule_advance("stuck", 30.0, version=2)
    registry = ScheduledJobRegistry(queue=scheduler.queue)
    _late(client, scheduler, "pr_nstuck-v2", SCHEDULER_LATE + 10)
    scheduler.requeue("stuck", version=2)
    assert scheduler.queue.get_job_ids() == ["pr_nstuck-v2"]
    assert registry.get_job_ids() == []  # a scheduler started later does not deliver it again
    assert scheduler.fetch("pr_nstuck-v2").get_status() == "queued"


def test_a_delayed_advance_due_a_moment_ago_is_left_to_rq_s_scheduler(client: redis.Redis,
                                                                      scheduler: RQScheduler) -> None:
    scheduler.schedule_advance("soon", 30.0, version=1)
    _late(client, scheduler, "pr_nsoon-v1", SCHEDULER_LATE / 2)
    scheduler.requeue("soon", version=1)
    scheduler.schedule_advance("soon", version=1)
    assert scheduler.queue.count == 0
    assert ScheduledJobRegistry(queue=scheduler.queue).get_job_ids() == ["pr_nsoon-v1"]


def test_the_sweep_recovers_a_retry_whose_delayed_message_no_scheduler_moved(redis_url: str) -> None:
    from adapters.redis import RedisStorage
    from pipelines import Done, Phase, RetryLater

    calls: list[int] = []

    def flaky(ctx: Any) -> Done:
        calls.append(1)
        if len(calls) == 1:
            raise RetryLater(0.01, "the effect store is down")
        return Done()

    storage = RedisStorage.from_url(redis_url)
    scheduler = RQScheduler(storage.client, queue="late")
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", flaky)]})
    app.run_pipeline("p", job_id="retry")
    worker.use_app(app)  # what `pipelines worker` does: the messages name no app path
    try:
        run_worker(app, None)  # the first attempt: RetryLater puts the next advance in the scheduled registry
        (rq_id,) = ScheduledJobRegistry(queue=scheduler.queue).get_job_ids()
        _late(storage.client, scheduler, rq_id, SCHEDULER_LATE + 10)  # and no RQ scheduler ever moves it
        time.sleep(0.05)  # the retry is due (0.01 s after its commit)
        assert app.requeue_overdue(grace=0) == ["retry"]
        run_worker(app, None)
    finally:
        worker.forget_apps()
    rec = storage.get_job("retry")
    assert rec is not None and rec.status is JobStatus.COMPLETE and len(calls) == 2


@pytest.mark.parametrize("status", ["created", "deferred", "queued"])
def test_the_sweep_sends_a_lost_advance_whatever_status_its_rq_hash_kept(redis_url: str, status: str) -> None:
    # A message lost between RQ's writes (a crash, an outage) can leave its hash "created" with no queue
    # holding it: the sweep must send it, not count it as waiting and say it re-enqueued it.
    from adapters.redis import RedisStorage
    from pipelines import Done, Phase

    storage = RedisStorage.from_url(redis_url)
    scheduler = built(RQScheduler(storage.client, queue="lostq"))
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", lambda ctx: Done())]})
    app.run_pipeline("p", job_id="lost")
    storage.client.hset(f"rq:job:{rq_job_id('lost', 1)}", "status", status)
    storage.client.delete(scheduler.queue.key)  # its message is gone from the queue
    assert app.requeue_overdue(grace=0) == ["lost"]
    assert scheduler.queue.get_job_ids() == [rq_job_id("lost", 1)]
    assert scheduler.fetch(rq_job_id("lost", 1)).get_status() == "queued"


def test_the_sweep_reports_no_re_enqueue_for_a_job_still_queued_behind_busy_workers(redis_url: str) -> None:
    from adapters.redis import RedisStorage
    from pipelines import Done, Phase

    storage = RedisStorage.from_url(redis_url)
    scheduler = built(RQScheduler(storage.client, queue="busyq"))
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", lambda ctx: Done())]})
    app.run_pipeline("p", job_id="waiting")  # queued; no worker is free to take it yet
    assert app.requeue_overdue(grace=0) == []  # nothing was sent, so nothing is reported as sent
    assert scheduler.queue.get_job_ids() == [rq_job_id("waiting", 1)]
