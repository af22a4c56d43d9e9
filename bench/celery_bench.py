"""W1 on two Celery workers next to bare Celery task chaining (``make bench`` runs it after bench/run.py).

``python -m bench.celery_bench [--jobs J --turns T --runs R]`` starts a
private redis-server (broker and storage), then, for each side, two
``celery worker`` processes (solo pool) of this module:

* phaserunner: the W1 agent (scripted model, ``add`` tool) on RedisStorage
  with :class:`adapters.celery.CeleryScheduler` — every turn checkpointed.
* bare Celery: the task ``bench.celery_turn`` computes the same answer and
  tool result in memory, stores nothing and sends its successor (one task id
  per turn, JSON), the way people chain Celery tasks by hand.

It prints turns/s of each side and their ratio (target >= 1.0, as for RQ);
a missed target is printed as ``MISS``, never asserted. Worker processes
load this module, configured by ``BENCH_REDIS_URL``/``BENCH_QUEUE``/``BENCH_TURNS``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from celery import Celery

from adapters.celery import CeleryScheduler
from adapters.redis import RedisStorage
from bench import w1
from bench.apps import w1_agent
from pipelines.app import App
from tests.redis_server import die_with_parent, find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[1]
APP_PATH = "bench.celery_bench:app"
CHAIN_TASK = "bench.celery_turn"
DONE_KEY = "bench:celery:done"


def make_celery(url: str) -> Celery:
    celery = Celery("bench", broker=url, set_as_current=False)
    celery.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"],
                       task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                       broker_connection_retry_on_startup=True, task_ignore_result=True)
    return celery


def _build() -> tuple[Celery | None, App | None]:
    url = os.environ.get("BENCH_REDIS_URL")
    if not url:
        return None, None
    celery = make_celery(url)
    storage = RedisStorage.from_url(url, prefix="bench")
    scheduler = CeleryScheduler.for_storage(celery, storage, queue=os.environ.get("BENCH_QUEUE", "ours"),
                                            app=APP_PATH)
    agent = w1_agent(int(os.environ.get("BENCH_TURNS", "10")))
    return celery, App(storage=storage, scheduler=scheduler, agents=[agent], continue_for=0.25)


celery, app = _build()


def _turn(job_id: str, k: int, turns: int) -> str:
    """One bare W1 turn: model answer + tool, in memory; then send turn ``k + 1`` (or count the job done)."""
    msg = w1.answer(k, turns)
    calls = msg.get("tool_calls") or []
    for c in calls:
        json.dumps(w1.add_impl(**json.loads(c["function"]["arguments"])))
    assert celery is not None
    if not calls:
        with celery.connection_for_write() as conn:
            conn.default_channel.client.incr(DONE_KEY)
        return "completed"
    send_turn(celery, os.environ.get("BENCH_QUEUE", "base"), job_id, k + 1, turns)
    return "advanced"


if celery is not None:
    celery.task(name=CHAIN_TASK, shared=False, acks_late=True)(_turn)


def send_turn(c: Celery, queue: str, job_id: str, k: int, turns: int) -> None:
    c.send_task(CHAIN_TASK, args=[job_id, k, turns], task_id=f"{job_id}-v{k}", queue=queue, serializer="json")


class Bench:
    """A private redis-server and the worker processes of one side, all killed at the end."""

    def __init__(self, tmp: Path) -> None:
        binary = find_redis_server()
        if binary is None:
            raise SystemExit("redis-server not found (apt-get install redis-server)")
        self.tmp, self.port = tmp, free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._spawn("redis", [binary, "--port", str(self.port), "--save", "", "--appendonly", "no"])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis.Redis.from_url(self.url)
        self.poll("redis-server", lambda: self._ping())

    def _ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
        log.close()
        self.procs.append(proc)
        return proc

    def workers(self, queue: str, turns: int, n: int = 2) -> list[subprocess.Popen[bytes]]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_REDIS_URL": self.url, "BENCH_QUEUE": queue,
               "BENCH_TURNS": str(turns)}
        return [self._spawn(f"{queue}-{i}", [sys.executable, "-m", "celery", "-A", "bench.celery_bench:celery",
                                             "worker", "-Q", queue, "-P", "solo", "-n", f"{queue}{i}@%h",
                                             "--without-gossip", "--without-mingle", "--without-heartbeat",
                                             "-l", "WARNING"], env) for i in range(n)]

    def poll(self, what: str, done: Callable[[], bool], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in self.tmp.glob("*.log"))
                raise SystemExit(f"timed out waiting for {what}\n{logs}")
            time.sleep(0.01)

    def stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            p.kill()
            p.wait(10)

    def close(self) -> None:
        self.stop([p for p in self.procs if p.poll() is None])
        self.client.close()


def ours(b: Bench, jobs: int, turns: int, runs: int) -> list[float]:
    os.environ.update(BENCH_REDIS_URL=b.url, BENCH_QUEUE="ours", BENCH_TURNS=str(turns))
    _, side = _build()
    assert side is not None
    procs, rates = b.workers("ours", turns), []
    agent = side.agents[w1_agent(turns).name]
    for r in range(runs + 1):  # run 0 warms the workers up and is not counted
        n = jobs if r else 4
        ids = [f"o{r}-{j}" for j in range(n)]
        t0 = time.perf_counter()
        for job_id in ids:
            agent.run(job_id=job_id, messages=[w1.USER], storage=side.storage,  # type: ignore[attr-defined]
                      scheduler=side.scheduler)
        b.poll(f"{n} W1 jobs", lambda: not side.storage.due_jobs(time.time() + 1e9, limit=1))
        if r:
            rates.append(n * turns / (time.perf_counter() - t0))
    b.stop(procs)
    return rates


def bare(b: Bench, jobs: int, turns: int, runs: int) -> list[float]:
    c = make_celery(b.url)
    procs, rates = b.workers("base", turns), []
    for r in range(runs + 1):
        n = jobs if r else 4
        b.client.delete(DONE_KEY)
        t0 = time.perf_counter()
        for j in range(n):
            send_turn(c, "base", f"b{r}-{j}", 0, turns)
        b.poll(f"{n} bare chains", lambda n=n: int(b.client.get(DONE_KEY) or 0) >= n)
        if r:
            rates.append(n * turns / (time.perf_counter() - t0))
    b.stop(procs)
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pr-celery-bench-") as tmp:
        b = Bench(Path(tmp))
        try:
            o, base = ours(b, args.jobs, args.turns, args.runs), bare(b, args.jobs, args.turns, args.runs)
        finally:
            b.close()
    mo, mb = statistics.median(o), statistics.median(base)
    ratio = mo / mb
    print(f"celery: W1 {args.jobs}x{args.turns} on 2 x celery worker (solo), median of {args.runs} runs")
    print(f"  C1  phaserunner on Redis + CeleryScheduler  {mo:10,.0f} turns/s")
    print(f"  C2  bare Celery task chaining               {mb:10,.0f} turns/s")
    print(f"  C3  phaserunner / bare Celery               {ratio:10.2f} x   target >= 1.0  "
          f"{'ok' if ratio >= 1.0 else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
