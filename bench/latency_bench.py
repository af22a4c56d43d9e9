"""Figures 12 and 13 (issue 16): turn-to-turn latency on idle workers; late/early turns with a cold cache.

    python -m bench.latency_bench                    # both figures (~1-1.5 min on 2 cores)
    python -m bench.latency_bench --quick            # a smoke-sized run (< 30 s)
    python -m bench.latency_bench --only 12 --workers simple,fork --jobs 10 --turns 30 --runs 3
    python -m bench.latency_bench --only 13 --long-turns 200 --long-runs 5 --window 20

**Figure 12, turn-to-turn latency on idle workers.** One private redis-server;
per worker class (``pipelines worker --simple``, and the forking one) three
idle worker processes, one per side, each on its own queue: phaserunner with
``continue_for`` on (``--continue-for``, 0.5 s as examples/production), phaserunner
with ``continue_for=0`` (every turn through the queue), and bare RQ chaining
(:func:`bare_turn`, run by ``bench.baseline_rq``'s worker: same class, JSON
serializer, RQ scheduler on). W1 jobs (bench/w1.py: scripted model, no model
latency) of ``--turns`` turns run one at a time (the next is started once the
last finished), so the worker is idle but for that job; the sides are
interleaved run by run. phaserunner's latency comes from the job's durable
events: for each turn k >= 2, the timestamp of its ``turn_started`` minus
that of turn k-1's last event (``turn_committed``). Bare RQ's hop is
symmetric: the time a chained job's work is done (answer and tool computed,
just before it enqueues its successor) to the successor's function starting;
each job passes its stamp on in the successor's arguments, so nothing extra
is written to Redis in the chain. Per run: p50 and p99 over every hop of
the run's jobs; the rows are the median over runs (spread min-max), the
ratios pair run i with run i. Goals: ``continue_for`` p50 <= 0.5 ms (issue 16);
through the queue p50 <= 1.2x bare RQ's hop with SimpleWorker, <= 1.5x forking
(issue 33; issue 16 asked 1.0x of both).

**Figure 13, late/early turn time with a cold cache.** One W1 job of
``--long-turns`` turns whose consecutive turns run in two different
processes: two server processes (``python -m bench.latency_bench serve``),
each with its own ``App``, agent object and ``RedisStorage`` on the same
prefix (no-op scheduler, ``continue_for=0``), take ``App.try_advance`` calls
in strict alternation from the bench over a pipe; each times its own call
(``perf_counter``). Each process holds the transcript up to its own last
turn, so every turn reads from Redis the messages the other process added
(the servers count ``storage.messages`` calls and the messages they read). The figure
is the median turn of the last ``--window`` tool-call turns over the median
of the first ``--window`` (the final turn, which answers "done" and finishes
the job, is left out, as in figure 4). The same job run wholly in one
process (cache hits) is measured beside it, run by run. Goal <= 1.1x.

Nothing is asserted: a missed goal is printed ``MISS``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import w1  # noqa: E402
from bench.baseline_rq import RQ_OPTIONS  # noqa: E402
from bench.run import NoopScheduler, Report, check_transcript, say  # noqa: E402  (sets litellm env)

TITLE = "phaserunner latency figures (issue 16)"
BARE_FUNC = "bench.latency_bench.bare_turn"
BARE_KEY = "bench:latency:bare:{}"  # a finished bare chain's hops (JSON list of seconds)
POLL_S = 0.01
JOB_TIMEOUT_S = 120.0
CLASSES = {"simple": "SimpleWorker", "fork": "Worker (fork)"}
# Issue 33's goals for a turn through the queue over bare RQ's hop, p50 (issue 16 asked 1.0x of both).
HOP_GOALS = {"SimpleWorker": 1.2, "Worker (fork)": 1.5}


@dataclass(frozen=True)
class Sizes:
    workers: tuple[str, ...]
    jobs: int  # figure 12 jobs per side per run, SimpleWorker
    fork_jobs: int  # the same, forking Worker (a fork per turn: ~3x slower)
    turns: int  # figure 12 turns per job
    runs: int  # figure 12 runs (interleaved sides)
    continue_for: float
    long_turns: int  # figure 13
    long_runs: int
    window: int


FULL = Sizes(workers=("simple", "fork"), jobs=10, fork_jobs=6, turns=30, runs=3, continue_for=0.5, long_turns=200,
             long_runs=7, window=20)
QUICK = Sizes(workers=("simple", "fork"), jobs=3, fork_jobs=3, turns=15, runs=3, continue_for=0.5, long_turns=60,
              long_runs=3, window=10)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated between the closest ranks."""
    s = sorted(values)
    if not s:
        return float("nan")
    at = q * (len(s) - 1)
    lo = int(at)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (at - lo)


# --- the bare RQ chain (run by bench.baseline_rq's worker) ------------------------
def bare_turn(job_id: str, k: int, turns: int, prev_done: float | None = None,
              hops: list[float] | None = None) -> str:
    """One W1 turn as a bare RQ job; enqueues turn ``k + 1`` carrying when this one's work was done.

    ``hops``: the chain's hops so far (successor start - predecessor done); the
    last turn stores them under :data:`BARE_KEY`.
    """
    started = time.time()
    from rq import Queue
    from rq.job import get_current_job
    from rq.serializers import JSONSerializer

    hops = list(hops or [])
    if prev_done is not None:
        hops.append(started - prev_done)
    msg = w1.answer(k, turns)
    for c in msg.get("tool_calls") or []:
        w1.add_impl(**json.loads(c["function"]["arguments"]))
    job = get_current_job()
    assert job is not None
    done = time.time()
    if not msg.get("tool_calls"):
        job.connection.set(BARE_KEY.format(job_id), json.dumps(hops), ex=3600)
        return "completed"
    Queue(job.origin, connection=job.connection, serializer=JSONSerializer).enqueue(
        BARE_FUNC, args=[job_id, k + 1, turns, done, hops], job_id=f"{job_id}-v{k + 1}",
        description=f"turn {job_id} v{k + 1}", **RQ_OPTIONS)
    return "advanced"


def bare_worker(argv: list[str]) -> int:
    """``bench.baseline_rq``'s worker, with this module imported first (a forking worker's horses inherit it)."""
    import bench.latency_bench  # noqa: F401  (run as __main__, this file is not yet that module)
    from bench import baseline_rq

    return baseline_rq.main(argv)


# --- figure 12: turn-to-turn latency ----------------------------------------------
def event_hops(events: list[Any]) -> list[float]:
    """For each turn k >= 2: ``turn_started`` of k minus the last event of turn k-1 (seconds)."""
    last: dict[int, float] = {}
    hops = []
    for e in events:
        if e.turn is None:
            continue
        if e.type == "turn_started" and e.turn >= 2 and e.turn - 1 in last:
            hops.append(e.timestamp - last[e.turn - 1])
        last[e.turn] = e.timestamp
    return hops


def _wait(what: str, done: Any, kids: Any, timeout: float = JOB_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        out = done()
        if out:
            return out
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}\n{kids.logs()}")
        time.sleep(POLL_S)


class Ours:
    """One ``pipelines worker`` on ``bench.apps:app`` with its own queue and ``continue_for``."""

    def __init__(self, url: str, kids: Any, worker: str, side: str, continue_for: float, turns: int) -> None:
        from bench import apps

        self.kids, self.worker, self.side, self.turns = kids, worker, side, turns
        self.queue = f"lat-{worker}-{side}"
        self.app = apps.build(url, queue=self.queue, turns=turns, continue_for=continue_for)
        env = {"BENCH_REDIS_URL": url, "BENCH_QUEUE": self.queue, "BENCH_TURNS": str(turns),
               "BENCH_CONTINUE": str(continue_for)}
        self.proc = kids.python(self.queue, ["-m", "pipelines", "worker", "--app", apps.APP_PATH, "--name", self.queue,
                                             "--log-level", "WARNING", *(["--simple"] if worker == "simple" else [])],
                                **env)
        self.ids: list[str] = []  # measured jobs, for :meth:`messages_per_job`

    def job(self, job_id: str) -> list[float]:
        from pipelines import JobStatus

        storage = self.app.storage
        self.ids.append(job_id)
        self.app.run_agent("w1", job_id=job_id, messages=[w1.USER])
        rec = _wait(f"job {job_id} on {self.queue}",
                    lambda: (r := storage.get_job(job_id)) is not None and r.status is not JobStatus.RUNNING and r,
                    self.kids)
        if rec.status is not JobStatus.COMPLETE:
            raise RuntimeError(f"job {job_id} ended {rec.status}: {rec.error}\n{self.kids.logs()}")
        check_transcript(storage.messages(job_id), self.turns)
        return event_hops(storage.events(job_id, limit=100_000))

    def messages_per_job(self) -> list[int]:
        """RQ messages run for each measured job (continue_for: 1 = every later turn ran under it)."""
        from rq import Queue
        from rq.registry import FinishedJobRegistry
        from rq.serializers import JSONSerializer

        registry = FinishedJobRegistry(queue=Queue(self.queue, connection=self.app.storage.client,
                                                   serializer=JSONSerializer))
        ran = registry.get_job_ids()
        return [sum(1 for i in ran if f"_n{job_id}-v" in i or f"_n{job_id}-x" in i) for job_id in self.ids]


class Bare:
    """One bare RQ worker (``bench.baseline_rq``'s, same class) chaining :func:`bare_turn`."""

    def __init__(self, url: str, kids: Any, worker: str, turns: int) -> None:
        import redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        self.kids, self.turns = kids, turns
        self.queue = f"lat-{worker}-bare"
        self.conn = redis.Redis.from_url(url)
        self.q = Queue(self.queue, connection=self.conn, serializer=JSONSerializer)
        self.proc = kids.python(self.queue, ["-m", "bench.latency_bench", "bare-worker", "--url", url, "--queue",
                                             self.queue, "--name", self.queue,
                                             *(["--simple"] if worker == "simple" else [])])

    def job(self, job_id: str) -> list[float]:
        key = BARE_KEY.format(job_id)
        self.conn.delete(key)
        self.q.enqueue(BARE_FUNC, args=[job_id, 0, self.turns, None, []], job_id=f"{job_id}-v0",
                       description=f"turn {job_id} v0", **RQ_OPTIONS)
        raw = _wait(f"bare chain {job_id}", lambda: self.conn.get(key), self.kids)
        hops: list[float] = json.loads(raw)
        if len(hops) != self.turns - 1:
            raise RuntimeError(f"bare chain {job_id}: {len(hops)} hops for {self.turns} turns")
        return hops


def fig12(rep: Report, url: str, kids: Any, sz: Sizes) -> None:
    from bench.run import _wait_workers

    letters = iter("abcdefghijklmnopqrstuvwxyz")
    for worker in sz.workers:
        cls = CLASSES[worker]
        jobs = sz.jobs if worker == "simple" else sz.fork_jobs
        say(f"figure 12: {cls}: 3 idle workers (continue_for={sz.continue_for:g}, continue_for=0, bare RQ), "
            f"{sz.runs} runs x {jobs} jobs x {sz.turns} turns per side, one job at a time")
        sides: dict[str, Any] = {
            "cont": Ours(url, kids, worker, "cont", sz.continue_for, sz.turns),
            "queue": Ours(url, kids, worker, "queue", 0.0, sz.turns),
            "bare": Bare(url, kids, worker, sz.turns),
        }
        p50: dict[str, list[float]] = {s: [] for s in sides}
        p99: dict[str, list[float]] = {s: [] for s in sides}
        count: dict[str, int] = dict.fromkeys(sides, 0)
        try:
            for side in sides.values():
                _wait_workers(kids_conn(url), side.queue, 1, kids)
            for name, side in sides.items():  # warm-up: imports, scripts loaded, first fork paid
                for j in range(2):
                    side.job(f"{worker}-{name}-warm-{j}")
            sides["cont"].ids.clear()
            for r in range(sz.runs):
                for name, side in sides.items():  # interleaved, so a busy moment hits every side alike
                    hops = [h for j in range(jobs) for h in side.job(f"{worker}-{name}-{r}-{j}")]
                    count[name] += len(hops)
                    p50[name].append(pct(hops, 0.50) * 1e3)
                    p99[name].append(pct(hops, 0.99) * 1e3)
        finally:
            for side in sides.values():
                kids.stop(side.proc)
            sides["bare"].conn.close()
        msgs = sides["cont"].messages_per_job()  # after the workers stopped: RQ's bookkeeping is done
        cf = f"continue_for={sz.continue_for:g}"

        def key() -> str:
            return f"12{next(letters)}"

        rep.add(key(), f"{cls}: {cf}, last event -> next turn_started, p50", p50["cont"], "ms", "<= 0.5",
                lambda v: v <= 0.5, "{:.2f}")
        rep.add(key(), f"{cls}: {cf}, p99", p99["cont"], "ms", fmt="{:.2f}")
        rep.add(key(), f"{cls}: through the queue (continue_for=0), p50", p50["queue"], "ms", fmt="{:.2f}")
        rep.add(key(), f"{cls}: through the queue, p99", p99["queue"], "ms", fmt="{:.2f}")
        rep.add(key(), f"{cls}: bare RQ hop (work done -> next job starts), p50", p50["bare"], "ms", fmt="{:.2f}")
        rep.add(key(), f"{cls}: bare RQ hop, p99", p99["bare"], "ms", fmt="{:.2f}")
        goal = HOP_GOALS[cls]
        rep.ratio(key(), f"{cls}: through the queue / bare RQ hop, p50", p50["queue"], p50["bare"], f"<= {goal}",
                  lambda v, goal=goal: v <= goal)
        rep.ratio(key(), f"{cls}: through the queue / bare RQ hop, p99", p99["queue"], p99["bare"])
        rep.ratio(key(), f"{cls}: {cf} / bare RQ hop, p50", p50["cont"], p50["bare"])
        rep.ratio(key(), f"{cls}: (through the queue - {cf}) / bare RQ hop, p50",
                  [q - c for q, c in zip(p50["queue"], p50["cont"], strict=True)], p50["bare"])
        rep.notes.append(f"figure 12, {cls}: hops measured per side {count['cont']} / {count['queue']} / "
                         f"{count['bare']} ({cf} / queue / bare); RQ messages run per {cf} job: "
                         f"{min(msgs)}..{max(msgs)} (1 = every later turn ran under continue_for)")
    swept = sum(log.read_text(errors="replace").count("sweep: re-enqueued") for log in kids.dir.glob("lat-*.log"))
    if swept:
        rep.notes.append(f"figure 12: the workers' sweep re-enqueued overdue jobs {swept} time(s)")


_conns: dict[str, Any] = {}


def kids_conn(url: str) -> Any:
    import redis

    if url not in _conns:
        _conns[url] = redis.Redis.from_url(url)
    return _conns[url]


# --- figure 13: late/early turns, cold cache --------------------------------------
def serve(argv: list[str]) -> int:
    """A turn server: JSON commands on stdin (create / advance / check / quit), one JSON reply line each."""
    p = argparse.ArgumentParser(prog="latency_bench serve")
    p.add_argument("--url", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--turns", type=int, required=True)
    args = p.parse_args(argv)
    from adapters.redis import RedisStorage
    from bench.apps import PIPELINE, w1_agent
    from pipelines import App

    storage = RedisStorage.from_url(args.url, prefix=args.prefix)
    app = App(storage=storage, scheduler=NoopScheduler(), agents=[w1_agent(args.turns)])  # its own agent and cache
    reads: dict[str, float] = {"reads": 0, "read_messages": 0, "read_s": 0.0}
    inner = storage.messages

    def counted(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        reads["read_s"] += time.perf_counter() - t0
        reads["reads"] += 1
        reads["read_messages"] += len(out)
        return out

    storage.messages = counted  # type: ignore[method-assign]
    out = sys.stdout

    def reply(**kw: Any) -> None:
        out.write(json.dumps(kw) + "\n")
        out.flush()

    reply(ready=os.getpid())
    for line in sys.stdin:
        cmd = json.loads(line)
        op, job_id = cmd["op"], cmd.get("job", "")
        if op == "quit":
            break
        if op == "create":
            app.run_agent(PIPELINE, job_id=job_id, messages=[w1.USER])
            reply(ok=True)
        elif op == "advance":
            reads.update(reads=0, read_messages=0, read_s=0.0)
            t0 = time.perf_counter()
            result = app.try_advance(job_id)
            dt = time.perf_counter() - t0
            reply(result=result.value, dt=dt, **reads)
        elif op == "check":
            check_transcript(inner(job_id), args.turns)
            reply(ok=True)
    storage.client.close()
    return 0


class Server:
    """A ``serve`` child process in its own session (killed by pid with the bench's other children)."""

    def __init__(self, kids: Any, name: str, url: str, prefix: str, turns: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("PIPELINES_APP", None)
        log = open(kids.dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until it exits
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.latency_bench", "serve", "--url", url, "--prefix",
                                      prefix, "--turns", str(turns)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        log.close()
        kids.procs.append((name, self.proc))
        self.kids, self.name = kids, name
        self.ask_raw()  # its "ready" line

    def ask_raw(self, **cmd: Any) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        if cmd:
            stdin.write((json.dumps(cmd) + "\n").encode())
            stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"turn server {self.name} exited ({self.proc.poll()})\n{self.kids.logs()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, op: str, job: str) -> dict[str, Any]:
        return self.ask_raw(op=op, job=job)

    def close(self) -> None:
        stdin: IO[bytes] | None = self.proc.stdin
        if stdin is not None and self.proc.poll() is None:
            stdin.write(b'{"op": "quit"}\n')
            stdin.flush()
            stdin.close()


def long_job(servers: list[Server], job_id: str, turns: int) -> list[dict[str, Any]]:
    """Create ``job_id`` and advance it turn by turn, turn k on ``servers[k % len(servers)]``; per-turn replies."""
    servers[0].ask("create", job_id)
    out = []
    while True:
        answer = servers[len(out) % len(servers)].ask("advance", job_id)
        out.append(answer)
        if answer["result"] == "completed":
            break
        if answer["result"] != "advanced" or len(out) > turns:
            raise RuntimeError(f"turn {len(out)} of {job_id}: {answer}")
    if len(out) != turns:
        raise RuntimeError(f"{job_id}: {len(out)} turns, expected {turns}")
    servers[-1].ask("check", job_id)
    return out


def fig13(rep: Report, url: str, kids: Any, sz: Sizes) -> None:
    n, w = sz.long_turns, sz.window
    if n < 2 * w + 1:
        raise SystemExit(f"--long-turns {n} is too short for two windows of {w} turns and the final one")
    say(f"figure 13: one {n}-turn job, turns alternating between 2 processes (cold) vs all in one (warm), "
        f"{sz.long_runs} runs")
    a = Server(kids, "turns-a", url, "cold", n)
    b = Server(kids, "turns-b", url, "cold", n)
    cold: list[list[dict[str, Any]]] = []
    warm: list[list[dict[str, Any]]] = []
    try:
        long_job([a, b], "warm-up-cold", n)
        long_job([a], "warm-up-warm", n)
        for r in range(sz.long_runs):  # interleaved run by run
            cold.append(long_job([a, b], f"cold-{r}", n))
            warm.append(long_job([a], f"warm-{r}", n))
    finally:
        for s in (a, b):
            s.close()
            kids.stop(s.proc)
    early, late = slice(0, w), slice(n - 1 - w, n - 1)  # 1-based turns 1..w and n-w..n-1; turn n answers "done"
    span = f"turns {n - w}-{n - 1}"

    def med(runs: list[list[dict[str, Any]]], window: slice, field: str = "dt") -> list[float]:
        return [statistics.median(t[field] for t in run[window]) for run in runs]

    def med_without_read(runs: list[list[dict[str, Any]]], window: slice) -> list[float]:
        return [statistics.median(t["dt"] - t["read_s"] for t in run[window]) for run in runs]

    ms = "{:.3f}"
    c_early, c_late = med(cold, early), med(cold, late)
    rep.add("13a", f"cold (2 processes alternate), turns 1-{w}, median turn", [v * 1e3 for v in c_early], "ms",
            fmt=ms)
    rep.add("13b", f"cold, {span}, median turn", [v * 1e3 for v in c_late], "ms", fmt=ms)
    rep.ratio("13c", f"cold, {span} / turns 1-{w}", c_late, c_early, "<= 1.1", lambda v: v <= 1.1)
    r_early, r_late = med(cold, early, "read_s"), med(cold, late, "read_s")
    rep.add("13d", f"  of which reading the history (storage.messages), turns 1-{w}", [v * 1e3 for v in r_early],
            "ms", fmt=ms)
    rep.add("13e", f"  of which reading the history, {span}", [v * 1e3 for v in r_late], "ms", fmt=ms)
    rep.ratio("13f", f"cold, {span} / turns 1-{w}, history read left out", med_without_read(cold, late),
              med_without_read(cold, early))
    reads = [statistics.mean(t["reads"] for t in run[1:n - 1]) for run in cold]
    rep.add("13g", f"cold: history reads per turn (turns 2-{n - 1}; each only what the process lacks, 13h)", reads,
            "reads",
            fmt="{:.2f}")
    rep.add("13h", f"cold: messages read per turn, {span}", med(cold, late, "read_messages"), "msgs", fmt="{:,.0f}")
    w_early, w_late = med(warm, early), med(warm, late)
    rep.add("13i", f"warm (one process, cache hits), turns 1-{w}, median turn", [v * 1e3 for v in w_early], "ms",
            fmt=ms)
    rep.add("13j", f"warm, {span}, median turn", [v * 1e3 for v in w_late], "ms", fmt=ms)
    rep.ratio("13k", f"warm, {span} / turns 1-{w}", w_late, w_early)
    wreads = [statistics.mean(t["reads"] for t in run[1:n - 1]) for run in warm]
    rep.add("13l", f"warm: history reads per turn (turns 2-{n - 1}; 0 = cache hits)", wreads, "reads", fmt="{:.2f}")
    rep.ratio("13m", f"cold / warm, {span}", c_late, w_late)


# --- main ------------------------------------------------------------------------
def _floats(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    if argv[:1] == ["bare-worker"]:
        return bare_worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-sized (3 jobs x 15 turns per run; a 60-turn job)")
    p.add_argument("--only", default="12,13", help="comma-separated figures (default: 12,13)")
    p.add_argument("--workers", help="worker classes for figure 12: simple,fork (default both)")
    p.add_argument("--jobs", type=int, help="figure 12 jobs per side per run, SimpleWorker (default 10)")
    p.add_argument("--fork-jobs", type=int, help="figure 12 jobs per side per run, forking Worker (default 6)")
    p.add_argument("--turns", type=int, help="figure 12 turns per job (default 30)")
    p.add_argument("--runs", type=int, help="figure 12 runs (>= 3; default 3)")
    p.add_argument("--continue-for", type=float, help="figure 12 continue_for of the 'on' side (default 0.5)")
    p.add_argument("--long-turns", type=int, help="figure 13 turns of the job (default 200)")
    p.add_argument("--long-runs", type=int, help="figure 13 runs (default 5)")
    p.add_argument("--window", type=int, help="figure 13 turns per window, first and last (default 20)")
    args = p.parse_args(argv)
    sz = QUICK if args.quick else FULL
    over: dict[str, Any] = {}
    if args.workers:
        bad = [x for x in _floats(args.workers) if x not in CLASSES]
        if bad:
            p.error(f"--workers takes simple and/or fork, not {bad}")
        over["workers"] = _floats(args.workers)
    for name in ("jobs", "fork_jobs", "long_runs", "window"):
        if getattr(args, name) is not None:
            over[name] = max(1, getattr(args, name))
    if args.turns is not None:
        over["turns"] = max(3, args.turns)
    if args.long_turns is not None:
        over["long_turns"] = max(3, args.long_turns)
    if args.runs is not None:
        over["runs"] = max(3, args.runs)
    if args.continue_for is not None:
        over["continue_for"] = max(0.001, args.continue_for)
    sz = replace(sz, **over)
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    from bench.procs import Children, find_redis_server

    if find_redis_server() is None:
        print("latency bench skipped: redis-server not found (apt-get install redis-server)")
        return 0
    rep = Report()
    started = time.perf_counter()
    kids = Children()
    try:
        url = kids.redis()
        if "12" in only:
            fig12(rep, url, kids, sz)
        if "13" in only:
            fig13(rep, url, kids, sz)
    finally:
        for conn in _conns.values():
            conn.close()
        _conns.clear()
        rep.notes.extend(kids.notes)
        kids.cleanup()
    rep.show(f"{TITLE} ({'quick' if args.quick else 'full'}; figure 12: {sz.runs} runs x {sz.jobs} "
              f"(fork: {sz.fork_jobs}) jobs x {sz.turns} turns per side, p50/p99 per run; "
              f"figure 13: {sz.long_runs} runs of {sz.long_turns} turns; "
              f"median over runs, spread min-max; {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
