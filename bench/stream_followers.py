"""Figure 14: delta latency to an SSE client while many idle SSE clients follow other jobs (issue 31, item 1).

    python -m bench.stream_followers                     # 0 and 1,000 idle followers, 3 runs each (~1.5 min)
    python -m bench.stream_followers --followers 200 --runs 2 --turns 4

One private redis-server; one ``pipelines worker --simple`` (RQ) runs
``tests.apps.stream_app:app``, whose model is the loopback fake server
(tests/fake_openai.py) in this process, streaming W1 turns (about 200
characters of text and one ``add`` call, then "done") in chunks of 4
characters, ``--delay`` (20 ms) apart. One uvicorn process
(``python -m bench.stream_followers serve``) serves ``sse_response`` for
the same App. The bench opens ``--followers`` SSE streams (httpx, asyncio)
on jobs that stay running and never advance (their queue has no worker),
waits until each got its first event, then runs one job at a time and
follows it over SSE too.

- 14a/14b: delta latency p50 / p99 over every chunk: the fake server sends a
  chunk -> the SSE client has the ``text_delta`` holding its last character
  (it includes the worker's batching: first flush after 10 ms, then every 15 ms: phases.streaming);
- 14c: the worst first chunk of a turn (a stall at a turn's start shows here);
- 14d: the uvicorn process's threads with the followers connected;
- 14e: its CPU while the followers wait and nothing runs (percent of one core, over 3 s), measured
  once the burst of connecting them is over;
- 14f/14g: connecting the followers: until each got its first event, then until the server is at rest.

Every job is made and paused before the worker starts (its sweep would run a
running job): an idle follower's job stays paused, an active one is resumed
once its follower waits.

Rows are medians over ``--runs`` jobs (spread min-max). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.procs import Children  # noqa: E402

__all__ = ["follow_sse", "latencies", "main", "pct", "proc_stat", "row", "start_server"]

CHUNK = 4
IDLE_QUEUE = "bench-followers-idle"  # no worker listens: its jobs stay running and quiet
QUEUE = "bench-followers"


def serve(argv: list[str]) -> int:
    """The uvicorn process: ``sse_response`` (parts) for the stream App, on 127.0.0.1:PORT."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from pipelines.web import sse_response
    from tests.apps.stream_app import make_app

    p = argparse.ArgumentParser(prog="stream_followers serve")
    p.add_argument("--redis", required=True)
    p.add_argument("--fake", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    app = make_app(args.redis, args.fake, queue=QUEUE)

    async def stream(request: Request) -> Response:
        return sse_response(app, request.path_params["id"], request)

    asgi = Starlette(routes=[Route("/jobs/{id}/stream", stream)])
    uvicorn.run(asgi, host="127.0.0.1", port=args.port, log_level="warning", lifespan="off", backlog=4096)
    return 0


def _status(app: Any, job_id: str) -> str:
    return str(getattr(app.storage.get_job(job_id), "status", ""))


def proc_stat(pid: int) -> tuple[int, float]:
    """(threads, CPU seconds) of process ``pid``, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return threads, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def follow_sse(client: Any, url: str, seen: asyncio.Event, parts: list[Any] | None) -> None:
    """Read one SSE stream until it ends or is cancelled; ``parts`` gets (arrival, part) of every event."""
    async with client.stream("GET", url) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            seen.set()
            if parts is not None:
                part = json.loads(line[6:])
                parts.append((time.monotonic(), SimpleNamespace(type=part["type"], data=part.get("data") or {},
                                                                id=part.get("id"))))
                if part["type"] in ("job_finished", "job_failed"):
                    return


def latencies(sent: list[tuple[float, str]], received: list[tuple[float, Any]],
              gap: float) -> tuple[list[float], list[float]]:
    """(every chunk's latency, the latency of each turn's first chunk), in ms, matched by characters."""
    deliveries: list[tuple[int, float]] = []
    total = 0
    for at, part in received:
        if part.type == "text_delta":
            total += len(str(part.data.get("text", "")))
            deliveries.append((total, at))
    every: list[float] = []
    firsts: list[float] = []
    end, i, last_sent = 0, 0, -1e9
    for at, text in sent:
        end += len(text)
        while i < len(deliveries) and deliveries[i][0] < end:
            i += 1
        if i == len(deliveries):
            break
        every.append((deliveries[i][1] - at) * 1000)
        if at - last_sent > gap:  # a pause longer than a chunk's: the first chunk of a turn
            firsts.append(every[-1])
        last_sent = at
    return every, firsts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _measure(base: str, apps: tuple[Any, Any], fake: Any, followers: int, args: argparse.Namespace,
                   server_pid: int) -> dict[str, list[float]]:
    import httpx

    app = apps[0]
    out: dict[str, list[float]] = {"p50": [], "p99": [], "first": [], "threads": [], "cpu": [], "connect": [],
                                   "settle": []}
    limits = httpx.Limits(max_connections=followers + 10, max_keepalive_connections=followers + 10)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as client:
        seen = [asyncio.Event() for _ in range(followers)]
        idle = [asyncio.create_task(follow_sse(client, f"{base}/jobs/idle-{i}/stream", seen[i], None))
                for i in range(followers)]
        try:
            started = time.monotonic()
            for got in seen:
                await asyncio.wait_for(got.wait(), max(1.0, started + 180 - time.monotonic()))
            out["connect"].append(time.monotonic() - started)
            # Each new stream checks its job (a few status reads in the followers' thread): let the server finish
            # the burst of a thousand connections before measuring it at rest.
            settle = time.monotonic()
            while time.monotonic() - settle < 60:
                cpu0 = proc_stat(server_pid)[1]
                await asyncio.sleep(1.0)
                if proc_stat(server_pid)[1] - cpu0 < 0.05:
                    break
            out["settle"].append(time.monotonic() - settle)
            threads, cpu0 = proc_stat(server_pid)
            await asyncio.sleep(3.0)
            out["threads"].append(threads)
            out["cpu"].append((proc_stat(server_pid)[1] - cpu0) / 3.0 * 100)
            for run in range(args.runs):
                every, firsts = await _run(client, base, app, fake, f"active-{followers}-{run}", args)
                out["p50"].append(pct(every, 0.5))
                out["p99"].append(pct(every, 0.99))
                out["first"].append(max(firsts, default=float("nan")))
        except TimeoutError:
            out["stuck"] = [1.0]  # what was measured before stays; the rows say the rest did not happen
        finally:
            for task in idle:
                task.cancel()
            await asyncio.gather(*idle, return_exceptions=True)
    return out


async def _run(client: Any, base: str, app: Any, fake: Any, job: str,
               args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """One active job, followed over SSE from before it starts: (every chunk's latency, each turn's first)."""
    parts: list[Any] = []
    started = asyncio.Event()
    active = asyncio.create_task(follow_sse(client, f"{base}/jobs/{job}/stream", started, parts))
    try:
        await asyncio.wait_for(started.wait(), 60)
        await asyncio.sleep(0.2)
        fake.sent_text.clear()
        await asyncio.to_thread(app.resume, job)  # paused until its follower waits (see main)
        await asyncio.wait_for(asyncio.shield(active), 120)
    finally:
        active.cancel()
    return latencies(list(fake.sent_text), parts, gap=3 * args.delay)


def row(key: str, label: str, values: list[float], unit: str, fmt: str = "{:.1f}") -> str:
    if not values:
        return f"  {key:4} {label:58} {'-':>8}"
    mid = statistics.median(values)
    spread = f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else ""
    return f"  {key:4} {label:58} {fmt.format(mid):>8} {unit}{spread}"


def start_server(kids: Children, name: str, url: str, fake_url: str) -> tuple[Any, str]:
    """Start the uvicorn process (``serve``) on a free port: (its process, base URL), once it answers."""
    import httpx

    from tests.redis_server import free_port

    port = free_port()
    server = kids.python(name, ["-m", "bench.stream_followers", "serve", "--redis", url, "--fake", fake_url,
                                "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{base}/jobs/none/stream", timeout=1)
            return server, base
        except httpx.TransportError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"the SSE server did not start\n{kids.logs()}") from None
            time.sleep(0.1)


def _one(kids: Children, url: str, fake: Any, apps: tuple[Any, Any], followers: int,
         args: argparse.Namespace) -> dict[str, Any]:
    server, base = start_server(kids, f"sse-{followers}", url, fake.url)
    try:
        return asyncio.run(_measure(base, apps, fake, followers, args, server.pid))
    finally:
        kids.stop(server)


def main(argv: list[str] | None = None) -> int:
    """Print figure 14 (figures only, nothing asserted); ``serve`` runs the uvicorn process."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--followers", type=int, default=1000, help="idle SSE followers (a row with 0 comes first)")
    p.add_argument("--runs", type=int, default=3, help="jobs followed per row (median)")
    p.add_argument("--turns", type=int, default=4, help="W1 turns a job (the last answers 'done')")
    p.add_argument("--delay", type=float, default=0.02, help="seconds between the model's chunks")
    args = p.parse_args(argv)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.followers + 1024)), hard))

    from tests.apps.stream_app import make_app
    from tests.fake_openai import running, streamed, w1_reply

    kids = Children()
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        url = kids.redis()
        with running() as fake:
            fake.script(lambda body: streamed(w1_reply(body), chunk_chars=CHUNK, chunk_delay=args.delay))
            app = make_app(url, fake.url, queue=QUEUE)
            idle_app = make_app(url, fake.url, queue=IDLE_QUEUE)
            # Every job is made and paused before the worker starts: its sweep would run a running one. An idle
            # follower's job stays paused; an active one is resumed once its follower waits.
            rows_of = sorted({0, args.followers})
            names = [f"idle-{i}" for i in range(args.followers)]
            names += [f"active-{n}-{run}" for n in rows_of for run in range(args.runs)]
            for name in names:
                idle_app.run_agent("streamer", job_id=name, messages=[f"turns={args.turns}"])
                idle_app.pause(name)
            worker = kids.python("worker", ["-m", "pipelines", "worker", "--app", "tests.apps.stream_app:app",
                                            "--simple", "--name", "followers-bench", "--log-level", "WARNING"],
                                 REDIS_URL=url, FAKE_OPENAI_BASE=fake.url, PIPELINES_QUEUE=QUEUE)
            app.run_agent("streamer", job_id="warmup", messages=["turns=2"])  # litellm's first stream in the worker
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and _status(app, "warmup") == "running":
                time.sleep(0.1)
            for followers in rows_of:
                rows.append((followers, _one(kids, url, fake, (app, idle_app), followers, args)))
            kids.stop(worker)
    finally:
        kids.cleanup()
    print(f"figure 14: one uvicorn process, SSE (parts); chunks of {CHUNK} chars {args.delay * 1000:g} ms apart, "
          f"W1 turns={args.turns}; median of {args.runs} jobs")
    for followers, out in rows:
        print(f" with {followers:,} idle SSE followers:")
        if out.get("stuck"):
            print("  (a stream did not start within its time: 180 s to connect the followers, 60 s for an active "
                  "job's first event, 120 s for its end; the rows hold what was measured before)")
        print(row("14a", "delta latency p50 (chunk sent -> SSE client)", out["p50"], "ms"))
        print(row("14b", "delta latency p99", out["p99"], "ms"))
        print(row("14c", "worst first chunk of a turn", out["first"], "ms"))
        print(row("14d", "uvicorn process threads, followers connected", out["threads"], "", "{:.0f}"))
        print(row("14e", "uvicorn CPU while the followers wait (% of a core)", out["cpu"], "%"))
        if followers:
            print(row("14f", "connecting them: all first events in", out["connect"], "s"))
            print(row("14g", "then until the server is at rest (< 5% CPU over 1 s)", out["settle"], "s"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
