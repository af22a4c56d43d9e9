"""CeleryScheduler with real ``celery worker`` processes and the real redis-server as broker.

Workers are ``python -m celery -A tests.apps.celery_app:celery worker`` (solo
pool: the turn runs in the worker process itself, so SIGKILL of its group is
a machine dying mid-turn). The model is the W1 fake OpenAI server in this
process (bench.chaos_lib.W1Server), reached through litellm's real HTTP path.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("celery", reason="the celery extra is not installed (pip install phaserunner[celery])")

from bench.chaos_lib import W1Server, check_effects, expected_transcript, start_jobs, unfinished
from pipelines import JobStatus
from pipelines.app import App, queues
from tests.apps import celery_app
from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

TURNS = 5
QUEUE = "celery-test"


@pytest.fixture
def w1() -> Iterator[W1Server]:
    server = W1Server()
    yield server
    server.stop()


def exact_transcripts(app: App, job_ids: list[str]) -> list[str]:
    """Jobs that are not complete with exactly the W1 transcript (the pinned system prompt first)."""
    bad = []
    for job_id in job_ids:
        view = app.get(job_id)
        got = app.storage.messages(job_id)
        if view is None or view.status is not JobStatus.COMPLETE or got != expected_transcript(job_id, TURNS):
            bad.append(f"{job_id}: {view.status if view else 'missing'}, {len(got)} messages")
    return bad


def celery_worker(cluster: Cluster, name: str, **env: str) -> subprocess.Popen[bytes]:
    """One ``celery worker`` process on the test queue (its own session, killed at the end)."""
    return cluster.start(["-m", "celery", "-A", "tests.apps.celery_app:celery", "worker", "-Q", QUEUE,
                          "-P", "solo", "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                          "--without-heartbeat", "-l", "WARNING"], name, CELERY_QUEUE=QUEUE, **env)


def test_thirty_jobs_of_five_turns_complete_on_two_celery_workers(redis_url: str, cluster: Cluster,
                                                                  w1: W1Server) -> None:
    _celery, app = celery_app.build(redis_url, w1.url, queue=QUEUE)
    for n in (1, 2):
        celery_worker(cluster, f"w{n}", FAKE_OPENAI_BASE=w1.url)
    job_ids = [f"cj-{i}" for i in range(30)]
    start_jobs(app, job_ids, TURNS)

    wait_for("30 jobs complete", lambda: not unfinished(app, job_ids), 90, cluster.logs)
    assert exact_transcripts(app, job_ids) == []
    effects = check_effects(app.storage.client, job_ids, TURNS)  # type: ignore[attr-defined]
    assert (effects.missing, effects.repeated) == (0, 0)
    # Each turn's model call happened once: no delivery of a message ran a turn twice.
    assert w1.repeated_for(job_ids) == 0
    app.storage.close()  # type: ignore[attr-defined]


def _sweep_until_done(app: App, job_id: str, cluster: Cluster, timeout: float) -> None:
    """What cron's ``pipelines advance --due`` does, every half second, until the job finished."""

    def done() -> bool:
        view = app.get(job_id)
        if view is not None and view.status is JobStatus.RUNNING:
            app.requeue_overdue(grace=1.0)
            return False
        return True

    wait_for(f"{job_id} recovered", done, timeout, cluster.logs)


def test_a_worker_killed_mid_tool_call_is_recovered_with_no_duplicate_effect(redis_url: str, cluster: Cluster,
                                                                              w1: W1Server) -> None:
    victim_job = "kill-1"  # index 1: the reconcile agent (start_jobs alternates retry, reconcile)
    stall_key = f"{victim_job}/call_2"
    _celery, app = celery_app.build(redis_url, w1.url, queue=QUEUE, lease=2.0, alive_ttl=3.0)
    workers = [celery_worker(cluster, f"w{n}", FAKE_OPENAI_BASE=w1.url, CELERY_LEASE="2", CELERY_ALIVE_TTL="3",
                             CELERY_STALL_KEY=stall_key) for n in (1, 2)]
    job_ids = ["kill-0", victim_job, "kill-2", "kill-3"]
    start_jobs(app, job_ids, TURNS)
    client = app.storage.client  # type: ignore[attr-defined]

    stalled = wait_for("the tool to stall after its effect", lambda: client.lrange(celery_app.STALLED, 0, -1),
                       60, cluster.logs)
    _key, pid = stalled[0].decode().split()
    victim = next(w for w in workers if w.pid == int(pid))
    assert int(client.get(f"chaos:applied:{stall_key}")) == 1  # the effect landed before the kill
    # The workers page: both worker processes, the victim busy with the stalled job since it started (an
    # advance is listed once it has run adapters.celery.lifeline.LIST_AFTER).
    def victim_busy() -> Any:
        rows = {w.name: w for w in queues.report(app).workers or []}
        row = next((w for name, w in rows.items() if name.endswith(f"pid {pid}")), None)
        busy = row is not None and row.job_id == victim_job and row.state == "busy" and row.since is not None
        return rows if busy else None

    rows = wait_for("the victim listed busy with the stalled job", victim_busy, 5, cluster.logs)
    assert sorted(name.split("@")[0] for name in rows) == ["w1", "w2"], rows
    Cluster.kill9(victim)
    wait_for("the killed worker to drop off the workers page", lambda: all(
        not w.name.endswith(f"pid {pid}") for w in queues.report(app).workers or []), 3 + 5, cluster.logs)

    # The message stays unacked with the dead worker (redelivered only after the visibility timeout):
    # the sweep re-sends it once the lease ran out, and the other worker finishes the job.
    _sweep_until_done(app, victim_job, cluster, 60)
    wait_for("every job complete", lambda: not unfinished(app, job_ids), 60, cluster.logs)
    assert exact_transcripts(app, job_ids) == []
    effects = check_effects(client, job_ids, TURNS)
    assert (effects.missing, effects.repeated) == (0, 0), "the reconcile tool's effect was applied twice"
    assert int(client.get(f"chaos:applied:{stall_key}")) == 1
    view = app.get(victim_job)
    assert view is not None and view.status is JobStatus.COMPLETE
    client.close()
