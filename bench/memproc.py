"""Figure 5 in a fresh process: peak RSS of a memory-adapter worker after N jobs, and ``import pipelines`` time.

``python -m bench.memproc rss --checkpoints 10,1000 [--keep]`` runs W1 jobs one
after another on MemoryStorage + MemoryScheduler and prints, as JSON, the peak
(``VmHWM``) and current (``VmRSS``) RSS at each checkpoint. By default each job is deleted from
storage once complete and the ScriptedModel's request log is cleared, so what
grows is what the worker machinery keeps; ``--keep`` keeps every job stored.

``python -m bench.memproc import`` prints how long ``import pipelines`` took
and which heavy modules it pulled in.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import sys  # noqa: E402


def _import() -> None:
    import pipelines  # noqa: F401

    elapsed = time.perf_counter() - _T0
    import json

    print(json.dumps({"seconds": elapsed, "litellm": "litellm" in sys.modules, "redis": "redis" in sys.modules,
                      "rq": "rq" in sys.modules, "modules": len(sys.modules)}))


def _rss(checkpoints: list[int], turns: int, keep: bool) -> None:
    import gc
    import json

    from adapters.memory import MemoryScheduler, MemoryStorage
    from bench import w1
    from bench.apps import w1_agent
    from pipelines.testing import ScriptedModel

    def status() -> dict[str, float]:
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child of a big
        # parent (the bench, after litellm) would report the parent's peak.
        gc.collect()
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmHWM", "VmRSS")))
        return {k: int(v.split()[0]) / 1024 for k, v in fields.items()}  # KiB -> MiB

    storage, scheduler = MemoryStorage(), MemoryScheduler()
    model = ScriptedModel(w1.reply_fn(turns))
    agent = w1_agent(turns, model)
    out = {"start": status()}
    done = 0
    for target in checkpoints:
        while done < target:
            job_id = f"m{done}"
            agent.run(job_id=job_id, messages=[w1.USER], storage=storage, scheduler=scheduler)
            scheduler.drain()
            if not keep:
                storage.delete_job(job_id)
                model.calls.clear()
            done += 1
        out[str(target)] = status()
    print(json.dumps(out))


def main() -> int:
    if sys.argv[1:2] == ["import"]:
        _import()
        return 0
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["rss"])
    p.add_argument("--checkpoints", default="10,1000")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    _rss([int(x) for x in args.checkpoints.split(",")], args.turns, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
