"""Real RQ worker processes (`pipelines worker`) on a real redis-server: throughput, and worker death."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
from rq import Worker
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from adapters.rq import RQScheduler, rq_job_id
from pipelines import JobStatus
from pipelines.app import App
from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

NAP_STARTED = "test:nap-started"  # tests/apps/redis_app.py: "<job id> <pid>" of each first nap


def statuses(app: App, job_ids: list[str]) -> dict[str, JobStatus]:
    out = {}
    for j in job_ids:
        rec = app.storage.get_job(j)
        out[j] = rec.status if rec else JobStatus.IDLE
    return out


def test_two_workers_run_30_multi_phase_jobs_to_completion(cluster: Cluster, app: App, client: redis.Redis) -> None:
    scheduler = app.scheduler
    assert isinstance(scheduler, RQScheduler)
    cluster.worker("fork-1")
    cluster.worker("simple-1", "--simple")
    wait_for("2 workers to register",
             lambda: len(Worker.all(connection=client, serializer=JSONSerializer)) == 2, 20, cluster.logs)

    jobs = [f"multi-{i}" for i in range(30)]
    for i, job_id in enumerate(jobs):
        app.run_pipeline("multi", job_id=job_id, initial_state={"n": i})

    wait_for("30 jobs to complete",
             lambda: set(statuses(app, jobs).values()) == {JobStatus.COMPLETE}, 60,
             lambda: f"{statuses(app, jobs)}\n{cluster.logs()}")
    pids: set[int] = set()
    for i, job_id in enumerate(jobs):
        rec = app.storage.get_job(job_id)
        assert rec is not None and rec.result["n"] == (i + 1) * 10 + 1 and rec.phases_done == 3
        pids.update(rec.result["pids"])

    def returned(job_id: str) -> list[object]:
        return [scheduler.fetch(rq_job_id(job_id, v)).return_value() for v in (1, 2, 3)]

    # One RQ job per turn, each finished with what the turn did. RQ stores a job's return value after the
    # job function returns, so after the turn's commit: a job complete in storage may not have it yet.
    wait_for("every turn's RQ job to hold its result",
             lambda: all(returned(j) == ["advanced", "advanced", "completed"] for j in jobs), 10,
             lambda: f"{ {j: returned(j) for j in jobs} }\n{cluster.logs()}")
    assert len(pids) > 1  # phases ran in more than one process (horses, the simple worker)
    assert FailedJobRegistry(queue=scheduler.queue).count == 0
    assert app.storage.due_jobs(time.time() + 3600) == []


def _start_nap(cluster: Cluster, app: App, client: redis.Redis, job_id: str) -> int:
    """Start a "sleepy" job and wait until a worker is inside its long nap; the napping pid."""
    app.run_pipeline("sleepy", job_id=job_id)
    entry = wait_for(f"{job_id} to start napping", lambda: client.lindex(NAP_STARTED, 0), 20, cluster.logs)
    started_job, pid = entry.decode().split()
    assert started_job == job_id
    cluster.pids.append(int(pid))
    return int(pid)


NAP_ENV = {"PIPELINES_LEASE": "3", "PIPELINES_NAP": "60"}


def test_a_worker_killed_mid_phase_is_recovered_by_advance_due_from_cron(
    cluster: Cluster, app: App, client: redis.Redis
) -> None:
    cluster.env.update(NAP_ENV)
    worker = cluster.worker("doomed", "--sweep-interval", "0")
    horse = _start_nap(cluster, app, client, "nap-cron")
    killed_at = time.monotonic()
    os.kill(horse, signal.SIGKILL)  # the horse has its own process group
    cluster.kill9(worker)

    # No worker is left: only cron's `pipelines advance --due` can finish the job,
    # once the dead worker's lease (3 s, no longer renewed) has expired.
    outputs: list[str] = []

    def cron_tick() -> bool:
        proc = cluster.cli("advance", "--due")
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout.strip())
        rec = app.storage.get_job("nap-cron")
        return rec is not None and rec.status is JobStatus.COMPLETE

    wait_for("cron to recover the job", cron_tick, 45, lambda: f"{outputs}\n{cluster.logs()}")
    rec = app.storage.get_job("nap-cron")
    assert rec is not None and rec.result["napped_in"] != horse
    assert "nap-cron advanced" in outputs and outputs[-1] == "nap-cron completed"
    assert int(client.get("test:nap:nap-cron") or 0) == 2  # the killed nap, then the recovering one
    assert time.monotonic() - killed_at < 45  # not RQ's ~11-minute cleanup


def test_a_worker_killed_mid_phase_is_recovered_by_another_workers_sweep(
    cluster: Cluster, app: App, client: redis.Redis
) -> None:
    cluster.env.update(NAP_ENV)
    doomed = cluster.worker("doomed", "--simple", "--sweep-interval", "0")
    napper = _start_nap(cluster, app, client, "nap-sweep")
    assert napper == doomed.pid  # a SimpleWorker runs the phase itself
    cluster.worker("survivor", "--sweep-interval", "0.5", "--sweep-grace", "1")
    cluster.kill9(doomed)

    wait_for("the survivor's sweep to finish the job",
             lambda: statuses(app, ["nap-sweep"])["nap-sweep"] is JobStatus.COMPLETE, 30, cluster.logs)
    rec = app.storage.get_job("nap-sweep")
    assert rec is not None and rec.result["napped_in"] != doomed.pid
    assert int(client.get("test:nap:nap-sweep") or 0) == 2


def test_a_forking_worker_s_horse_opens_one_redis_connection(cluster: Cluster, redis_url: str,
                                                             client: redis.Redis) -> None:
    # A horse runs one RQ job and exits, so every connection it opens is opened again by the next one. Under
    # continue_for a turn asks whether other work waits: on a side connection in a long-lived process, on the
    # client's own for a horse's first question (adapters.redis.pending.one_question_process), where the
    # connect would cost more than it saves. Jobs of one turn: one question a horse. The turn's three calls
    # go on a connection a thread keeps in a long-lived process, through the pool in a horse
    # (adapters.redis.held.pool_only_process).
    from bench import apps, w1

    env = {"BENCH_REDIS_URL": redis_url, "BENCH_QUEUE": "horses", "BENCH_TURNS": "1", "BENCH_CONTINUE": "0.25"}
    cluster.start(["-m", "pipelines", "worker", "--app", apps.APP_PATH, "--name", "horses", "--log-level",
                   "WARNING", "--sweep-interval", "0"], "horses", **env)
    app = apps.build(redis_url, queue="horses", turns=1, continue_for=0.25)
    key = f"{Worker.redis_worker_namespace_prefix}horses"
    wait_for("the worker to ask for a job", lambda: client.hget(key, "state") in (b"idle", b"busy"), 30,
             cluster.logs)
    agent = app.agents[apps.PIPELINE]

    def run(job_id: str) -> None:
        agent.run(job_id=job_id, messages=[w1.USER], storage=app.storage, scheduler=app.scheduler)
        wait_for(f"{job_id} to complete", lambda: (rec := app.storage.get_job(job_id)) is not None
                 and rec.status is JobStatus.COMPLETE, 30, cluster.logs)

    run("warm-up")  # the scripts loaded, every long-lived connection of the test and the worker made
    before = int(client.info("stats")["total_connections_received"]), int(client.hget(key, "successful_job_count"))
    for n in range(5):
        run(f"job-{n}")
    wait_for("RQ to count the last job", lambda: int(client.hget(key, "successful_job_count")) >= before[1] + 5, 10,
             cluster.logs)
    connections = int(client.info("stats")["total_connections_received"]) - before[0]
    horses = int(client.hget(key, "successful_job_count")) - before[1]
    assert horses == 5  # one a job
    assert connections == horses  # one a horse: its client's (a side connection would make it two)
