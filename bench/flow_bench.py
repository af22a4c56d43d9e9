"""Figure 7: flow control on Redis with real worker processes (``python -m bench.flow_bench``).

- 7a: a shared rate limit below the offered load: 3 workers, 40 W1 jobs of 10
  turns started at once, ``rpm`` = 600. The measured model call rate (steady
  state, after the first burst) over the limit; target within 5%. Workers
  never sleep for capacity: a refused turn is deferred (the count is printed).
- 7b: a concurrency limit of 2 per key: 3 workers, 12 jobs on one key, a
  model that takes 50 ms. The most model calls in flight at once, from the
  calls' start/end log; target never above 2.
- 7c: ``continue_for`` vs a new conversation: 200 W1 jobs started at once on 2
  workers; the wait for each job's first turn (enqueue -> first model call),
  p50 and p99 with ``continue_for=0.25`` over ``continue_for=0``; target <= 1.2x.
Printed, never asserted; a missed target reads ``MISS``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.procs import Children

__all__ = ["main"]


def _calls(client: Any) -> list[tuple[float, float, str]]:
    out = []
    for raw in client.lrange("flowbench:calls", 0, -1):
        start, end, job = raw.decode().split(" ", 2)
        out.append((float(start), float(end), job))
    return sorted(out)


def _run(kids: Children, url: str, *, workers: int, jobs: int, env: dict[str, str], key: str | None = None,
         timeout: float = 300) -> tuple[Any, dict[str, float], list[tuple[float, float, str]]]:
    """Start workers with ``env``, enqueue ``jobs`` W1 runs, wait for all; (app, enqueue times, call log)."""
    import os

    os.environ.update({"BENCH_REDIS_URL": url, **env})
    from bench import flow_apps

    app = flow_apps.build(url)
    app.storage.client.flushdb()  # type: ignore[attr-defined]
    procs = [kids.python(f"flow-w{i}", ["-m", "pipelines", "worker", "--app", flow_apps.APP_PATH, "--simple",
                                        "--log-level", "WARNING"], BENCH_REDIS_URL=url, **env)
             for i in range(workers)]
    time.sleep(1.5)  # workers up before the load starts
    enqueued = {}
    for i in range(jobs):
        job_id = f"j{i}"
        enqueued[job_id] = time.time()
        options: dict[str, Any] = {"concurrency_key": key} if key else {}
        app.run_agent("w1", job_id=job_id, user="count", **options)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [app.get(f"j{i}") for i in range(jobs)]
        if all(v is not None and v.status.value == "complete" for v in views):
            break
        time.sleep(0.2)
    for proc in procs:
        kids.stop(proc)
    return app, enqueued, _calls(app.storage.client)  # type: ignore[attr-defined]


def _deferrals(app: Any, jobs: int) -> int:
    """Turns deferred by flow control: each logs nothing and commits nothing, so count the extra model-free runs."""
    return sum(1 for i in range(jobs) for e in app.events(f"j{i}") if e.type == "retry_scheduled")


def fig7a(kids: Children, url: str) -> str:
    rpm = 600.0
    app, _, calls = _run(kids, url, workers=3, jobs=40, env={"FLOW_RPM": str(rpm), "FLOW_CONTINUE": "0"})
    starts = [c[0] for c in calls]
    burst = max(1, int(rpm / 60))
    steady = starts[burst:]
    rate = (len(steady) - 1) / (steady[-1] - steady[0]) * 60 if len(steady) > 1 else float("nan")
    ratio = rate / rpm
    ok = "ok" if abs(ratio - 1) <= 0.05 else "MISS"
    return (f"7a rate limit {rpm:.0f} rpm, 3 workers, {len(calls)} calls: measured {rate:.0f} rpm = {ratio:.3f}x "
            f"the limit (target within 5%: {ok}); attempts spent on waiting: {_deferrals(app, 40)}")


def fig7b(kids: Children, url: str) -> str:
    _, _, calls = _run(kids, url, workers=3, jobs=12, key="tenant-1",
                       env={"FLOW_CONCURRENCY": "2", "FLOW_LATENCY": "0.05", "FLOW_CONTINUE": "0"})
    edges = sorted([(s, 1) for s, _, _ in calls] + [(e, -1) for _, e, _ in calls], key=lambda x: (x[0], x[1]))
    live = most = 0
    for _, d in edges:
        live += d
        most = max(most, live)
    ok = "ok" if most <= 2 else "MISS"
    return f"7b concurrency limit 2 per key, 3 workers, {len(calls)} calls: at most {most} at once ({ok})"


def _first_waits(enqueued: dict[str, float], calls: list[tuple[float, float, str]]) -> list[float]:
    first: dict[str, float] = {}
    for start, _, job in calls:
        first.setdefault(job, start)
    return sorted(first[j] - t for j, t in enqueued.items() if j in first)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def fig7c(kids: Children, url: str) -> str:
    waits = {}
    for cf in ("0", "0.25"):
        _, enqueued, calls = _run(kids, url, workers=2, jobs=200, env={"FLOW_CONTINUE": cf})
        waits[cf] = _first_waits(enqueued, calls)
    p50 = _pct(waits["0.25"], 0.5) / _pct(waits["0"], 0.5)
    p99 = _pct(waits["0.25"], 0.99) / _pct(waits["0"], 0.99)
    ok = "ok" if max(p50, p99) <= 1.2 else "MISS"
    return (f"7c first-turn wait, 200 W1 jobs on 2 workers: continue_for=0 p50 {_pct(waits['0'], 0.5):.2f}s "
            f"p99 {_pct(waits['0'], 0.99):.2f}s; continue_for=0.25 p50 {_pct(waits['0.25'], 0.5):.2f}s "
            f"p99 {_pct(waits['0.25'], 0.99):.2f}s; ratio p50 {p50:.2f}x p99 {p99:.2f}x (target <= 1.2x: {ok})")


def main(argv: list[str] | None = None) -> int:
    only = set((argv or sys.argv[1:] or ["abc"])[0])
    kids = Children()
    lines = []
    try:
        url = kids.redis()
        for name, fig in (("a", fig7a), ("b", fig7b), ("c", fig7c)):
            if name in only:
                lines.append(fig(kids, url))
    finally:
        kids.cleanup()
    print("\nFigure 7: flow control (Redis, real worker processes)")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
