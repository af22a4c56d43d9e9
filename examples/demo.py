"""`make demo`: a three-phase pipeline on the memory adapters, printed as it runs."""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Done, Next, Phase, PhaseContext, run_pipeline


def fetch(ctx: PhaseContext[Any]) -> Next:
    rows = ctx.step("download", lambda: [3, 1, 2])
    ctx.log(f"fetched {len(rows)} rows")
    return Next("sort", state={"rows": rows})


def sort(ctx: PhaseContext[Any]) -> Next:
    return Next("report", state={"rows": sorted(ctx.state["rows"])}, delay=60)


def report(ctx: PhaseContext[Any]) -> Done:
    return Done(result={"smallest": ctx.state["rows"][0]})


def main() -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    phases = [Phase("fetch", fetch), Phase("sort", sort), Phase("report", report)]
    run_pipeline(job_id="demo-1", phases=phases, storage=storage, scheduler=scheduler, initial_state={})
    scheduler.drain()
    job = storage.get_job("demo-1")
    assert job is not None
    for entry in storage.logs("demo-1"):
        print(f"[{entry.level}] {entry.phase}: {entry.message}")
    print(f"status={job.status} result={job.result}")


if __name__ == "__main__":
    main()
