"""Whatever lives with a lease is renewed with it and released with it: `kill -9` of a worker's pid alone.

Not its process group, as a machine dying would take: the OOM killer or an
operator's ``kill -9 <pid>`` ends only the worker. Its work-horse (in a
process group of its own) and RQ's scheduler child must end with it: the
horse so that it commits no turn after its worker is gone, the scheduler so
that it lets go of RQ's scheduler lock for the worker that replaces it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis

from pipelines import JobStatus
from pipelines.app import App
from tests.system.conftest import Cluster, wait_for
from tests.system.test_workers import NAP_ENV, _start_nap

pytestmark = [pytest.mark.redis, pytest.mark.system]

LOCKS = "rq:scheduler-lock:*"


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie nobody reaped has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_kill_9_of_a_worker_ends_its_horse_and_its_scheduler_and_frees_the_lock(
    cluster: Cluster, app: App, client: redis.Redis
) -> None:
    cluster.env.update(NAP_ENV)  # a 3 s lease; the first nap sleeps 60 s
    doomed = cluster.worker("doomed", "--sweep-interval", "0")
    horse = _start_nap(cluster, app, client, "orphan")
    schedulers = wait_for("RQ's scheduler child", lambda: [p for p in Cluster.children(doomed.pid) if p != horse],
                          20, cluster.logs)
    cluster.pids += schedulers  # killed at the end if the test fails
    assert client.keys(LOCKS), "the worker's scheduler holds no lock"
    napping = app.storage.get_job("orphan")
    assert napping is not None and napping.checkpoint is not None and napping.checkpoint.next_phase == "nap"

    os.kill(doomed.pid, signal.SIGKILL)  # the worker's pid alone
    doomed.wait(10)
    wait_for("the horse to end with its worker", lambda: not running(horse), 5, cluster.logs)
    wait_for("the scheduler child to end with its worker", lambda: not any(map(running, schedulers)), 10,
             cluster.logs)
    wait_for("RQ's scheduler lock to be released", lambda: not client.keys(LOCKS), 5, cluster.logs)
    rec = app.storage.get_job("orphan")
    assert rec is not None and rec.version == napping.version  # the dead worker's horse committed nothing

    cluster.worker("heir", "--sweep-interval", "0.5", "--sweep-grace", "1")
    wait_for("the heir to finish the job",
             lambda: (r := app.storage.get_job("orphan")) is not None and r.status is JobStatus.COMPLETE,
             30, cluster.logs)
    wait_for("the heir's scheduler to take the lock", lambda: client.keys(LOCKS), 10, cluster.logs)
    rec = app.storage.get_job("orphan")
    assert rec is not None and rec.result["napped_in"] != horse
    assert int(client.get("test:nap:orphan") or 0) == 2  # the killed nap, then the heir's


def test_kill_9_mid_turn_with_default_settings_another_worker_finishes_the_job(
    cluster: Cluster, app: App, client: redis.Redis
) -> None:
    # Nothing configured: the App's default lease (renewed while the turn runs) and the worker's default sweep.
    # How soon the job runs again is measured by `make chaos` (its recovery scenario), not asserted here.
    assert "PIPELINES_LEASE" not in cluster.env
    cluster.env["PIPELINES_NAP"] = "600"  # the first nap: far longer than this test may take
    doomed = cluster.worker("doomed")
    horse = _start_nap(cluster, app, client, "default-orphan")
    assert Cluster.children(doomed.pid).count(horse) == 1  # the doomed worker's horse runs the turn
    cluster.worker("survivor")

    os.kill(doomed.pid, signal.SIGKILL)  # mid-turn, the worker's pid alone
    doomed.wait(10)
    wait_for("another worker to finish the job",
             lambda: (r := app.storage.get_job("default-orphan")) is not None and r.status is JobStatus.COMPLETE,
             100, cluster.logs)
    rec = app.storage.get_job("default-orphan")
    assert rec is not None and rec.result["napped_in"] != horse
    assert int(client.get("test:nap:default-orphan") or 0) == 2  # the killed turn, then the one that finished it


def test_a_worker_restarted_under_its_fixed_name_after_kill_9_starts_and_a_live_twin_is_refused(
    cluster: Cluster, app: App, client: redis.Redis
) -> None:
    # A fixed-name deployment (systemd, a StatefulSet) restarts a crashed worker under the same --name: RQ keeps
    # the dead one's registration for minutes and would refuse the name with a traceback meanwhile.
    alive = "pipelines:worker-alive:fixed"
    first = cluster.worker("fixed", "--simple", "--alive-ttl", "2")
    wait_for("the worker to keep its alive key", lambda: client.exists(alive), 20, cluster.logs)
    Cluster.kill9(first)
    assert client.ttl("rq:worker:fixed") > 60  # RQ would refuse the name for that long

    again = cluster.worker("fixed", "--simple", "--alive-ttl", "2")
    wait_for("the restarted worker to register",
             lambda: client.hget("rq:worker:fixed", "pid") == str(again.pid).encode(), 20, cluster.logs)
    wait_for("it to keep its alive key", lambda: client.get(alive) == str(again.pid).encode(), 10, cluster.logs)
    app.run_pipeline("multi", job_id="after-restart", initial_state={"n": 0})
    wait_for("the restarted worker to serve jobs",
             lambda: (r := app.storage.get_job("after-restart")) is not None and r.status is JobStatus.COMPLETE,
             30, cluster.logs)

    twin = cluster.worker("fixed-twin", "--simple", "--name", "fixed")  # the last --name wins: "fixed"
    assert twin.wait(20) == 1
    output = (cluster.logdir / "fixed-twin.log").read_text()
    assert output.startswith("error: a worker named 'fixed'") and "is alive" in output, output
    assert "Traceback" not in output
    assert again.poll() is None and client.hget("rq:worker:fixed", "pid") == str(again.pid).encode()
