"""`pipelines health`: a probe for storage, the due backlog and the RQ workers (real Redis, real workers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from rq import Worker
from rq.serializers import JSONSerializer

from pipelines.app import App
from tests.system.conftest import APP_PATH, ROOT, Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]


def health(env: dict[str, str], *extra: str) -> tuple[int, dict[str, object]]:
    out = subprocess.run([sys.executable, "-m", "pipelines", "health", "--app", APP_PATH, "--json", *extra],
                         capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    return out.returncode, json.loads(out.stdout)


def test_health_fails_without_a_worker_and_passes_once_one_is_alive(cluster: Cluster, app: App,
                                                                     client: redis.Redis) -> None:
    code, report = health(cluster.env)
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[union-attr]
    assert code == 1 and checks["storage"]["ok"] and not checks["workers"]["ok"]
    cluster.worker("probe-1", "--simple")
    wait_for("the worker to register", lambda: len(Worker.all(connection=client, serializer=JSONSerializer)) == 1,
             20, cluster.logs)
    code, report = health(cluster.env)
    assert code == 0 and report["ok"] is True


def test_a_job_overdue_past_the_limit_is_unhealthy_and_named(cluster: Cluster, app: App) -> None:
    app.run_pipeline("multi", job_id="late-1", initial_state={"n": 0})  # queued; no worker runs it
    code, report = health(cluster.env, "--max-overdue", "0")
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[union-attr]
    assert code == 1 and not checks["backlog"]["ok"] and "oldest late-1" in checks["backlog"]["detail"]
    _, report = health(cluster.env, "--max-overdue", "3600")
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[union-attr]
    assert checks["backlog"]["ok"] and "1 due" in checks["backlog"]["detail"]


def test_unreachable_storage_is_unhealthy(cluster: Cluster) -> None:
    from tests.redis_server import free_port

    code, report = health({**cluster.env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    checks = report["checks"]
    assert code == 1 and checks[0]["name"] == "storage" and not checks[0]["ok"]  # type: ignore[index]
    assert "unreachable" in checks[0]["detail"]  # type: ignore[index]


def test_a_worker_killed_with_kill_9_is_dead_to_health_within_seconds(cluster: Cluster, app: App) -> None:
    ttl = 3.0  # `--alive-ttl` (default 10 s): how soon health calls a silent worker dead
    # Forking, with RQ's scheduler child: the default worker.
    doomed = cluster.worker("doomed-probe", "--alive-ttl", f"{ttl:g}")
    wait_for("health to see the worker", lambda: health(cluster.env)[0] == 0, 30, cluster.logs)
    time.sleep(ttl + 1)  # past one TTL of its alive key: it is renewed, not just set once
    code, report = health(cluster.env)
    assert code == 0, report

    os.kill(doomed.pid, signal.SIGKILL)  # the worker's pid alone; RQ still has it registered
    doomed.wait(10)
    killed = time.monotonic()

    def dead() -> dict[str, object] | None:
        checks = {c["name"]: c for c in health(cluster.env)[1]["checks"]}  # type: ignore[union-attr]
        return None if checks["workers"]["ok"] else checks["workers"]

    workers = wait_for("health to call the killed worker dead", dead, ttl + 10, cluster.logs)
    assert "0 alive of 1 registered" in str(workers["detail"])
    assert time.monotonic() - killed < ttl + 10  # not RQ's worker TTL (7 minutes)


def test_a_worker_that_outlives_redis_losing_its_data_is_healthy_again_within_seconds(
        cluster: Cluster, app: App, client: redis.Redis) -> None:
    # A Redis restart without persistence (or FLUSHALL) drops RQ's record of every worker, which RQ never
    # rebuilds: the workers go on serving, so health must see them again, not fail until they restart.
    cluster.worker("phoenix", "--simple", "--alive-ttl", "3")
    wait_for("health to see the worker", lambda: health(cluster.env)[0] == 0, 30, cluster.logs)
    client.flushall()
    wait_for("the worker to register again", lambda: health(cluster.env)[0] == 0, 10, cluster.logs)
    (worker,) = Worker.all(connection=client, serializer=JSONSerializer)
    assert worker.name == "phoenix" and worker.hostname and worker.queue_names()
    assert client.hget(worker.key, "state") in (b"idle", b"busy")  # as RQ writes it (not "WorkerStatus.IDLE")
    app.run_pipeline("multi", job_id="after-flush", initial_state={"n": 0})
    wait_for("the worker to serve jobs",
             lambda: (r := app.storage.get_job("after-flush")) is not None and r.status.value == "complete",
             30, cluster.logs)


def test_a_worker_that_stops_is_not_registered_again_by_its_beat(cluster: Cluster, client: redis.Redis) -> None:
    stopping = cluster.worker("leaving", "--simple", "--alive-ttl", "1")
    wait_for("health to see the worker", lambda: health(cluster.env)[0] == 0, 30, cluster.logs)
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(15) == 0
    time.sleep(1.5)  # past a beat
    assert Worker.all(connection=client, serializer=JSONSerializer) == []
    assert not client.exists("pipelines:worker-alive:leaving")
