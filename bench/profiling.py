"""Where a W1 turn spends its time: cProfile over the memory W1 and over RQ worker turns.

    python bench/profiling.py memory         # 200 jobs x 10 turns on the memory adapters
    python bench/profiling.py rq             # phaserunner turns run by an in-process RQ SimpleWorker
    python bench/profiling.py rq-baseline    # the bare RQ chaining baseline, same worker
    python bench/profiling.py long           # one 200-turn job on Redis, advanced in-process

Prints the top entries by own time and by cumulative time. Not part of
``make bench``; the findings are in bench/README.md.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import w1  # noqa: E402
from bench.procs import Children  # noqa: E402


def show(prof: cProfile.Profile, turns: int, top: int) -> None:
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.strip_dirs().sort_stats(key).print_stats(top)
        text = buf.getvalue()
        body = text[text.index("ncalls"):] if "ncalls" in text else text
        print(f"\n=== top {top} by {key} ({turns} turns) ===\n{body}")


def profile_memory(top: int) -> None:
    from bench.apps import w1_agent
    from bench.run import memory_run

    memory_run(5, 10, w1_agent(10), "warm")
    prof = cProfile.Profile()
    agent = w1_agent(10)
    prof.enable()
    memory_run(200, 10, agent, "prof")
    prof.disable()
    show(prof, 2000, top)


def _rq(top: int, baseline: bool) -> None:
    kids = Children()
    try:
        url = kids.redis()
        os.environ["BENCH_REDIS_URL"] = url
        os.environ["BENCH_QUEUE"] = "prof"
        import redis
        from rq import Queue, SimpleWorker
        from rq.serializers import JSONSerializer

        from bench import apps
        from bench import baseline_rq as base
        from pipelines import worker

        jobs, turns = 50, 10
        conn = redis.Redis.from_url(url)
        queue = Queue("prof", connection=conn, serializer=JSONSerializer)
        if baseline:
            for j in range(jobs):
                base.enqueue(queue, f"b{j}", 0, turns)
        else:
            app = apps.app
            assert app is not None
            worker.use_app(app, path=apps.APP_PATH)
            agent = app.agents[apps.PIPELINE]
            for j in range(jobs):
                agent.run(job_id=f"p{j}", messages=[w1.USER], storage=app.storage, scheduler=app.scheduler)
        worker = SimpleWorker([queue], connection=conn, serializer=JSONSerializer)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        worker.work(burst=True, logging_level="WARNING")
        prof.disable()
        elapsed = time.perf_counter() - t0
        print(f"{jobs * turns} turns in {elapsed:.2f}s under cProfile: {elapsed / (jobs * turns) * 1e3:.2f} ms/turn")
        show(prof, jobs * turns, top)
    finally:
        kids.cleanup()


def profile_long(top: int) -> None:
    from bench.run import long_job

    kids = Children()
    try:
        url = kids.redis()
        long_job(url, 20, "warm", False)
        prof = cProfile.Profile()
        prof.enable()
        long_job(url, 200, "prof", False)
        prof.disable()
        show(prof, 200, top)
    finally:
        kids.cleanup()


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "memory"
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    if what == "memory":
        profile_memory(top)
    elif what == "rq":
        _rq(top, baseline=False)
    elif what == "rq-baseline":
        _rq(top, baseline=True)
    elif what == "long":
        profile_long(top)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
