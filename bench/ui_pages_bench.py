"""Figure 15: the web page with 100,000 stored jobs and a 1,200-message job: server time and bytes per refresh.

``python -m bench.ui_pages_bench [--jobs 100000] [--repeat 20] [--storages redis,sqlite]``

Per storage (a private redis-server; an SQLite file): ``--jobs`` finished job
records written through the storage (as many runs leave them), then one W1
agent job of 600 turns, 1,200 messages, run in this process (scripted model,
in-process scheduler). The page (:func:`pipelines.web.ui.ui_app`) is served
through Starlette's TestClient, so a figure is the server's work (storage
reads and rendering), not a network's. For each request: median and p95
server time over ``--repeat`` requests, and the bytes of the answer. The
requests are what a person's browser sends:

* the jobs page; its live refresh (every 3 s: the 50 rows shown, by id);
  a page 1,800 pages (90,000 jobs) deep, by cursor; a search by id substring;
* the 1,200-message job's page; its live refresh after an event (with
  nothing new to show: the refresh a person pays for each event).

Nothing is asserted. The script only uses URLs the page had before issue 35
too, so the same script run against an older checkout gives the "before"
(see bench/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from adapters.memory import MemoryScheduler
from bench.procs import Children
from bench.w1 import SYSTEM, USER, add, reply_fn
from pipelines import Agent, App
from pipelines.engine.models import JobRecord, JobStatus
from pipelines.testing import ScriptedModel
from pipelines.web.ui import ui_app

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

TURNS = 600  # 1 user message + 599 (assistant, tool) pairs + "done": 1,200 messages
LONG = "long-1200"


def _fill(storage: Any, jobs: int) -> None:
    now = time.time()
    statuses = [JobStatus.COMPLETE] * 8 + [JobStatus.ERROR, JobStatus.CANCELLED]
    for n in range(jobs):
        storage.create_job(JobRecord(job_id=f"job-{n:06d}", pipeline="w1", status=statuses[n % len(statuses)],
                                     created_at=now - jobs + n, updated_at=now - jobs + n,
                                     options={"tags": ["batch"] if n % 1000 else ["batch", "rare"]}))


def _measure(client: TestClient, path: str, repeat: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: {response.status_code} {response.text[:300]}")
        size = len(response.content)
    return times, size


def _line(name: str, times: list[float], size: int) -> str:
    ms = sorted(times)
    p50, p95 = statistics.median(ms), ms[max(0, int(len(ms) * 0.95) - 1)]
    return f"  {name:<44} median {p50:7.1f} ms   p95 {p95:7.1f} ms   {size / 1024:8.1f} KiB"


def _requests(app: App, jobs: int) -> list[tuple[str, str]]:
    shown = app.storage.list_jobs(limit=50)
    ids = ",".join(r.job_id for r in shown)
    depth = min(90_000, jobs * 9 // 10)  # jobs deep: 90,000 of 100,000
    deep = app.storage.get_job(f"job-{jobs - depth:06d}")
    assert deep is not None
    total = app.storage.get_job(LONG).transcript_len  # type: ignore[union-attr]
    # What a page following the conversation, the log and the events sends after an event (nothing new here).
    logs, events = len(app.storage.logs(LONG)), app.storage.events(LONG, limit=100_000)[-1].id
    refresh = f"/jobs/{LONG}/live?from={total}&first={max(0, total - 100)}&logs_seen={logs}&events_seen={events}"
    return [
        ("jobs page", "/"),
        ("jobs page, live refresh (50 rows)", f"/?partial=1&ids={ids}&loaded={time.time()}"),
        (f"jobs page {depth // 50:,} deep (cursor)",
         f"/?page={depth // 50 + 1}&before={deep.updated_at!r}/{deep.job_id}"),
        ("jobs search: id contains '0999'", "/?q=0999"),
        (f"job page ({total} messages)", f"/jobs/{LONG}"),
        ("job page, live refresh after an event", refresh),
    ]


def _storage(kind: str, children: Children, folder: Path) -> Any:
    if kind == "redis":
        from adapters.redis import RedisStorage

        return RedisStorage.from_url(children.redis())
    if kind == "sqlite":
        from adapters.sqlite import SQLiteStorage

        return SQLiteStorage(str(folder / "ui.db"), synchronous="NORMAL")
    raise SystemExit(f"unknown storage {kind!r}: redis or sqlite")


def run(kind: str, jobs: int, repeat: int, children: Children) -> None:
    with tempfile.TemporaryDirectory(prefix="ui-pages-") as folder:
        storage = _storage(kind, children, Path(folder))
        started = time.perf_counter()
        _fill(storage, jobs)
        filled = time.perf_counter() - started
        agent = Agent(name="w1", model=ScriptedModel(reply_fn(TURNS)), tools=[add], system=SYSTEM,
                      max_turns=TURNS + 1)
        app = App(storage=storage, scheduler=MemoryScheduler(), agents=[agent], provenance=False)
        app.run_agent("w1", job_id=LONG, user=USER)
        app.drain()
        print(f"{kind}: {jobs} job records stored in {filled:.1f} s; {LONG}: "
              f"{app.storage.get_job(LONG).transcript_len} messages")  # type: ignore[union-attr]
        with TestClient(ui_app(app), base_url="http://127.0.0.1") as client:
            for name, path in _requests(app, jobs):
                print(_line(name, *_measure(client, path, repeat)), flush=True)
        close = getattr(storage, "close", None)
        if close is not None:
            close()


def main(argv: list[str] | None = None) -> int:
    """Run the figure and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="stored job records (default: 100000)")
    parser.add_argument("--repeat", type=int, default=20, help="requests per line (default: 20)")
    parser.add_argument("--storages", default="redis,sqlite", help="comma-separated: redis, sqlite")
    args = parser.parse_args(argv)
    children = Children()
    try:
        for kind in args.storages.split(","):
            run(kind.strip(), args.jobs, args.repeat, children)
    finally:
        children.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
