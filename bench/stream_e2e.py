"""Figure 18: N concurrent active streams end to end, through one worker process and one uvicorn process (issue 31).

    python -m bench.stream_e2e                           # 5, 10, 25, 50 and 100 streams, 2 runs each (~2 min)
    python -m bench.stream_e2e --streams 10 50 --runs 1

Issue 31's target: "100 concurrent active streams on one worker and one web process: delta latency p50 <= 5 ms,
p99 <= 20 ms (chunk sent by the model -> received by the SSE client, 20 ms between chunks); no stall at a turn's
start". Figure 14 follows one active job; figure 17 is the floor of N streamed calls in one process, without
storage or SSE. This is the whole path for N jobs at once.

The configuration, and why. An RQ worker runs one job at a time (``pipelines worker``), so N streams at once on
RQ are N worker processes. What runs many turns at once in one process is
:class:`~adapters.local.LocalScheduler` (worker threads of the process that owns it). On SQLite, its usual
storage, a follower in another process looks at the file every 50 ms (adapters/sqlite/wakeup.py): an SSE server
in a process of its own could not show a delta within 5 ms. So the storage is Redis, whose live stream is pushed
to the SSE server (``XREAD BLOCK``) as in figure 14, and the worker process runs
``tests.apps.stream_app.make_app(..., workers=N)``: LocalScheduler(workers=N) on RedisStorage (one process for
every row, N the largest row's: an idle thread waits on a condition and costs nothing). On Redis that
scheduler has no storage claims (only an SQLite file has them): it runs what its own process schedules, and a
run started by another process only once the App's sweep finds it overdue (10 s or more). So this process makes
the jobs and pauses them, and the worker process resumes each one (``app.resume``: a free thread runs it at
once) when this process names it on a Redis list, as an app embedding the scheduler starts its own runs.

The processes: a private redis-server; the model, tests/fake_openai.py in a process of its own (``fake``; its CPU
is not this process's), streaming W1 turns (~200 characters and one ``add`` call, then "done") in chunks of 4
characters ``--delay`` (20 ms) apart and noting when it sent each chunk, per job; the worker (``work``: litellm,
the turn's delta sink, RedisStorage); the web process, figure 14's uvicorn process serving ``sse_response``
(parts); this process, one SSE client per job (httpx, asyncio) connected before its job resumes. The N resumes
are spread over ``--spread`` seconds (1 s, about one turn), so turns start and end spread out as on a worker
serving many conversations; 18d says how many streamed at once.

- 18a/18b: delta latency p50 / p99 over every chunk of every job: the model server sent it -> the job's SSE
  client has the ``text_delta`` holding its last character (one clock: ``time.monotonic`` is the machine's);
- 18c: the worst first chunk of a turn (a stall at a turn's start shows here);
- 18d: model streams open at once, at the peak (a job's first chunk to its last);
- 18e/18f: the web side alone, p50 / p99 over every ``text_delta``: published (the time in its Redis entry
  id, whole milliseconds, counted from their middle) -> the SSE client has it (what 18a has on top of it is the
  worker's side: model socket -> Redis);
- 18g-18k: CPU of each process over the run (first resume -> last job finished), percent of one core;
- 18l/18m: the worker's CPU per model turn, uvicorn's per SSE event (all each did over the run, divided);
- 18n-18p: how long threads of the worker, uvicorn and this process were runnable but waiting for a core
  (``/proc/PID/task/*/schedstat``), percent of the run: the machine's cores, not the code, held them up.

Rows are medians over ``--runs`` runs (min-max). Nothing is asserted; the targets are printed beside 18a/18b.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.procs import Children  # noqa: E402
from bench.stream_followers import CHUNK, follow_sse, latencies, pct, proc_stat, row, start_server  # noqa: E402

__all__ = ["main"]

PARKED = "bench-e2e-parked"  # this process's RQ queue: no worker listens (its jobs are paused at once)
CONTROL = "bench-e2e:resume"  # job ids for the worker process to resume; STOP ends it
READY = "bench-e2e:ready"
STOP = "-stop-"
_JOB = re.compile(r"job=(\S+)")


def work(argv: list[str]) -> int:
    """The worker process: the stream App on LocalScheduler(workers=N), resuming the jobs named on CONTROL."""
    import redis

    from tests.apps.stream_app import AGENT_NAME, make_app

    p = argparse.ArgumentParser(prog="stream_e2e work")
    p.add_argument("--redis", required=True)
    p.add_argument("--fake", required=True)
    p.add_argument("--workers", type=int, required=True)
    args = p.parse_args(argv)
    app = make_app(args.redis, args.fake, workers=args.workers)
    client = redis.Redis.from_url(args.redis)
    with app.scheduler:  # start() ... stop()
        # litellm's first stream (imports, clients) before anything is measured
        app.run_agent(AGENT_NAME, job_id="warmup", messages=["turns=2 job=warmup"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and str(getattr(app.storage.get_job("warmup"), "status", "")) == "running":
            time.sleep(0.05)
        client.set(READY, str(os.getpid()))
        while True:
            item = client.blpop([CONTROL], timeout=1)  # short: redis-py's socket timeout (5 s) ends longer waits
            if item is None:
                continue
            if (job := item[1].decode()) == STOP:
                break
            app.resume(job)
    return 0


def fake(argv: list[str]) -> int:
    """The model server process: prints ``READY <url>``; each ``dump`` line on stdin is answered with one JSON
    line, ``{job: [[sent, text], ...]}``, the chunks sent since the last dump."""
    from http.server import ThreadingHTTPServer

    from tests.fake_openai import FakeOpenAI, Reply, streamed, w1_reply

    # The listen backlog: up to N model connections open within a second (the default, 5, drops SYNs: 1 s stalls)
    ThreadingHTTPServer.request_queue_size = 1024

    p = argparse.ArgumentParser(prog="stream_e2e fake")
    p.add_argument("--delay", type=float, required=True)
    delay = p.parse_args(argv).delay

    class PerJob(FakeOpenAI):
        """Notes each streamed chunk under its job (``job=NAME`` in the first user message).

        A request is answered and then streamed by one handler thread: the responder notes the thread's job.
        """

        def __init__(self) -> None:
            super().__init__()
            self.sent_by: dict[str, list[tuple[float, str]]] = defaultdict(list)
            self.job_of: dict[int, str] = {}

        def answer(self, body: dict[str, Any]) -> Reply:
            first = next((m for m in body.get("messages") or [] if m.get("role") == "user"), {})
            found = _JOB.search(str(first.get("content") or ""))
            self.job_of[threading.get_ident()] = found.group(1) if found else ""
            return streamed(w1_reply(body), chunk_chars=CHUNK, chunk_delay=delay)

        def _sent(self, chunk: dict[str, Any]) -> None:
            text = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if text:
                now = time.monotonic()
                with self._lock:
                    self.sent_by[self.job_of.get(threading.get_ident(), "")].append((now, text))

    server = PerJob()
    server.script(server.answer)
    server.start()
    print(f"READY {server.url}", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "dump":
                with server._lock:
                    sent, server.sent_by = server.sent_by, defaultdict(list)
                print(json.dumps(sent), flush=True)
    finally:
        server.stop()
    return 0


class _Model:
    """The ``fake`` child process, driven over its stdin/stdout."""

    def __init__(self, delay: float) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.stream_e2e", "fake", "--delay", str(delay)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.close()
            raise RuntimeError(f"the model server did not start: {line!r}")
        self.url = line.split()[1]

    def dump(self) -> dict[str, list[tuple[float, str]]]:
        """The chunks sent since the last dump, by job."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        return {job: [(at, text) for at, text in sent] for job, sent in json.loads(self.proc.stdout.readline()).items()}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # EOF: the child stops its server and exits
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def _names(n: int, run: int) -> list[str]:
    """The jobs of the row of ``n`` streams in run ``run``."""
    return [f"e2e-{n}-{run}-{i}" for i in range(n)]


def _peak(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one time."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _web_side(received: list[tuple[float, Any]]) -> list[float]:
    """For every ``text_delta``: its Redis entry's time (ms, whole: counted from the middle) -> arrival, in ms."""
    offset = time.time() - time.monotonic()  # one machine: both clocks are every process's
    return [(at - (int(str(part.id).split("-")[0]) + 0.5) / 1000 + offset) * 1000
            for at, part in received if part.type == "text_delta" and part.id]


def _waited(pid: int) -> float:
    """Seconds the threads of process ``pid`` have spent runnable but waiting for a CPU (the run queue), so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each child process so far, of this one (the SSE clients), and run-queue waits (``wait_*``)."""
    return {**{name: proc_stat(pid)[1] for name, pid in pids.items()}, "clients": time.process_time(),
            **{f"wait_{name}": _waited(pid) for name, pid in pids.items()}, "wait_clients": _waited(os.getpid())}


async def _run(client: Any, base: str, model: _Model, control: Any, pids: dict[str, int], names: list[str],
               args: argparse.Namespace) -> dict[str, float]:
    """N jobs resumed ``--spread`` apart, each followed over SSE from before it starts: one row's figures."""
    parts: dict[str, list[Any]] = {name: [] for name in names}
    seen = {name: asyncio.Event() for name in names}
    tasks = [asyncio.create_task(follow_sse(client, f"{base}/jobs/{name}/stream", seen[name], parts[name]))
             for name in names]
    try:
        await asyncio.wait_for(asyncio.gather(*(got.wait() for got in seen.values())), 60)
        await asyncio.sleep(0.2)
        model.dump()  # forget what earlier rows sent
        cpu, started = _cpu(pids), time.monotonic()
        for i, name in enumerate(names):
            await asyncio.sleep(max(0.0, started + i * args.spread / len(names) - time.monotonic()))
            control.rpush(CONTROL, name)  # well under a millisecond: not worth a thread
        await asyncio.wait(tasks, timeout=120)  # a job not finished by then is counted (stuck), not waited for
        wall = time.monotonic() - started
        used = {name: seconds - cpu[name] for name, seconds in _cpu(pids).items()}
    finally:
        stuck = sum(not task.done() for task in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    sent = model.dump()
    every: list[float] = []
    firsts: list[float] = []
    missing = 0
    for name in names:
        mine, first = latencies(sent.get(name, []), parts[name], gap=3 * args.delay)
        every += mine
        firsts += first
        missing += len(sent.get(name, [])) - len(mine)
    web = _web_side([p for name in names for p in parts[name]])
    events = sum(len(parts[name]) for name in names)
    out = {"p50": pct(every, 0.5), "p99": pct(every, 0.99), "first": max(firsts, default=float("nan")),
           "peak": float(_peak([(s[0][0], s[-1][0]) for s in sent.values() if s])),
           "missing": float(missing), "stuck": float(stuck), "web50": pct(web, 0.5), "web99": pct(web, 0.99),
           "turn_ms": used["worker"] / (len(names) * args.turns) * 1e3, "event_us": used["uvicorn"] / events * 1e6}
    out.update({f"cpu_{name}": seconds / wall * 100 for name, seconds in used.items()})  # wait_*: run queue
    return out


async def _measure(base: str, model: _Model, control: Any, pids: dict[str, int],
                   args: argparse.Namespace) -> dict[int, list[dict[str, float]]]:
    import httpx

    most = max(args.streams)
    limits = httpx.Limits(max_connections=most + 10, max_keepalive_connections=most + 10)
    results: dict[int, list[dict[str, float]]] = {n: [] for n in args.streams}
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        for run in range(args.runs):  # the sizes in turn, run after run: a slow minute of the machine hits all
            for n in args.streams:
                results[n].append(await _run(client, base, model, control, pids, _names(n, run), args))
    return results


def _report(results: dict[int, list[dict[str, float]]], args: argparse.Namespace) -> None:
    def verdict(target: float, values: list[float]) -> str:
        return f"   target <= {target:g} ms: {'ok' if values and statistics.median(values) <= target else 'MISS'}"

    print(f"figure 18: N jobs streaming at once, one worker process (LocalScheduler(workers={max(args.streams)}) on "
          f"Redis) and one uvicorn process (SSE, parts); chunks of {CHUNK} chars {args.delay * 1000:g} ms apart, "
          f"W1 turns={args.turns}, resumes spread over {args.spread:g} s; median of {args.runs} runs (min-max)")
    for n, runs in results.items():
        def values(key: str, runs: list[dict[str, float]] = runs) -> list[float]:
            return [r[key] for r in runs]

        print(f" {n} concurrent active streams:")
        if any(values("stuck")):
            print(f"  ({sum(values('stuck')):.0f} job(s) not finished 120 s after the first resume: left out)")
        if any(values("missing")):
            print(f"  ({sum(values('missing')):.0f} chunk(s) never reached an SSE client)")
        print(row("18a", "delta latency p50 (chunk sent -> SSE client)", values("p50"), "ms")
              + verdict(5, values("p50")))
        print(row("18b", "delta latency p99", values("p99"), "ms") + verdict(20, values("p99")))
        print(row("18c", "worst first chunk of a turn", values("first"), "ms"))
        print(row("18d", "model streams open at once, peak", values("peak"), "", "{:.0f}"))
        print(row("18e", "web side p50 (published in Redis -> SSE client)", values("web50"), "ms"))
        print(row("18f", "web side p99", values("web99"), "ms"))
        for key, label in (("18g", "worker"), ("18h", "uvicorn"), ("18i", "redis"), ("18j", "model"),
                           ("18k", "clients")):
            what = {"model": "model server (fake)", "clients": "SSE clients (this process)"}.get(label, label)
            print(row(key, f"CPU, {what} (% of a core)", values(f"cpu_{label}"), "%"))
        print(row("18l", "worker CPU per model turn", values("turn_ms"), "ms"))
        print(row("18m", "uvicorn CPU per SSE event sent", values("event_us"), "us", "{:.0f}"))
        for key, label in (("18n", "worker"), ("18o", "uvicorn"), ("18p", "clients")):
            print(row(key, f"{label}: threads waiting for a CPU (run queue, % of the run)", values(f"cpu_wait_{label}"),
                      "%"))
    print(f" load average (1 min) before / after: {args.load[0]:.1f} / {args.load[1]:.1f} ({os.cpu_count()} cores)")


def main(argv: list[str] | None = None) -> int:
    """Print figure 18 (figures only, nothing asserted); ``work`` and ``fake`` run its child processes."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["work"]:
        return work(argv[1:])
    if argv[:1] == ["fake"]:
        return fake(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, nargs="+", default=[5, 10, 25, 50, 100], help="jobs streaming at once")
    p.add_argument("--runs", type=int, default=2, help="runs of every size (median)")
    p.add_argument("--turns", type=int, default=4, help="W1 turns a job (the last answers 'done')")
    p.add_argument("--delay", type=float, default=0.02, help="seconds between the model's chunks")
    p.add_argument("--spread", type=float, default=1.0, help="seconds over which a row's jobs are resumed")
    args = p.parse_args(argv)
    import redis

    from tests.apps.stream_app import AGENT_NAME, make_app

    kids = Children()
    model = _Model(args.delay)
    try:
        url = kids.redis()
        # The worker starts first (litellm's import and first stream take seconds); meanwhile the jobs are made
        # and paused (its scheduler never runs a job another process started: see the module docstring).
        worker = kids.python("worker", ["-m", "bench.stream_e2e", "work", "--redis", url, "--fake", model.url,
                                        "--workers", str(max(args.streams))])
        app = make_app(url, model.url, queue=PARKED)
        for run in range(args.runs):
            for n in args.streams:
                for name in _names(n, run):
                    app.run_agent(AGENT_NAME, job_id=name, messages=[f"turns={args.turns} job={name}"])
                    app.pause(name)
        server, base = start_server(kids, "sse", url, model.url)
        control = redis.Redis.from_url(url)
        deadline = time.monotonic() + 120
        while not control.exists(READY):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"the worker did not get ready\n{kids.logs()}")
            time.sleep(0.1)
        pids = {"worker": worker.pid, "uvicorn": server.pid, "model": model.proc.pid,
                "redis": next(proc.pid for name, proc in kids.procs if name == "redis")}
        load = os.getloadavg()[0]
        results = asyncio.run(_measure(base, model, control, pids, args))
        args.load = (load, os.getloadavg()[0])
        control.rpush(CONTROL, STOP)
    finally:
        kids.cleanup()
        model.close()
    _report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
