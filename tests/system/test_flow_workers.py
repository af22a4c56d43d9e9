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


def test_a_short_sweep_grace_sends_a_job_waiting_in_line_no_second_chain_of_retries(
        cluster: Cluster, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # RQ delivers a delayed message up to RQScheduler.lateness (2 s) late. A sweep that counted a waiting job
    # overdue sooner sent it a second advance, whose deferral started a second chain: the job then asked in
    # pairs a few hundredths of a second apart, for ever. Its asks are read off its place's deadline
    # ("!<job>", scored DEADLINE_BASE + when it asked + LINE_SECONDS).
    from adapters.memory.flow import DEADLINE_BASE
    from pipelines.engine.flow import LINE_SECONDS

    env = {"BENCH_REDIS_URL": redis_url, "FLOW_CONCURRENCY": "1", "FLOW_LATENCY": "30", "FLOW_TURNS": "1",
           "FLOW_CONTINUE": "0"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    from bench import flow_apps

    app = flow_apps.build(redis_url)
    for i in range(2):
        cluster.start(["-m", "pipelines", "worker", "--app", flow_apps.APP_PATH, "--log-level", "WARNING",
                       "--sweep-interval", "1", "--sweep-grace", "1"], f"line-{i}", **env)
    store = app.storage.flow_store()  # type: ignore[attr-defined]
    app.run_agent("w1", job_id="holder", user="count", concurrency_key="t-1")  # its one call takes 30 s
    wait_for("the holder's slot", lambda: store.slots("t-1", time.time()), 30, cluster.logs)
    for i in range(3):
        app.run_agent("w1", job_id=f"w{i}", user="count", concurrency_key="t-1")
    client, key = app.storage.client, store.slots_key("t-1")  # type: ignore[attr-defined]
    asks: dict[str, list[float]] = {}
    end = time.time() + 10
    while time.time() < end:
        for member, score in client.zrange(key, 0, -1, withscores=True):
            job = member.decode()
            if job.startswith("!"):
                seen = asks.setdefault(job[1:], [])
                if not seen or seen[-1] != score:
                    seen.append(score)
        time.sleep(0.01)
    assert store.line("t-1", time.time()) == ["w0", "w1", "w2"]
    for job, scores in asks.items():
        gaps = [b - a for a, b in itertools.pairwise(scores)]
        assert len(gaps) >= 2 and min(gaps) > 0.5, (job, gaps, cluster.logs())  # one chain: no pairs
        assert max(gaps) < LINE_SECONDS, (job, gaps)  # each asked in time to keep its place
    assert all(score > DEADLINE_BASE for scores in asks.values() for score in scores)


def test_a_parent_and_its_children_share_its_key_one_turn_at_a_time_on_workers(
        cluster: Cluster, redis_url: str) -> None:
    # Limit 1 per key: the parent's turn that starts 3 children lets its slot go at its commit, the children
    # take turns under the parent's key (and priority: the background queue), and the woken parent finishes.
    from tests.apps import family_flow_app

    app = family_flow_app.build(redis_url)
    for i in range(2):
        cluster.start(["-m", "pipelines", "worker", "--app", family_flow_app.APP_PATH, "--log-level", "WARNING"],
                      f"family-{i}")
    app.run_agent("boss", job_id="p", user="go", concurrency_key="t-acme", priority="background")
    wait_for("the family to complete", lambda: (v := app.get("p")) is not None and v.status.value == "complete",
             60, cluster.logs)
    children = app.storage.get_job("p").children  # type: ignore[union-attr]
    assert len(children) == 3
    for child in children:
        record = app.storage.get_job(child)
        assert record is not None and record.status.value == "complete"
        assert record.options["concurrency_key"] == "t-acme" and record.options["priority"] == "background"
    client = app.storage.client  # type: ignore[attr-defined]
    calls = sorted((float(s), float(e), j) for s, e, j in
                   (raw.decode().split(" ", 2) for raw in client.lrange(family_flow_app.CALLS, 0, -1)))
    assert len(calls) == 5  # the parent's two, one each child's
    for (_, end, _), (start, _, _) in itertools.pairwise(calls):
        assert start >= end - 0.005, calls  # never two turns of the key at once
