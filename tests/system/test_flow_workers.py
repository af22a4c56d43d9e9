"""Flow control across real worker processes: a concurrency key and a shared rate limit hold (bench.flow_apps)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from tests.system.conftest import Cluster, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.system]


def run_jobs(cluster: Cluster, redis_url: str, jobs: int, env: dict[str, str], key: str | None,
             monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float, str]]:
    for k, v in {"BENCH_REDIS_URL": redis_url, **env}.items():
        monkeypatch.setenv(k, v)
    from bench import flow_apps

    app = flow_apps.build(redis_url)
    for i in range(2):
        cluster.start(["-m", "pipelines", "worker", "--app", flow_apps.APP_PATH, "--simple", "--log-level",
                       "WARNING"], f"flow-{i}", BENCH_REDIS_URL=redis_url, **env)
    options: dict[str, Any] = {"concurrency_key": key} if key else {}
    for i in range(jobs):
        app.run_agent("w1", job_id=f"f{i}", user="count", **options)
    wait_for(f"{jobs} jobs to complete", lambda: all(
        (v := app.get(f"f{i}")) is not None and v.status.value == "complete" for i in range(jobs)), 120, cluster.logs)
    client = app.storage.client  # type: ignore[attr-defined]
    calls = [raw.decode().split(" ", 2) for raw in client.lrange("flowbench:calls", 0, -1)]
    return sorted((float(s), float(e), j) for s, e, j in calls)


def test_a_concurrency_limit_of_one_per_key_never_lets_two_turns_overlap(
        cluster: Cluster, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = run_jobs(cluster, redis_url, 3, {"FLOW_CONCURRENCY": "1", "FLOW_LATENCY": "0.05",
                                             "FLOW_CONTINUE": "0", "W1_TURNS": "3"}, "tenant-1", monkeypatch)
    assert len(calls) >= 3
    for (_, end, _), (start, _, _) in itertools.pairwise(calls):
        assert start >= end - 0.005, calls  # two workers, one key: one model call at a time


def test_a_shared_rate_limit_holds_across_workers(cluster: Cluster, redis_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rpm = 600.0  # 10 calls a second, shared by both workers
    t0 = time.time()
    calls = run_jobs(cluster, redis_url, 4, {"FLOW_RPM": str(rpm), "FLOW_CONTINUE": "0"}, None, monkeypatch)
    starts = [c[0] for c in calls if c[0] >= t0]
    assert len(starts) >= 20
    burst = rpm / 60  # the bucket holds one second of calls
    # A token bucket's promise, checked over every window of the run: no more calls than the bucket held
    # plus what refilled meanwhile (a small slack for clocks), however the workers took their turns.
    for i in range(len(starts)):
        for j in range(i + 1, len(starts)):
            allowed = burst + rpm / 60 * (starts[j] - starts[i]) + 1
            assert j - i + 1 <= allowed, (i, j, starts[j] - starts[i])


def test_a_turn_longer_than_its_slots_first_lease_still_runs_alone(
        cluster: Cluster, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each model call takes 6 s; a slot is first leased for 1.5 x 1.5 s = 2.25 s. Only its renewal with the
    # job's lease (every half second, by the worker's lease keeper) keeps the other job's turn out.
    calls = run_jobs(cluster, redis_url, 2, {"FLOW_CONCURRENCY": "1", "FLOW_LATENCY": "6", "FLOW_LEASE": "1.5",
                                             "FLOW_TURNS": "1", "FLOW_CONTINUE": "0"}, "tenant-1", monkeypatch)
    assert len(calls) == 2
    (_, first_end, _), (second_start, _, _) = calls
    assert second_start >= first_end - 0.005, calls
