"""Redis memory per finished job, with and without retention (issue 14); part of ``make bench``.

    python bench/retention.py            # 400 W1 jobs of 10 turns, each side
    python bench/retention.py --quick    # 60 jobs

A steady flow on a private redis-server: one W1 job (bench/w1.py) finishes
every ``--gap`` simulated seconds (a virtual clock; nothing sleeps). Without
retention every finished job stays; with ``App(retention=R)`` the sweep
(``app.advance_due()``, what cron or a worker runs) deletes jobs finished more
than R seconds ago, so only about R / gap of them are kept. Printed: Redis
``MEMORY USAGE`` summed over one finished job's keys (record, transcript,
logs, events, live stream), the jobs left, the growth of ``used_memory``, and
the ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adapters.memory import MemoryScheduler, VirtualClock  # noqa: E402
from adapters.redis import RedisStorage  # noqa: E402
from bench import w1  # noqa: E402
from bench.procs import Children  # noqa: E402
from pipelines import Agent, App  # noqa: E402
from pipelines.testing import ScriptedModel  # noqa: E402
from tests.redis_server import find_redis_server  # noqa: E402


def job_bytes(storage: RedisStorage, job_id: str) -> int:
    """MEMORY USAGE (exact: SAMPLES 0) summed over the job's own keys."""
    total = 0
    for key in storage.keys(job_id):
        used = storage.client.memory_usage(key, samples=0)
        total += int(used or 0)
    return total


def flow(url: str, *, jobs: int, turns: int, gap: float, retention: float | None) -> dict[str, Any]:
    """``jobs`` W1 jobs finishing ``gap`` seconds apart; the sweep runs after each one."""
    storage = RedisStorage.from_url(url, prefix=f"ret{uuid.uuid4().hex[:6]}")
    clock = VirtualClock(start=1_700_000_000.0)
    agent = Agent(name="w1", model=ScriptedModel(w1.reply_fn(turns)), tools=[w1.add], system=w1.SYSTEM,
                  max_turns=turns + 1)
    app = App(storage=storage, scheduler=MemoryScheduler(clock=clock), agents=[agent], provenance=False,
              retention=retention)
    storage.client.memory_purge()
    before = int(storage.client.info("memory")["used_memory"])
    sizes = []
    for j in range(jobs):
        app.run_agent("w1", job_id=f"j{j}", messages=[w1.USER])
        app.drain()
        sizes.append(job_bytes(storage, f"j{j}"))
        clock.advance(gap)
        app.advance_due()
    after = int(storage.client.info("memory")["used_memory"])
    kept = len(storage.client.smembers(storage.jobs_key))
    storage.client.close()
    return {"per_job": statistics.median(sizes), "kept": kept, "growth": after - before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--gap", type=float, default=1.0, help="simulated seconds between finished jobs")
    p.add_argument("--retention", type=float, default=None, help="seconds (default: a tenth of the run)")
    args = p.parse_args(argv)
    jobs = args.jobs or (60 if args.quick else 400)
    retention = args.retention if args.retention is not None else jobs * args.gap / 10
    if find_redis_server() is None:
        print("retention bench skipped: redis-server not found (apt-get install redis-server)")
        return 0
    kids = Children()
    try:
        url = kids.redis()
        off = flow(url, jobs=jobs, turns=args.turns, gap=args.gap, retention=None)
        on = flow(url, jobs=jobs, turns=args.turns, gap=args.gap, retention=retention)
    finally:
        kids.cleanup()
    print(f"retention: {jobs} W1 jobs x {args.turns} turns, one finished every {args.gap:g} s, "
          f"retention {retention:g} s")
    rows = [("Redis MEMORY USAGE per finished job (its keys)", f"{off['per_job']:,.0f} B", f"{on['per_job']:,.0f} B"),
            ("jobs kept at the end", f"{off['kept']:,}", f"{on['kept']:,}"),
            ("used_memory growth over the run", f"{off['growth']:,} B", f"{on['growth']:,} B"),
            ("  per job started", f"{off['growth'] / jobs:,.0f} B", f"{on['growth'] / jobs:,.0f} B")]
    print(f"{'figure':<48}{'retention off':>16}{'retention on':>16}")
    for name, a, b in rows:
        print(f"{name:<48}{a:>16}{b:>16}")
    ratio = off["growth"] / on["growth"] if on["growth"] > 0 else float("inf")
    print(f"ratio used_memory growth off / on: {ratio:.1f}x  (jobs kept off / on: "
          f"{off['kept'] / max(1, on['kept']):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
