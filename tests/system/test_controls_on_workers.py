"""Pause, cancel and per-run options with real ``pipelines worker`` processes (tests/apps/controls_app.py).

A ticker job runs many short turns (each sleeps in its tool), so a turn is
in flight whenever the test steps in. Pause and cancel must land at that
turn's boundary: the turn in flight commits, the next one never starts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from pipelines import JobStatus
from pipelines.app import App
from tests.apps.controls_app import APP_PATH, Invoice, build_app, signal_key, started_key
from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]

TRIES = 3
TURNS = 6  # tool turns of a ticker job (then one "done" turn)


def start_workers(cluster: Cluster, continue_for: float) -> None:
    env = {"CONTROLS_CONTINUE_FOR": str(continue_for)}
    for name, extra in (("fork", []), ("simple", ["--simple"])):
        cluster.start(["-m", "pipelines", "worker", "--app", APP_PATH, "--name", f"controls-{name}",
                       "--log-level", "WARNING", *extra], f"controls-{name}", **env)


@pytest.fixture
def test_app(redis_url: str) -> Iterator[App]:
    """The test's own handle on the app the workers run (same Redis, same queue)."""
    a = build_app(redis_url)
    yield a
    a.storage.close()  # type: ignore[attr-defined]


def committed_turns(app: App, job_id: str) -> int:
    return sum(1 for m in app.messages(job_id) if m["role"] == "assistant")


def started_turns(client: redis.Redis, job_id: str) -> int:
    return int(client.llen(started_key(job_id)))


def await_turn_start(client: redis.Redis, cluster: Cluster, job_id: str, turn: int) -> None:
    """Block until the ticker's turn ``turn`` has started (its tool now sleeps)."""
    while True:
        popped = client.blpop([signal_key(job_id)], timeout=30)
        if popped is None:
            pytest.fail(f"job {job_id}: turn {turn} never started\n{cluster.logs()}")
        if int(popped[1]) >= turn:
            return


def stop_mid_run(app: App, client: redis.Redis, cluster: Cluster, job_id: str, kind: str) -> tuple[int, int]:
    """Start a ticker job, ``kind`` it while its 2nd turn is in flight; returns (committed before, after)."""
    app.run_agent("ticker", job_id=job_id, messages=[f"tick {job_id} {TURNS}"])
    await_turn_start(client, cluster, job_id, 2)
    before = committed_turns(app, job_id)
    view = app.pause(job_id, wait=5) if kind == "pause" else app.cancel(job_id, wait=5)
    target = JobStatus.PAUSED if kind == "pause" else JobStatus.CANCELLED
    if view.status is not target:
        # The wait ran out with the turn still in flight: the request stays stored for it.
        assert view.control == kind, (view.status, view.control)
        wait_for(f"{job_id} to be {target.value}", lambda: status(app, job_id) is target, 5, cluster.logs)
    stored = app.storage.get_job(job_id)
    assert stored is not None and stored.control is None  # applied, so no longer pending
    return before, committed_turns(app, job_id)


def status(app: App, job_id: str) -> JobStatus | None:
    record = app.storage.get_job(job_id)
    return None if record is None else record.status


@pytest.mark.parametrize("continue_for", [0.0, 0.5])
def test_pause_and_cancel_land_at_the_turn_boundary(cluster: Cluster, test_app: App, client: redis.Redis,
                                                     continue_for: float) -> None:
    start_workers(cluster, continue_for)
    for i in range(TRIES):
        for kind in ("pause", "cancel"):
            job_id = f"{kind}-{continue_for}-{i}"
            before, after = stop_mid_run(test_app, client, cluster, job_id, kind)
            # Only the turn in flight committed, and no turn started after it.
            assert after - before <= 1, (job_id, before, after)
            assert started_turns(client, job_id) == after, (job_id, after)
            events = [e.type for e in test_app.events(job_id)]
            assert events[-1] == f"job_{'paused' if kind == 'pause' else 'cancelled'}", events
            if kind == "cancel":
                continue
            resumed = test_app.resume(job_id)  # at once: a stale queued message must not make it conflict
            assert resumed.status is JobStatus.RUNNING
            done = test_app.handle(job_id).wait(timeout=30)
            assert done.status is JobStatus.COMPLETE, (done.status, done.error, cluster.logs())
            assert done.result == "done"
            assert committed_turns(test_app, job_id) == TURNS + 1
            assert started_turns(client, job_id) == TURNS + 1  # no turn ran twice across pause and resume


def test_per_run_options_are_honoured_by_workers(cluster: Cluster, test_app: App) -> None:
    start_workers(cluster, 0.0)
    limited = test_app.run_agent("looper", job_id="looper-1", messages=["count"], max_turns=2)
    typed = test_app.run_agent("clerk", job_id="clerk-1", messages=["invoice please"], output_schema=Invoice)

    view = limited.wait(timeout=30)
    assert view.status is JobStatus.COMPLETE, (view.status, view.error, cluster.logs())
    assert view.stop_reason == "max_turns"
    assert view.usage.model_calls == 2  # the agent's own limit is 10
    assert sum(1 for m in test_app.messages("looper-1") if m["role"] == "assistant") == 2

    view = typed.wait(timeout=30)
    assert view.status is JobStatus.COMPLETE, (view.status, view.error, cluster.logs())
    got = test_app.get("clerk-1")
    assert got is not None and got.result == Invoice(number="A-1", total=5)
    assert got.record.result == {"number": "A-1", "total": 5}
