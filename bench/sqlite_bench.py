"""W1 on the embedded durable default: SQLiteStorage + LocalScheduler in one process (``python -m bench.sqlite_bench``).

Prints turns/s for J jobs x T turns under ``synchronous=FULL`` (the default)
and ``NORMAL``, next to the same jobs on memory adapters (the engine's floor
in this process), and the bytes the file and its WAL hold afterwards. Ratios,
never assertions: the figures depend on the disk's ``fsync``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from adapters.local import LocalScheduler
from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.sqlite import SQLiteStorage
from bench import w1
from pipelines import Agent, App
from pipelines.testing import ScriptedModel


def _agent(turns: int) -> Agent:
    return Agent(name="w1", model=ScriptedModel(w1.reply_fn(turns)), tools=[w1.add], system=w1.SYSTEM,
                 max_turns=turns + 1, stream=False)


def _wait(app: App, ids: list[str]) -> None:
    # Each job is read until it has finished, then never again: the jobs finish together in the last round,
    # and looking at every finished one again each 10 ms took the GIL from the worker being timed (about a
    # read per turn, a tenth of the run).
    for job_id in ids:
        while (view := app.get(job_id)) is not None and not view.finished:
            time.sleep(0.01)


def run_sqlite(jobs: int, turns: int, synchronous: str, workers: int) -> dict[str, Any]:
    """Turns/s of ``jobs`` W1 jobs on a fresh SQLite file worked by ``workers`` local threads."""
    folder = tempfile.mkdtemp(prefix="w1-sqlite-")
    path = os.path.join(folder, "w1.db")
    app = App(storage=SQLiteStorage(path, synchronous=synchronous), scheduler=LocalScheduler(workers=workers),
              agents=[_agent(turns)], provenance=False)
    ids = [f"j{n}" for n in range(jobs)]
    started = time.perf_counter()
    with app.scheduler:  # type: ignore[attr-defined]
        for job_id in ids:
            app.run_agent("w1", job_id=job_id, user=w1.USER)
        _wait(app, ids)
    seconds = time.perf_counter() - started
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    app.storage.close()  # type: ignore[attr-defined]
    shutil.rmtree(folder, ignore_errors=True)
    return {"turns/s": jobs * turns / seconds, "seconds": seconds, "bytes": size}


def run_memory(jobs: int, turns: int) -> dict[str, Any]:
    """The same jobs on memory adapters, drained in this thread: what the engine costs without storage."""
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[_agent(turns)], provenance=False)
    started = time.perf_counter()
    for n in range(jobs):
        app.run_agent("w1", job_id=f"j{n}", user=w1.USER)
    app.drain()
    seconds = time.perf_counter() - started
    return {"turns/s": jobs * turns / seconds, "seconds": seconds, "bytes": 0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    rows = {"memory (floor)": run_memory(args.jobs, args.turns)}
    for sync in ("FULL", "NORMAL"):
        rows[f"sqlite {sync}"] = run_sqlite(args.jobs, args.turns, sync, args.workers)
    floor = rows["memory (floor)"]["turns/s"]
    print(f"W1 J={args.jobs} x T={args.turns}, {args.workers} local workers")
    print(f"{'':16} {'turns/s':>9} {'/ floor':>8} {'seconds':>8} {'file+WAL bytes':>15}")
    for name, row in rows.items():
        print(f"{name:16} {row['turns/s']:9.0f} {row['turns/s'] / floor:8.3f} {row['seconds']:8.2f} "
              f"{row['bytes']:15,d}")


if __name__ == "__main__":
    main()
