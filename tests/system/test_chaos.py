"""Chaos, CI-sized: worker kills, duplicate delivery and a Redis restart, with real workers and a real redis-server.

Each test starts its own redis-server and ``python -m pipelines worker``
processes of ``tests.apps.chaos_app`` (via ``bench.chaos_lib.Procs``: every
process killed by pid at the end, and with the test process). The model is
the loopback fake OpenAI server in this process, answering W1 through
litellm's real HTTP path. ``make chaos`` runs the same scenarios at full size.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.rq import rq_job_id
from bench import w1 as workload
from bench.chaos_lib import (
    Kill,
    Killer,
    Procs,
    W1Server,
    check_effects,
    check_jobs,
    diagnose,
    expected_transcript,
    find_redis_server,
    start_jobs,
    unfinished,
)
from pipelines import Agent, JobStatus
from pipelines.app import App
from pipelines.engine.errors import StorageUnavailableError
from pipelines.testing import ScriptedModel
from tests.apps import chaos_app
from tests.apps.agent_app import add
from tests.system.conftest import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

TURNS = 5
LEASE = 3.0


@pytest.fixture
def w1() -> Iterator[W1Server]:
    server = W1Server()
    yield server
    server.stop()


@pytest.fixture
def slow_w1() -> Iterator[W1Server]:
    server = W1Server(delay=0.1)
    yield server
    server.stop()


def _procs(appendonly: bool = False) -> Procs:
    if find_redis_server() is None:
        if os.environ.get("REQUIRE_REDIS") == "1":
            pytest.fail("REQUIRE_REDIS=1 but redis-server is not installed")
        pytest.skip("SKIPPING REDIS TESTS: redis-server not found (apt-get install redis-server)")
    return Procs(appendonly=appendonly)


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = _procs()
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture
def aof_procs() -> Iterator[Procs]:
    p = _procs(appendonly=True)
    try:
        yield p
    finally:
        p.cleanup()


def _setup(procs: Procs, w1: W1Server, workers: int, **env: str) -> tuple[App, redis.Redis, list[str]]:
    url = procs.start_redis()
    procs.configure(w1.url, CHAOS_LEASE=f"{LEASE:g}", CHAOS_QUEUE="chaos", **env)
    deliveries = int(env.get("CHAOS_DELIVERIES", "1"))
    app = chaos_app.build(url, w1.url, lease=LEASE, deliveries=deliveries)
    client = redis.Redis.from_url(url)
    names = [procs.start_worker(slot, sweep_interval=0.5, sweep_grace=1.0) for slot in range(workers)]
    procs.wait_ready(client, workers, timeout=90)
    return app, client, names


def _progress(app: App, jobs: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        rec = app.storage.get_job(j)
        key = rec.status.value if rec else "missing"
        out[key] = out.get(key, 0) + 1
    return out


def _assert_clean_outcome(app: App, client: redis.Redis, jobs: list[str], kills: Sequence[Kill] = (),
                          outages: Sequence[tuple[float, float]] = ()) -> None:
    jc = check_jobs(app, jobs, TURNS)
    assert jc.complete == len(jobs), (jc.statuses, jc.examples)
    assert jc.lost == 0 and jc.extra == 0 and jc.invalid == 0, jc
    assert jc.equal == len(jobs), jc.examples
    assert jc.stream_checked == len(jobs) and jc.stream_mismatch == 0, jc.examples  # clients get the committed text
    retry_jobs, recon_jobs = jobs[0::2], jobs[1::2]
    retry = check_effects(client, retry_jobs, TURNS, kills, outages)
    recon = check_effects(client, recon_jobs, TURNS, kills, outages)
    assert retry.missing == recon.missing == 0
    # The reconcile tool (non-idempotent) never applies an effect twice; the retry
    # tool may only repeat a call whose process was killed mid-call, or whose
    # journal write a Redis outage lost.
    assert recon.repeated == 0, recon
    assert retry.repeats_unexplained == 0, retry


# Every restarted worker imports litellm before it counts as ready (~4 s of CPU; a minute on a 2-core
# host running other suites): the default 120 s does not fit that, though nothing here is a speed goal.
@pytest.mark.timeout(300)
def test_workers_sigkilled_mid_run_lose_nothing_and_apply_no_effect_twice(procs: Procs, w1: W1Server) -> None:
    app, client, names = _setup(procs, w1, workers=3)

    def start(slot: int) -> str:
        return procs.start_worker(slot, sweep_interval=0.5, sweep_grace=1.0)

    killer = Killer(procs, app, client, every=0.7, start=start)
    for slot, name in enumerate(names):
        killer.adopt(name, slot)
    jobs = [f"kill-{i:02d}" for i in range(30)]
    start_jobs(app, jobs, TURNS)
    max_kills = 4
    # After two kills one worker may work alone while the others warm up (a minute under load): a bound
    # on progress, not a speed goal.
    deadline = time.monotonic() + 200
    lost_since: dict[str, float] = {}
    while time.monotonic() < deadline:
        killer.tick(killing=len(killer.kills) < max_kills)
        if not unfinished(app, jobs):
            if (len(killer.kills) >= 2 and killer.recoveries) or len(killer.kills) >= max_kills:
                break
            # Every job finished before a kill landed inside one (a victim is only a worker that finished a
            # job already, and the jobs can all be done by then on a fast run): more work for the next kill.
            more = [f"kill-{len(jobs) // 30}-{i:02d}" for i in range(30)]
            start_jobs(app, more, TURNS)
            jobs += more
        _fail_on_a_lost_message(app, client, jobs, lost_since)
        time.sleep(0.1)
    # A job can finish between the killer's last look and the check above: look once more.
    killer.tick(killing=False)
    assert not unfinished(app, jobs), f"{_progress(app, jobs)}\n{procs.logs()}"
    assert len(killer.kills) >= 2
    assert killer.recoveries, "no kill hit a worker in the middle of a job"
    _assert_clean_outcome(app, client, jobs, killer.kills)
    # A model call repeats only for a turn whose worker died inside it.
    assert w1.requests_for(jobs) - len(jobs) * TURNS <= len(killer.kills)
    # Every job a victim held moved on again once its lease ran out.
    assert all(r.advanced_after is not None for r in killer.recoveries)


@pytest.mark.timeout(300)
def test_workers_killed_every_half_second_for_the_whole_run_still_finish_every_job(procs: Procs,
                                                                                  slow_w1: W1Server) -> None:
    """Liveness: the system makes progress as long as workers live longer than one turn.

    A ready worker (one that asks RQ for jobs) is SIGKILLed every 0.5 s for as
    long as jobs run, make chaos's rate; never the last ready one, so each
    lives longer than a turn. A worker that took a job before litellm was
    loaded held that job's lease through the import and was killed inside
    it: no job advanced at all (the test above stops killing after 4).
    Each answer takes 0.1 s, so the 50 turns outlast the two kills the test
    needs (on a fast host, instant answers finished the run after one).
    """
    w1 = slow_w1
    app, client, names = _setup(procs, w1, workers=3)

    def start(slot: int) -> str:
        return procs.start_worker(slot, sweep_interval=0.5, sweep_grace=1.0)

    killer = Killer(procs, app, client, every=0.5, start=start)
    for slot, name in enumerate(names):
        killer.adopt(name, slot)
    jobs = [f"live-{i:02d}" for i in range(10)]
    start_jobs(app, jobs, TURNS)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and unfinished(app, jobs):
        killer.tick()
        time.sleep(0.1)
    killer.tick(killing=False)
    assert not unfinished(app, jobs), (f"{_progress(app, jobs)} after {len(killer.kills)} kills, "
                                       f"{w1.requests_for(jobs)} model calls\n{diagnose(app, client, jobs)}")
    assert len(killer.kills) >= 2, "too few kills to test anything"
    _assert_clean_outcome(app, client, jobs, killer.kills)


def _fail_on_a_lost_message(app: App, client: redis.Redis, jobs: list[str], lost_since: dict[str, float]) -> None:
    """Fail at once, and say why, when a kill inside RQ's dequeue left a job stuck (the bug of the test below).

    Its signature: the job is due and not leased, and its RQ message is
    "queued" but sits in RQ's intermediate queue (taken by the dead worker),
    not in the queue, for longer than the sweep needs to enqueue it again.
    """
    now = time.monotonic()
    for job_id in unfinished(app, jobs):
        rec = app.storage.get_job(job_id)
        if rec is None or rec.checkpoint is None or app.storage.lease_owner(job_id) is not None:
            continue
        rq_id = rq_job_id(job_id, rec.version)
        stuck = (client.hget(f"rq:job:{rq_id}", "status") == b"queued"
                 and client.lpos("rq:queue:chaos:intermediate", rq_id) is not None
                 and client.lpos("rq:queue:chaos", rq_id) is None)
        if not stuck:
            lost_since.pop(job_id, None)
        elif now - lost_since.setdefault(job_id, now) > 10:
            pytest.fail(f"{job_id} is stuck: its message {rq_id} was taken by a killed worker and the sweep "
                        "never enqueued it again (see test_a_message_taken_by_a_worker_that_died_at_once_...)")


def _clean_run(job_ids: list[str], url: str) -> dict[str, list[dict[str, object]]]:
    """The same jobs, one at a time, on the memory adapters: the clean run to compare with."""
    clock = VirtualClock(start=1_000_000.0)
    storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
    agent = Agent(name="clean", model="openai/fake-model", tools=[add], system=chaos_app.SYSTEM, max_turns=20,
                  model_params={"api_base": url, "api_key": "sk-test", "timeout": 20})
    out = {}
    for job_id in job_ids:
        agent.run(job_id=job_id, messages=[chaos_app.user_message(job_id, TURNS)], storage=storage,
                  scheduler=scheduler)
        scheduler.drain()
        out[job_id] = storage.messages(job_id)
    return out


def test_every_advance_delivered_three_times_gives_the_transcripts_of_a_clean_run(procs: Procs,
                                                                                   w1: W1Server) -> None:
    app, client, _ = _setup(procs, w1, workers=2, CHAOS_DELIVERIES="3")
    jobs = [f"dup-{i:02d}" for i in range(12)]  # `make chaos` runs the same with 100 jobs
    start_jobs(app, jobs, TURNS)
    wait_for("12 jobs to complete", lambda: not unfinished(app, jobs), 90,
             lambda: f"{_progress(app, jobs)}\n{procs.logs()}")
    # The extra copies were delivered and run (as no-ops, or as the job's next turn).
    wait_for("the queue to drain", lambda: client.llen("rq:queue:chaos") == 0, 30)
    runs = sum(int(client.hget(k, "successful_job_count") or 0) for k in client.smembers("rq:workers"))
    assert runs >= 2 * len(jobs) * TURNS, runs
    _assert_clean_outcome(app, client, jobs)
    assert w1.requests_for(jobs) == len(jobs) * TURNS  # no model call twice
    clean_server = W1Server()
    try:
        clean = _clean_run(jobs, clean_server.url)
    finally:
        clean_server.stop()
    for job_id in jobs:
        assert app.storage.messages(job_id) == clean[job_id] == expected_transcript(job_id, TURNS)


def test_a_redis_restart_with_appendonly_loses_nothing_and_workers_survive(aof_procs: Procs, w1: W1Server) -> None:
    app, client, names = _setup(aof_procs, w1, workers=2)
    jobs = [f"aof-{i:02d}" for i in range(12)]
    start_jobs(app, jobs, TURNS)
    wait_for("a third of the turns", lambda: w1.requests_for(jobs) >= len(jobs) * TURNS // 3, 60)
    down = time.time()
    aof_procs.stop_redis()  # SIGTERM: redis-server writes its AOF and exits
    time.sleep(1.0)
    aof_procs.start_redis()  # same port, same dir: the AOF is loaded
    outage = (down, time.time())

    def settled() -> bool:
        try:
            return not unfinished(app, jobs)
        except Exception:  # noqa: BLE001 - the test's own client may still be reconnecting
            return False

    wait_for("every job to complete after the restart", settled, 90,
             lambda: f"{_progress(app, jobs)}\n{diagnose(app, client, jobs)}\n{aof_procs.logs()}")
    assert [n for n in names if aof_procs.workers[n].poll() is not None] == [], aof_procs.logs()
    # An effect applied as Redis stopped may be applied again (the retry tool's
    # at-least-once); never by the reconcile tool, and never otherwise.
    _assert_clean_outcome(app, client, jobs, outages=[outage])


class _OutageStorage(MemoryStorage):
    """Memory storage whose first journal write of a model response fails as Redis does after its retries."""

    outages = 1

    def record_step(self, job_id: str, **kwargs: Any) -> None:
        if kwargs.get("key") == "model" and self.outages:
            self.outages -= 1
            raise StorageUnavailableError(
                f"Redis is unreachable while journaling step 'model' of job {job_id!r} (retries exhausted)")
        super().record_step(job_id, **kwargs)


def test_a_storage_outage_inside_a_turn_does_not_fail_the_job() -> None:
    def run(storage_class: type[MemoryStorage]) -> tuple[Any, list[dict[str, Any]]]:
        clock = VirtualClock(start=1_000_000.0)
        storage, scheduler = storage_class(clock=clock), MemoryScheduler(clock=clock)
        agent = Agent(name="w1", model=ScriptedModel(workload.reply_fn(TURNS)), tools=[workload.add],
                      max_turns=TURNS + 1)
        app = App(storage=storage, scheduler=scheduler, agents=[agent])
        agent.run(job_id="j", messages=[workload.USER], storage=storage, scheduler=scheduler)
        for _ in range(5):  # the queue, then the sweep once any lease has run out (I7)
            scheduler.drain()
            clock.advance(120)
            app.advance_due()
        return storage.get_job("j"), storage.messages("j")

    clean, clean_messages = run(MemoryStorage)
    assert clean.status is JobStatus.COMPLETE
    rec, messages = run(_OutageStorage)
    assert rec.status is JobStatus.COMPLETE, rec.error
    assert messages == clean_messages


def test_a_message_taken_by_a_worker_that_died_at_once_is_enqueued_again_by_the_sweep(redis_url: str) -> None:
    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler
    from pipelines import Done, Phase

    storage = RedisStorage.from_url(redis_url)
    scheduler = RQScheduler(storage.client, queue="lost")
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", lambda ctx: Done(result=1))]},
              lease_seconds=3)
    app.run_pipeline("p", job_id="lost-1")
    rec = storage.get_job("lost-1")
    assert rec is not None
    rq_id = rq_job_id("lost-1", rec.version)
    client = storage.client
    assert client.lrange("rq:queue:lost", 0, -1) == [rq_id.encode()]
    # What RQ 3's worker does first (Queue.dequeue_any -> LMOVE), then the worker is SIGKILLed
    # before it marks the job started: the RQ job still says "queued" but no queue holds it.
    client.lmove("rq:queue:lost", "rq:queue:lost:intermediate")
    assert scheduler.fetch(rq_id).get_status() == "queued"

    assert app.requeue_overdue(grace=0) == ["lost-1"]
    assert client.lrange("rq:queue:lost", 0, -1) == [rq_id.encode()], "the sweep did not enqueue the job again"


def test_a_port_taken_before_redis_starts_is_swapped_but_a_restart_keeps_its_port(procs: Procs) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        procs.port = taken.getsockname()[1]  # another process won the race for the free port
        url = procs.start_redis()
        assert procs.port != taken.getsockname()[1]
        assert redis.Redis.from_url(url).ping()
        procs.stop_redis()
        procs.port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="Address already in use"):
            procs.start_redis()  # a restart must not move: workers hold the old URL
