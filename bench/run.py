"""``make bench``: workload W1 through phaserunner, next to its floors, as one table of ratios.

    python bench/run.py            # the full run (~5 min on 2 cores)
    python bench/run.py --quick    # a CI-sized version (< 60 s)
    python bench/run.py --smoke    # every figure's code once, smallest sizes (what `make test` runs)
    python bench/run.py --only 1,4 # some figures only

Every figure is the median of ``--runs`` (>= 3) runs with its spread
(min-max); ratios pair run i with run i. Nothing here asserts a time: a
missed target is printed as ``MISS``. What each figure measures is in
bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Before anything can import litellm: no price-list download, no phoning home.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import w1  # noqa: E402
from bench.procs import Children, find_redis_server, redis_version  # noqa: E402

TITLE = "phaserunner bench results"
COLUMNS = ("#", "figure", "median", "min-max", "unit", "target", "")


# --- results -------------------------------------------------------------------
@dataclass
class Row:
    key: str
    name: str
    values: list[float]
    unit: str
    target: str = ""
    ok: Callable[[float], bool] | None = None  # judged on the median
    fmt: str = "{:,.0f}"

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def cells(self) -> tuple[str, ...]:
        f = self.fmt.format
        spread = f"{f(min(self.values))} .. {f(max(self.values))}" if len(self.values) > 1 else "-"
        verdict = "" if self.ok is None else ("ok" if self.ok(self.median) else "MISS")
        return (self.key, self.name, f(self.median), spread, self.unit, self.target, verdict)


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *args: Any, **kwargs: Any) -> Row:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        return row

    def ratio(self, key: str, name: str, num: list[float], den: list[float], target: str = "",
              ok: Callable[[float], bool] | None = None) -> Row:
        """num[i] / den[i] for each run i (run i of both sides is paired)."""
        values = [a / b for a, b in zip(num, den, strict=False) if b]
        return self.add(key, name, values or [float("nan")], "x", target, ok, "{:.2f}")

    def table(self) -> str:
        cells = [COLUMNS, *(r.cells() for r in self.rows)]
        widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
        right = {2, 3}

        def line(c: tuple[str, ...]) -> str:
            parts = [c[i].rjust(widths[i]) if i in right else c[i].ljust(widths[i]) for i in range(len(c))]
            return "| " + " | ".join(parts) + " |"

        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        out = [line(cells[0]), sep, *(line(c) for c in cells[1:])]
        return "\n".join(out)

    def show(self, heading: str) -> None:
        """The run's heading line, the machine, the table and the notes, as every bench prints them."""
        print(f"\n{heading}")
        print(f"machine: {machine()}")
        print(self.table())
        for note in self.notes:
            print(f"note: {note}")


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextmanager
def timed() -> Iterator[list[float]]:
    box: list[float] = []
    gc.collect()
    t0 = time.perf_counter()
    yield box
    box.append(time.perf_counter() - t0)


# --- sizes ---------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    runs: int
    mem_jobs: int
    mem_turns: int
    llm_jobs: int
    rq_jobs: int
    rq_turns: int
    rq_workers: tuple[str, ...]
    rq_fork_jobs: int
    long_turns: int
    rss_jobs: tuple[int, int, int]
    imports: int


FULL = Sizes(runs=3, mem_jobs=200, mem_turns=10, llm_jobs=200, rq_jobs=200, rq_turns=10,
             rq_workers=("simple", "fork"), rq_fork_jobs=50, long_turns=200, rss_jobs=(10, 500, 1000), imports=5)
QUICK = Sizes(runs=3, mem_jobs=20, mem_turns=10, llm_jobs=5, rq_jobs=20, rq_turns=5,
              rq_workers=("simple",), rq_fork_jobs=10, long_turns=40, rss_jobs=(10, 50, 100), imports=5)
SMOKE = Sizes(runs=1, mem_jobs=4, mem_turns=10, llm_jobs=2, rq_jobs=4, rq_turns=3,
              rq_workers=("simple",), rq_fork_jobs=2, long_turns=21, rss_jobs=(5, 10, 20), imports=1)
"""Every figure's code once, at the smallest size that still runs it (what `make test` runs; figures meaningless)."""


# --- figure 1: memory adapters vs the plain-Python floor -----------------------
def check_transcript(messages: list[dict[str, Any]], turns: int) -> None:
    """A finished W1 job: (the pinned system prompt,) user, then (assistant + tool) x (n_turns-1), then "done"."""
    if messages and messages[0].get("role") == "system":
        messages = messages[1:]
    if len(messages) != 2 * turns or messages[-1].get("content") != "done":
        raise AssertionError(f"unexpected W1 transcript: {len(messages)} messages, last {messages[-1]!r:.120}")
    if json.loads(messages[-2]["content"]) != {"sum": turns - 1}:
        raise AssertionError(f"unexpected last tool result {messages[-2]!r:.120}")


def memory_run(jobs: int, turns: int, agent: Any, tag: str) -> float:
    from adapters.memory import MemoryScheduler, MemoryStorage

    storage, scheduler = MemoryStorage(), MemoryScheduler()
    with timed() as t:
        for j in range(jobs):
            agent.run(job_id=f"{tag}-{j}", messages=[w1.USER], storage=storage, scheduler=scheduler)
        scheduler.drain()
    for j in (0, jobs - 1):
        rec = storage.get_job(f"{tag}-{j}")
        assert rec is not None and rec.status.value == "complete", rec
        check_transcript(storage.messages(f"{tag}-{j}"), turns)
    return t[0]


def floor_run(jobs: int, turns: int, model: Any = None) -> float:
    with timed() as t:
        for _ in range(jobs):
            out = w1.floor_job(turns, model)
    check_transcript(out, turns)
    return t[0]


def fig1(rep: Report, sz: Sizes) -> None:
    from bench.apps import w1_agent

    n_jobs, n_turns = sz.mem_jobs, sz.mem_turns
    say(f"figure 1: memory adapters, {n_jobs} jobs x {n_turns} turns, {sz.runs} runs")
    memory_run(5, n_turns, w1_agent(n_turns), "warm")
    floor_run(5, n_turns)
    ours, floor = [], []
    for r in range(sz.runs):
        floor.append(n_jobs * n_turns / floor_run(n_jobs, n_turns))
        ours.append(n_jobs * n_turns / memory_run(n_jobs, n_turns, w1_agent(n_turns), f"r{r}"))
    rep.add("1a", f"memory adapters + ScriptedModel ({n_jobs}x{n_turns})", ours, "turns/s", ">= 10,000",
            lambda v: v >= 10_000)
    rep.add("1b", "plain-Python floor, same loop", floor, "turns/s")
    rep.add("1c", "per-turn cost, memory adapters", [1e6 / v for v in ours], "us/turn", fmt="{:,.1f}")
    rep.ratio("1d", "floor / memory adapters", floor, ours, "<= 25", lambda v: v <= 25)  # issue 33


# --- figure 2: the litellm mock path -------------------------------------------
class W1LiteLLM:
    """W1 through ``LiteLLMModel``: each request gets the turn's answer as ``mock_response``."""

    def __init__(self, turns: int) -> None:
        from phases.litellm_model import LiteLLMModel

        self.turns = turns
        self.inner = LiteLLMModel("openai/x", params={})

    def complete(self, request: Any) -> Any:
        k = w1.turn_of(request.messages)
        return self.inner.complete(replace(request, params={**request.params,
                                                            "mock_response": w1.mock_response(k, self.turns)}))


def fig2(rep: Report, sz: Sizes) -> None:
    from bench.apps import w1_agent
    from phases.model import ModelRequest

    n_jobs, n_turns = sz.llm_jobs, sz.mem_turns
    say(f"figure 2: litellm mock_response, {n_jobs} jobs x {n_turns} turns, {sz.runs} runs (importing litellm)")
    model = W1LiteLLM(n_turns)
    from phases.litellm_model import _litellm

    litellm = _litellm()
    schemas = [w1.add.schema()]

    def client_only(messages: list[dict[str, Any]]) -> dict[str, Any]:
        request = ModelRequest(messages=messages, tools=schemas, turn=w1.turn_of(messages))
        return dict(model.complete(request).message)

    def raw_litellm(messages: list[dict[str, Any]]) -> dict[str, Any]:
        k = w1.turn_of(messages)
        resp = litellm.completion(model="openai/x", messages=messages, tools=schemas, max_retries=0,
                                  mock_response=w1.mock_response(k, n_turns))
        return resp.choices[0].message.model_dump(exclude_none=True)

    memory_run(2, n_turns, w1_agent(n_turns, model), "warm")
    floor_run(2, n_turns, client_only)
    floor_run(2, n_turns, raw_litellm)
    ours, client, raw = [], [], []
    for r in range(sz.runs):
        raw.append(n_jobs * n_turns / floor_run(n_jobs, n_turns, raw_litellm))
        client.append(n_jobs * n_turns / floor_run(n_jobs, n_turns, client_only))
        ours.append(n_jobs * n_turns / memory_run(n_jobs, n_turns, w1_agent(n_turns, model), f"l{r}"))
    rep.add("2a", f"memory adapters + LiteLLMModel mock ({n_jobs}x{n_turns})", ours, "turns/s")
    rep.add("2b", "LiteLLMModel.complete alone (floor loop)", client, "turns/s")
    rep.add("2c", "litellm.completion alone (floor loop)", raw, "turns/s")
    rep.add("2d", "per-turn, memory adapters + LiteLLMModel", [1e3 / v for v in ours], "ms/turn", fmt="{:.3f}")
    rep.add("2e", "per-turn, LiteLLMModel.complete alone", [1e3 / v for v in client], "ms/turn", fmt="{:.3f}")
    rep.add("2f", "per-turn, litellm.completion alone", [1e3 / v for v in raw], "ms/turn", fmt="{:.3f}")
    rep.add("2g", "model client share of a turn (2e / 2d)", [o / c for o, c in zip(ours, client, strict=True)],
            "x", fmt="{:.2f}")


# --- figure 3: RQ workers on a real redis-server vs bare RQ chaining -----------
def _wait_workers(conn: Any, queue: str, n: int, kids: Children, timeout: float = 60) -> None:
    from rq import Queue, Worker
    from rq.serializers import JSONSerializer

    q = Queue(queue, connection=conn, serializer=JSONSerializer)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(Worker.all(queue=q)) >= n:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{n} workers on {queue!r} did not register within {timeout:.0f}s\n{kids.logs()}")


def _poll(what: str, done: Callable[[], bool], kids: Children, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}\n{kids.logs()}")
        time.sleep(0.01)


def rq_jobs(sz: Sizes, worker: str) -> int:
    return sz.rq_jobs if worker == "simple" else sz.rq_fork_jobs


#: Redis server CPU (us) per turn of each figure-3 run, by (side, worker, jobs x turns): for capacity planning.
SERVER_CPU: dict[tuple[str, str, str], list[float]] = {}
SERVER_READS: dict[tuple[str, str, str], list[float]] = {}  # read events a turn, the same way


def _server_cpu(conn: Any) -> float:
    """The Redis server's CPU time so far (seconds, user + sys): the queue's and the storage's work alike."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _server_reads(conn: Any) -> int:
    """Read events the Redis server has processed: about one per request a client sends (a pipeline is one)."""
    return int(conn.info("stats")["total_reads_processed"])


def ours_rq(url: str, kids: Children, sz: Sizes, worker: str, shape: tuple[int, int] | None = None) -> list[float]:
    from bench import apps
    from pipelines import JobStatus

    n_jobs, n_turns = shape or (rq_jobs(sz, worker), sz.rq_turns)
    queue = f"ours-{worker}-{n_jobs}x{n_turns}"
    app = apps.build(url, queue=queue, turns=n_turns)
    agent = app.agents[apps.PIPELINE]
    conn = app.storage.client  # type: ignore[attr-defined]
    due_key = app.storage.due_key  # type: ignore[attr-defined]
    env = {"BENCH_REDIS_URL": url, "BENCH_QUEUE": queue, "BENCH_TURNS": str(n_turns)}
    procs = [kids.python(f"{queue}-{i}", ["-m", "pipelines", "worker", "--app", apps.APP_PATH, "--name",
                                          f"{queue}-{i}", "--log-level", "WARNING",
                                          *(["--simple"] if worker == "simple" else [])], **env)
             for i in range(2)]
    rates = []
    try:
        _wait_workers(conn, queue, 2, kids)
        for r in range(sz.runs + 1):  # run 0 warms the workers up and is not counted
            jobs = n_jobs if r else 4
            ids = [f"{worker}{r}-{j}" for j in range(jobs)]
            cpu, reads = _server_cpu(conn), _server_reads(conn)
            with timed() as t:
                for job_id in ids:
                    agent.run(job_id=job_id, messages=[w1.USER], storage=app.storage,  # type: ignore[attr-defined]
                              scheduler=app.scheduler)
                _poll(f"{jobs} W1 jobs on {worker} workers", lambda: conn.zcard(due_key) == 0, kids)
            if r:
                SERVER_CPU.setdefault(("ours", worker, f"{n_jobs}x{n_turns}"), []).append(
                    (_server_cpu(conn) - cpu) * 1e6 / (jobs * n_turns))
                SERVER_READS.setdefault(("ours", worker, f"{n_jobs}x{n_turns}"), []).append(
                    (_server_reads(conn) - reads) / (jobs * n_turns))
            for job_id in ids:
                rec = app.storage.get_job(job_id)
                if rec is None or rec.status is not JobStatus.COMPLETE:
                    raise RuntimeError(f"job {job_id} ended {rec and rec.status}: {rec and rec.error}\n{kids.logs()}")
            check_transcript(app.storage.messages(ids[-1]), n_turns)
            if r:
                rates.append(jobs * n_turns / t[0])
    finally:
        for p in procs:
            kids.stop(p)
    swept = sum(log.read_text(errors="replace").count("sweep: re-enqueued")
                for log in kids.dir.glob(f"{queue}-*.log"))
    if swept:
        kids.notes.append(f"{worker} workers: the sweep re-enqueued overdue jobs {swept} time(s) during figure 3")
    return rates


def baseline_rq(url: str, kids: Children, sz: Sizes, worker: str,
                shape: tuple[int, int] | None = None) -> list[float]:
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    from bench import baseline_rq as base

    n_jobs, n_turns = shape or (rq_jobs(sz, worker), sz.rq_turns)
    queue = f"base-{worker}-{n_jobs}x{n_turns}"
    conn = redis.Redis.from_url(url)
    q = Queue(queue, connection=conn, serializer=JSONSerializer)
    procs = [kids.python(f"{queue}-{i}", ["-m", "bench.baseline_rq", "--url", url, "--queue", queue,
                                          "--name", f"{queue}-{i}",
                                          *(["--simple"] if worker == "simple" else [])])
             for i in range(2)]
    rates = []
    try:
        _wait_workers(conn, queue, 2, kids)
        for r in range(sz.runs + 1):
            jobs = n_jobs if r else 4
            conn.delete(base.DONE_KEY)
            cpu, reads = _server_cpu(conn), _server_reads(conn)
            with timed() as t:
                for j in range(jobs):
                    base.enqueue(q, f"b{worker}{r}-{j}", 0, n_turns)
                _poll(f"{jobs} baseline jobs on {worker} workers",
                      lambda jobs=jobs: int(conn.get(base.DONE_KEY) or 0) >= jobs, kids)
            if r:
                SERVER_CPU.setdefault(("bare", worker, f"{n_jobs}x{n_turns}"), []).append(
                    (_server_cpu(conn) - cpu) * 1e6 / (jobs * n_turns))
                SERVER_READS.setdefault(("bare", worker, f"{n_jobs}x{n_turns}"), []).append(
                    (_server_reads(conn) - reads) / (jobs * n_turns))
            if r:
                rates.append(jobs * n_turns / t[0])
    finally:
        for p in procs:
            kids.stop(p)
        conn.close()
    return rates


def fig3(rep: Report, sz: Sizes, url: str, kids: Children) -> None:
    n_turns = sz.rq_turns
    for worker in sz.rq_workers:
        n_jobs = rq_jobs(sz, worker)
        cls = "SimpleWorker" if worker == "simple" else "Worker (fork)"
        say(f"figure 3: 2 RQ {cls} processes, {n_jobs} jobs x {n_turns} turns, {sz.runs} runs each side")
        ours = ours_rq(url, kids, sz, worker)
        base = baseline_rq(url, kids, sz, worker)
        k = "3" + ("a" if worker == "simple" else "d")
        nxt = chr(ord(k[1]) + 1)
        rep.add(k, f"phaserunner on Redis, 2 x {cls} ({n_jobs}x{n_turns})", ours, "turns/s")
        rep.add("3" + nxt, f"bare RQ chaining, 2 x {cls}", base, "turns/s")
        rep.ratio("3" + chr(ord(nxt) + 1), f"phaserunner / bare RQ ({cls})", ours, base, ">= 0.8",
                  lambda v: v >= 0.8)  # issue 33 (issue 16 asked 1.0)
        if worker == "simple":
            shape = f"{n_jobs}x{n_turns}"
            rep.add("3j", "Redis server CPU per turn, phaserunner (storage + its RQ queue)",
                    SERVER_CPU[("ours", worker, shape)], "us/turn", fmt="{:,.0f}")
            rep.add("3k", "Redis server CPU per turn, bare RQ chaining", SERVER_CPU[("bare", worker, shape)],
                    "us/turn", fmt="{:,.0f}")
            rep.ratio("3l", "Redis server CPU per turn, phaserunner / bare RQ (3j / 3k)",
                      SERVER_CPU[("ours", worker, shape)], SERVER_CPU[("bare", worker, shape)], "<= 1.3",
                      lambda v: v <= 1.3)  # issue 33
            # Requests, not commands: each costs the server a read, a parse and a reply, whatever it holds.
            # The bench's own polling (one read every 10 ms) is in both.
            rep.add("3m", "Redis read events per turn (~ requests sent), phaserunner",
                    SERVER_READS[("ours", worker, shape)], "reads/turn", fmt="{:.1f}")
            rep.add("3n", "Redis read events per turn, bare RQ chaining", SERVER_READS[("bare", worker, shape)],
                    "reads/turn", fmt="{:.1f}")
    # With a backlog (above: 200 jobs on 2 workers) continue_for hands each job back after every
    # turn, because other work waits (issue 15: a new conversation never waits behind a busy
    # one), so every turn goes through the queue. With no backlog (a job per worker) it keeps
    # the lease and runs the next turn at once: what continue_for is worth when workers are free.
    shape = (2, sz.rq_turns * 5)
    say(f"figure 3: 2 RQ SimpleWorker processes, no backlog: {shape[0]} jobs x {shape[1]} turns, {sz.runs} runs each")
    ours = ours_rq(url, kids, sz, "simple", shape)
    base = baseline_rq(url, kids, sz, "simple", shape)
    rep.add("3g", f"phaserunner on Redis, 2 x SimpleWorker, no backlog ({shape[0]}x{shape[1]})", ours, "turns/s")
    rep.add("3h", "bare RQ chaining, 2 x SimpleWorker, no backlog", base, "turns/s")
    rep.ratio("3i", "phaserunner / bare RQ, no backlog (continue_for at work)", ours, base, ">= 3.0",
              lambda v: v >= 3.0)


# --- figure 4: one long job on Redis: bytes written, late vs early turns -------
class NoopScheduler:
    """Real clock, schedules nothing: the bench advances the job itself."""

    precision = 0.0

    def __init__(self) -> None:
        self.scheduled = 0

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        self.scheduled += 1

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        self.scheduled += 1

    def now(self) -> float:
        return time.time()


class ByteCounter:
    """Sees every command a storage sends (``tests.redis_spy.spy_commands``) and sorts the bytes of its arguments.

    The ARGV layouts come from :mod:`adapters.redis.scripts` (its ``*_ARGS`` constants), so the
    breakdown follows the scripts instead of going stale when they gain an argument.
    """

    def __init__(self, storage: Any) -> None:
        from tests.redis_spy import spy_commands

        self.by: dict[str, int] = {}
        s = storage.scripts
        names = {s.commit.sha: "commit", s.step.sha: "step", s.create.sha: "create", s.load.sha: "load",
                 s.release.sha: "release", s.renew.sha: "renew", s.publish.sha: "publish", s.send.sha: "send",
                 s.control.sha: "control", s.dropped.sha: "dropped", s.delete.sha: "delete",
                 # The turn's three by FCALL where the server has functions (adapters.redis.library).
                 s.commit.name: "commit", s.step.name: "step", s.load.name: "load"}
        self._names = names

        def counting(send: Any, *args: Any) -> Any:
            self._count(args)
            return send(*args)

        # Through the client, the thread's kept connection and the deferred write's (tests/redis_spy.py).
        spy_commands(storage, counting)

    def _add(self, what: str, n: int) -> None:
        self.by[what] = self.by.get(what, 0) + n

    def _count(self, args: tuple[Any, ...]) -> None:
        from adapters import redis_scripts

        def size(a: Any) -> int:
            return len(a) if isinstance(a, bytes) else len(str(a).encode())

        cmd = str(args[0]).upper()
        if cmd not in ("EVALSHA", "FCALL"):
            self._add(f"{cmd.lower()} commands", sum(map(size, args)))
            return
        script = self._names.get(str(args[1]), "script")
        nkeys = int(args[2])
        argv = list(args[3 + nkeys:])
        # The command name, the script's SHA (or function's name) and its key count, and the key names.
        self._add("script names and SHAs", sum(map(size, args[:3])))
        self._add("key names", sum(map(size, args[3:3 + nkeys])))
        if script in ("commit", "create"):
            layout = redis_scripts.COMMIT_ARGS if script == "commit" else redis_scripts.CREATE_ARGS
            fixed = layout.fixed
            n, nl = int(argv[layout.n_messages]), int(argv[layout.n_logs])
            msgs, logs, events = argv[fixed:fixed + n], argv[fixed + n:fixed + n + nl], argv[fixed + n + nl:]
            self._add("record (state) JSON", size(argv[layout.data]))
            self._add("transcript messages (a journaled one as a reference)", sum(map(size, msgs)))
            self._add("log entries", sum(map(size, logs)))
            self._add("events (durable log)", sum(map(size, events)))
            # COMMIT's record mode (adapters.redis.record_format), status place and archive flag close its fixed
            # arguments.
            end = layout.record_mode if layout.record_mode >= 0 else fixed
            self._add("record: turn history (base, dropped, new marks)", sum(map(size, argv[layout.history:end])))
            self._add("record: format mode, status place, archive flag", sum(map(size, argv[end:fixed])))
            rest = [a for i, a in enumerate(argv[:layout.history]) if i != layout.data]
            self._add(f"{script}: ids, tokens, versions, flags", sum(map(size, rest)))
        elif script == "step":
            # ARGV: version, has_owner, owner, key, value, then the live-stream parts sent with it.
            self._add("journal (model + tool steps)", size(argv[4]))
            self._add("step: versions, owner, step keys", sum(map(size, argv[:4])))
            self._add("live-stream parts (with the journal write)", sum(map(size, argv[5:])))
        elif script == "publish":
            self._add("live-stream parts (publish)", sum(map(size, argv[1:])))
            self._add("publish: tokens", size(argv[0]))
        else:
            self._add(f"{script}: arguments", sum(map(size, argv)))


def advance_to_end(app: Any, job_id: str) -> list[float]:
    """Advance ``job_id`` in-process, a turn at a time, until it completes: the seconds each turn took."""
    from pipelines import AdvanceResult

    times = []
    while True:
        t0 = time.perf_counter()
        result = app.try_advance(job_id)
        times.append(time.perf_counter() - t0)
        if result is AdvanceResult.COMPLETED:
            return times
        if result is not AdvanceResult.ADVANCED:
            raise RuntimeError(f"turn {len(times)} of {job_id}: {result}")


def long_job(url: str, turns: int, tag: str, count_bytes: bool) -> dict[str, Any]:
    import redis

    from adapters.redis import RedisStorage
    from bench.apps import w1_agent
    from pipelines.app import App

    storage = RedisStorage.from_url(url, prefix=f"long{tag}")
    from pipelines.testing import ScriptedModel

    scheduler = NoopScheduler()
    model = ScriptedModel(w1.reply_fn(turns))
    agent = w1_agent(turns, model)
    app = App(storage=storage, scheduler=scheduler, agents=[agent])
    info = redis.Redis.from_url(url)
    counter = ByteCounter(storage) if count_bytes else None
    job_id = f"long-{tag}"
    stats = info.info("stats")
    before, out_before = int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])
    agent.run(job_id=job_id, messages=[w1.USER], storage=storage, scheduler=scheduler)
    times = advance_to_end(app, job_id)
    stats = info.info("stats")
    after, out_after = int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"])
    raw = info.lrange(storage.keys(job_id).messages, 0, -1)
    check_transcript([json.loads(m) for m in raw], turns)
    info.close()
    return {"times": times, "net_in": after - before, "net_out": out_after - out_before,
            "transcript": sum(map(len, raw)),
            "model": model_cost(model, [json.loads(m) for m in raw], turns),
            "by": counter.by if counter else {}}


def model_cost(model: Any, transcript: list[dict[str, Any]], turns: int) -> list[float]:
    """What the workload's own model (ScriptedModel + the W1 turn counter) costs at each turn, alone.

    Both walk the whole history (the scripted model's usage estimate, W1's count of assistant
    messages), so part of a late turn's extra time is the workload's, not the library's.
    """
    from phases.model import ModelRequest

    prefix = [{"role": "system", "content": w1.SYSTEM}]
    out = []
    for k in range(turns):
        request = ModelRequest(messages=prefix + transcript[: 2 * k + 1], tools=[w1.add.schema()], turn=k)
        samples = []
        for _ in range(7):
            t0 = time.perf_counter()
            model.complete(request)
            samples.append(time.perf_counter() - t0)
        out.append(statistics.median(samples))
    return out


#: What 4j's tool answers each turn: about 2 KB, as a fetched page or a file would be.
PAGE = "A fetched page, about two kilobytes of text a turn. " * 40


def long_tool_job(url: str, turns: int, tag: str) -> dict[str, int]:
    """A W1-shaped job whose tool answers ~2 KB a turn, advanced in-process: bytes sent, transcript bytes."""
    import redis

    from adapters.redis import RedisStorage
    from pipelines import Agent, tool
    from pipelines.app import App
    from pipelines.testing import ScriptedModel, call, reply

    @tool
    def fetch(n: int) -> str:
        """Fetch page ``n``."""
        return f"page {n}: {PAGE}"

    def answer(msgs: list[dict[str, Any]]) -> Any:
        done = sum(1 for m in msgs if m["role"] == "assistant")
        return "done" if done >= turns - 1 else reply(f"Fetching page {done} next.", call("fetch", n=done))

    storage = RedisStorage.from_url(url, prefix=f"tool{tag}")
    scheduler = NoopScheduler()
    agent = Agent(name="fetcher", model=ScriptedModel(answer), tools=[fetch], max_turns=turns + 1)
    app = App(storage=storage, scheduler=scheduler, agents=[agent])
    info = redis.Redis.from_url(url)
    before = int(info.info("stats")["total_net_input_bytes"])
    agent.run(job_id="long-tool", messages=["fetch them all"], storage=storage, scheduler=scheduler)
    advance_to_end(app, "long-tool")
    after = int(info.info("stats")["total_net_input_bytes"])
    transcript = sum(map(len, info.lrange(storage.keys("long-tool").messages, 0, -1)))
    info.close()
    storage.client.close()
    return {"net_in": after - before, "transcript": transcript}


def fig4(rep: Report, sz: Sizes, url: str) -> None:
    import redis

    n_turns = sz.long_turns
    say(f"figure 4: one job of {n_turns} turns on Redis, advanced in-process, {max(5, sz.runs)} runs")
    c = redis.Redis.from_url(url)
    s0 = int(c.info("stats")["total_net_input_bytes"])
    s1 = int(c.info("stats")["total_net_input_bytes"])
    info_cost = s1 - s0  # one INFO command's own bytes
    c.close()
    long_job(url, 20, "warm", False)
    runs = [long_job(url, n_turns, str(r), r == 0) for r in range(max(5, sz.runs))]
    ratio = [(r["net_in"] - info_cost) / r["transcript"] for r in runs]
    # 1-based turns 1-10 and the last ten tool-call turns (n_turns=200: 190-199; the last turn answers
    # "done"). Each window's figure is its median turn, so one GC pause or scheduler hiccup does not decide it.
    early = [statistics.median(r["times"][0:10]) for r in runs]
    late = [statistics.median(r["times"][n_turns - 11:n_turns - 1]) for r in runs]
    rep.add("4a", f"bytes sent to Redis / transcript bytes ({n_turns} turns)", ratio, "x", "<= 5",
            lambda v: v <= 5, "{:.2f}")  # issue 33 (issue 16 asked 2.5)
    # The other way: what Redis sends back (each load's record among it). Counted, no goal.
    rep.add("4a2", f"bytes received from Redis / transcript bytes ({n_turns} turns)",
            [r["net_out"] / r["transcript"] for r in runs], "x", fmt="{:.2f}")
    # A tool's long answer is journaled, then in the tool message: sent once (adapters.redis.refs). No goal.
    tools = [long_tool_job(url, 50, str(r)) for r in range(3)]
    rep.add("4j", "bytes sent to Redis / transcript bytes, a ~2 KB tool answer a turn (50 turns)",
            [(t["net_in"] - info_cost) / t["transcript"] for t in tools], "x", fmt="{:.2f}")
    rep.add("4b", "transcript size (stored message JSON)", [r["transcript"] / 1024 for r in runs], "KiB", fmt="{:,.1f}")
    rep.add("4c", "bytes sent to Redis (INFO total_net_input_bytes)", [r["net_in"] / 1024 for r in runs], "KiB",
            fmt="{:,.1f}")
    by = runs[0]["by"]
    for i, (what, n) in enumerate(sorted(by.items(), key=lambda kv: -kv[1])):
        rep.add(f"4c{i + 1}", f"  of which {what}", [n / n_turns], "B/turn", fmt="{:,.0f}")
    rep.add("4d", "turns 1-10, median time per turn", [e * 1e3 for e in early], "ms", fmt="{:.3f}")
    last = f"turns {n_turns - 10}-{n_turns - 1}"
    rep.add("4e", f"{last}, median time per turn", [v * 1e3 for v in late], "ms", fmt="{:.3f}")
    rep.ratio("4f", f"{last} / turns 1-10", late, early, "<= 1.1", lambda v: v <= 1.1)
    if all(r["model"] for r in runs):
        m_early = [statistics.median(r["model"][0:10]) for r in runs]
        m_late = [statistics.median(r["model"][n_turns - 11:n_turns - 1]) for r in runs]
        rep.add("4g", "  of which the scripted model alone, turns 1-10", [v * 1e3 for v in m_early], "ms",
                fmt="{:.3f}")
        rep.add("4h", f"  of which the scripted model alone, {last}", [v * 1e3 for v in m_late], "ms", fmt="{:.3f}")
        rep.ratio("4i", f"{last} / turns 1-10 without the scripted model",
                  [a - b for a, b in zip(late, m_late, strict=True)],
                  [a - b for a, b in zip(early, m_early, strict=True)], "<= 1.1", lambda v: v <= 1.1)


# --- figure 5: memory and import ------------------------------------------------
def _sub(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def fig5(rep: Report, sz: Sizes) -> None:
    lo, mid, hi = sz.rss_jobs
    say(f"figure 5: peak RSS after {lo} and {hi} jobs, import time x{sz.imports}")
    runs = [_sub(["-m", "bench.memproc", "rss", "--checkpoints", f"{lo},{mid},{hi}"]) for _ in range(sz.runs)]
    kept = [_sub(["-m", "bench.memproc", "rss", "--checkpoints", f"{lo},{hi}", "--keep"]) for _ in range(sz.runs)]
    def mib(run: dict[str, Any], at: int, what: str = "VmHWM") -> float:
        return float(run[str(at)][what])

    rep.add("5a", f"worker peak RSS after {lo} jobs (memory adapters)", [mib(r, lo) for r in runs], "MiB",
            fmt="{:.1f}")
    rep.add("5b", f"worker peak RSS after {hi} jobs (jobs deleted when done)", [mib(r, hi) for r in runs], "MiB",
            fmt="{:.1f}")
    rep.add("5c", f"peak RSS growth {lo} -> {hi} jobs (jobs deleted when done)",
            [mib(r, hi) - mib(r, lo) for r in runs], "MiB", fmt="{:.1f}")
    rep.add("5d", f"current RSS growth {lo} -> {hi} jobs (jobs deleted when done)",
            [mib(r, hi, "VmRSS") - mib(r, lo, "VmRSS") for r in runs], "MiB", fmt="{:.1f}")
    rep.add("5d2", f"current RSS growth {mid} -> {hi} jobs (jobs deleted when done)",
            [mib(r, hi, "VmRSS") - mib(r, mid, "VmRSS") for r in runs], "MiB", fmt="{:.1f}")
    rep.add("5e", f"peak RSS growth {lo} -> {hi} jobs (jobs kept in MemoryStorage)",
            [mib(r, hi) - mib(r, lo) for r in kept], "MiB", fmt="{:.1f}")
    imports = [_sub(["-m", "bench.memproc", "import"]) for _ in range(sz.imports)]
    rep.add("5f", "`import pipelines` (fresh process)", [i["seconds"] * 1e3 for i in imports], "ms", fmt="{:.0f}")
    pulled = [name for name in ("litellm", "redis", "rq") if any(i[name] for i in imports)]
    rep.add("5g", f"`import pipelines` pulls in litellm? ({'yes' if 'litellm' in pulled else 'no'})",
            [float("litellm" in pulled)], "bool", "no", lambda v: v == 0, "{:.0f}")
    rep.notes.append(f"import pipelines also imported: {', '.join(pulled) or 'none of litellm/redis/rq'}")


# --- main ------------------------------------------------------------------------
def machine() -> str:
    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except OSError:
            return "?"

    mem = run("free", "-h").splitlines()
    binary = find_redis_server()
    return (f"nproc {run('nproc')}; {mem[1].split()[1] if len(mem) > 1 else '?'} RAM; Python {sys.version.split()[0]}; "
            f"redis-server {redis_version(binary) if binary else 'missing'}; {time.strftime('%Y-%m-%d %H:%M %Z')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI-sized version (< 60 s)")
    p.add_argument("--smoke", action="store_true", help="every figure's code once, smallest sizes (make test)")
    p.add_argument("--only", default="1,2,3,4,5,6", help="comma-separated figures to run (default: all)")
    p.add_argument("--runs", type=int, default=None, help="runs per figure (>= 3; default 3)")
    args = p.parse_args(argv)
    sz = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.runs is not None:
        sz = replace(sz, runs=max(3, args.runs))
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    rep = Report()
    started = time.perf_counter()
    if "1" in only:
        fig1(rep, sz)
    if "2" in only:
        fig2(rep, sz)
    if only & {"3", "4", "6"}:
        if find_redis_server() is None:
            rep.notes.append("figures 3, 4 and 6 skipped: redis-server not found (apt-get install redis-server)")
        else:
            kids = Children()
            try:
                url = kids.redis()
                if "3" in only:
                    fig3(rep, sz, url, kids)
                if "4" in only:
                    fig4(rep, sz, url)
                if "6" in only:
                    from bench.stream_bench import fig6

                    fig6(rep, sz.runs, url, kids)
            finally:
                rep.notes.extend(kids.notes)
                kids.cleanup()
    if "5" in only:
        fig5(rep, sz)
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    rep.show(f"{TITLE} ({mode}; W1; median of >= {sz.runs} runs, spread min-max; "
              f"{time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
