"""``make chaos``: W1 agent jobs under worker kills, duplicate delivery, a Redis restart and model faults.

    python bench/chaos.py            # the full run (200 x 10 under kills; ~3-4 min on 2 cores)
    python bench/chaos.py --quick    # a smaller run (~1 min)
    python bench/chaos.py --only kill,faults

Prints ONE table (progress goes to stderr). Every scenario runs on its own
private redis-server (free port, temp dir) with ``python -m pipelines worker``
processes of ``tests.apps.chaos_app`` (SimpleWorkers, the due-job sweep on);
the model is the loopback fake OpenAI server (``tests.fake_openai``, W1 mode)
in this process, reached through litellm's real HTTP path. Every child
process is killed by pid in a ``finally``; nothing leaves 127.0.0.1.

Scenarios (what each figure means is in the table's ``goal`` column):

kill    N jobs x T turns; every ``--kill-every`` seconds a random worker that
        is past start-up is SIGKILLed (process group and children) and a
        fresh one started, as long as another worker is ready. Half the jobs
        use a tool with the ``retry`` crash policy, half a non-idempotent one
        with ``on_interrupted="reconcile"``.
dup     every advance is enqueued 3 times under distinct RQ ids.
redis   redis-server (``appendonly yes``) is stopped with SIGTERM mid-run and
        started again on the same port and dir; the workers must ride it out.
faults  each model fault through an agent on the memory adapters.
sqlite  W1 jobs on one SQLite file, one worker process and then four sharing
        it, a random one SIGKILLed every ``--kill-every`` seconds (see
        ``bench/chaos_sqlite.py``); needs no Redis.
recovery  DEFAULT settings (the App's lease, the worker's sweep): a job's
        worker is SIGKILLed (its pid alone, as the OOM killer does) mid-turn,
        at a random point of its lease's renewal cycle; the figure is the time
        from the kill to the job's next turn starting on another worker.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench import chaos_sqlite  # noqa: E402
from bench.chaos_lib import (  # noqa: E402
    Killer,
    Procs,
    W1Server,
    check_effects,
    check_jobs,
    diagnose,
    expected_transcript,
    find_redis_server,
    quantiles,
    start_jobs,
    unfinished,
)
from pipelines.app import App  # noqa: E402
from pipelines.engine.errors import PipelineError  # noqa: E402
from tests.apps import chaos_app, sqlite_app  # noqa: E402

TITLE = "phaserunner chaos and fault figures"


@dataclass
class Config:
    jobs: int = 200
    turns: int = 10
    workers: int = 4
    kill_every: float = 0.5
    lease: float = 4.0
    sweep: float = 1.0
    grace: float = 2.0
    dup_jobs: int = 100
    redis_jobs: int = 100
    timeout: float = 300.0  # per scenario
    seed: int = 7
    recoveries: int = 6


@dataclass
class Table:
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, scenario: str, figure: str, value: Any, goal: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("ok" if ok else "MISS")
        self.rows.append((scenario, figure, str(value), goal, verdict))

    def render(self) -> str:
        head = ("scenario", "figure", "value", "goal", "")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(5)]
        line = "|" + "|".join("-" * (w + 2) for w in widths) + "|"

        def fmt(r: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

        return "\n".join([fmt(head), line, *(fmt(r) for r in self.rows), *self.notes])


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100.0 * a / b:.0f}%)" if b else "0/0"


def secs(v: float) -> str:
    return "-" if v != v else f"{v:.1f} s"


def _all_done(app: App, client: redis.Redis, jobs: list[str]) -> bool:
    try:
        return int(client.zcard(app.storage.due_key)) == 0 and not unfinished(app, jobs)  # type: ignore[attr-defined]
    except (redis.RedisError, PipelineError):
        return False


def _worker_runs(client: redis.Redis) -> int:
    total = 0
    for key in client.smembers("rq:workers"):
        total += int(client.hget(key, "successful_job_count") or 0) + int(client.hget(key, "failed_job_count") or 0)
    return total


def _effect_rows(t: Table, scenario: str, client: redis.Redis, jobs: list[str], turns: int, kills: list[Any],
                 outages: list[tuple[float, float]] | None = None) -> None:
    retry_jobs, recon_jobs = jobs[0::2], jobs[1::2]
    r = check_effects(client, retry_jobs, turns, kills, outages or ())
    c = check_effects(client, recon_jobs, turns, kills, outages or ())
    t.add(scenario, "tool effects applied (idempotency keys)", f"{r.keys + c.keys - r.missing - c.missing}"
          f"/{r.keys + c.keys}", "all", r.missing + c.missing == 0)
    t.add(scenario, "duplicate effects, reconcile tool (non-idempotent)", c.repeated, "0", c.repeated == 0)
    t.add(scenario, "duplicate effects, retry tool: interrupted mid-call", r.repeats_after_kill,
          "allowed by 'retry' (<= kills)", None)
    if outages:
        t.add(scenario, "duplicate effects, retry tool: journal write lost to the outage", r.repeats_after_outage,
              "allowed by 'retry'", None)
    t.add(scenario, "duplicate effects, retry tool: not explained by a kill or an outage", r.repeats_unexplained,
          "0", r.repeats_unexplained == 0)


# --- scenarios -------------------------------------------------------------------
def scenario_kill(cfg: Config, server: W1Server, t: Table) -> None:
    name = "kill"
    procs = Procs()
    try:
        url = procs.start_redis()
        procs.configure(server.url, CHAOS_LEASE=f"{cfg.lease:g}", CHAOS_QUEUE="chaos")
        client = redis.Redis.from_url(url)
        app = chaos_app.build(url, server.url, lease=cfg.lease)

        def start(slot: int) -> str:
            return procs.start_worker(slot, sweep_interval=cfg.sweep, sweep_grace=cfg.grace)

        killer = Killer(procs, app, client, every=cfg.kill_every, start=start, seed=cfg.seed)
        for slot in range(cfg.workers):
            killer.adopt(start(slot), slot)
        procs.wait_ready(client, cfg.workers)
        jobs = [f"kill-{i:03d}" for i in range(cfg.jobs)]
        say(f"{name}: {cfg.jobs} jobs x {cfg.turns} turns, {cfg.workers} workers, a kill every "
            f"{cfg.kill_every:g}s, lease {cfg.lease:g}s, sweep every {cfg.sweep:g}s")
        t0 = time.monotonic()
        start_jobs(app, jobs, cfg.turns)
        deadline, last, done = t0 + cfg.timeout, 0.0, False
        while time.monotonic() < deadline:
            killer.tick()
            now = time.monotonic()
            if now - last >= 1.0:
                last = now
                if _all_done(app, client, jobs):
                    done = True
                    break
                if int(now - t0) % 15 == 0:
                    say(f"{name}: {len(unfinished(app, jobs))} jobs left, {len(killer.kills)} kills")
            time.sleep(0.05)
        elapsed = time.monotonic() - t0
        say(f"{name}: {'done' if done else 'TIMED OUT'} in {elapsed:.0f}s with {len(killer.kills)} kills")
        killer.tick(killing=False)
        jc = check_jobs(app, jobs, cfg.turns)
        kills = len(killer.kills)
        t.add(name, f"jobs complete ({cfg.jobs} x {cfg.turns} turns, {cfg.workers} workers)",
              pct(jc.complete, jc.jobs), "100%", jc.complete == jc.jobs)
        t.add(name, "workers SIGKILLed (and restarted)", f"{kills} in {elapsed:.0f} s",
              f"one every ~{cfg.kill_every:g} s", None)
        t.add(name, "transcripts equal to the expected W1 transcript", pct(jc.equal, jc.jobs), "100%",
              jc.equal == jc.jobs)
        t.add(name, "live streams whose text equals the committed turns", pct(jc.jobs - jc.stream_mismatch, jc.jobs),
              "100%", jc.stream_mismatch == 0)
        t.add(name, "messages lost / duplicated", f"{jc.lost} / {jc.extra}", "0 / 0", jc.lost == jc.extra == 0)
        _effect_rows(t, name, client, jobs, cfg.turns, killer.kills)
        expected_calls = cfg.jobs * cfg.turns
        repeats = server.repeated_for(jobs)
        t.add(name, "duplicate model calls (requests - jobs x turns)",
              f"{server.requests_for(jobs) - expected_calls} ({repeats} repeated turns)", f"<= kills ({kills})",
              server.requests_for(jobs) - expected_calls <= kills)
        held = [r for r in killer.recoveries]
        # Each kill's recovery on its own: one whose new worker was killed too is timed by that later kill.
        adv = [r.advanced_after for r in held if r.advanced_after is not None and not r.killed_again]
        req = [r.requeued_after for r in held if r.requeued_after is not None]
        goal = cfg.lease + cfg.sweep
        m, p95, mx = quantiles(req)
        t.add(name, f"kill -> held job re-enqueued, median / p95 / max ({len(req)} jobs)",
              f"{secs(m)} / {secs(p95)} / {secs(mx)}", f"<= lease + sweep = {goal:g} s (+0.5 s polling)",
              mx <= goal + 0.5)
        m, p95, mx = quantiles(adv)
        t.add(name, f"kill -> held job advances again, median / p95 / max ({len(adv)} jobs)",
              f"{secs(m)} / {secs(p95)} / {secs(mx)}", f"<= lease + sweep = {goal:g} s (+0.5 s polling)",
              mx <= goal + 0.5)
        waits = [r.advanced_after - r.requeued_after for r in held if not r.killed_again
                 and r.advanced_after is not None and r.requeued_after is not None and r.queue_depth is not None]
        depths = [float(r.queue_depth) for r in held if r.queue_depth is not None]
        m, p95, mx = quantiles(waits)
        t.add(name, "... of which waiting in the queue after re-enqueue, median / max",
              f"{secs(m)} / {secs(mx)} (queue depth median {quantiles(depths)[0]:.0f})", "", None)
        t.add(name, "kills that hit a job mid-turn", f"{len(held)} of {kills}", "", None)
        t.add(name, "... of which the job's next worker was killed too (timed by that kill)",
              str(sum(r.killed_again for r in held)), "", None)
        if jc.examples:
            t.notes.append(f"kill: {'; '.join(jc.examples)}")
        for line in diagnose(app, client, jobs):
            t.notes.append(f"kill: stuck {line}")
    finally:
        procs.cleanup()


def scenario_dup(cfg: Config, server: W1Server, t: Table) -> None:
    name = "dup x3"
    procs = Procs()
    try:
        url = procs.start_redis()
        procs.configure(server.url, CHAOS_LEASE=f"{cfg.lease:g}", CHAOS_QUEUE="chaos", CHAOS_DELIVERIES="3")
        client = redis.Redis.from_url(url)
        app = chaos_app.build(url, server.url, lease=cfg.lease, deliveries=3)
        workers = 3
        for slot in range(workers):
            procs.start_worker(slot, sweep_interval=cfg.sweep, sweep_grace=cfg.grace)
        procs.wait_ready(client, workers)
        jobs = [f"dup-{i:03d}" for i in range(cfg.dup_jobs)]
        say(f"{name}: {len(jobs)} jobs x {cfg.turns} turns, every advance enqueued 3 times, {workers} workers")
        t0 = time.monotonic()
        start_jobs(app, jobs, cfg.turns)
        deadline = t0 + cfg.timeout
        while time.monotonic() < deadline and not _all_done(app, client, jobs):
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        # Let the queue drain so the count of advance messages run is complete.
        drain = time.monotonic() + 30
        while time.monotonic() < drain and int(client.llen("rq:queue:chaos") or 0) > 0:
            time.sleep(0.2)
        time.sleep(0.5)
        jc = check_jobs(app, jobs, cfg.turns)
        t.add(name, f"jobs complete ({len(jobs)} x {cfg.turns} turns, {workers} workers)",
              f"{pct(jc.complete, jc.jobs)} in {elapsed:.0f} s", "100%", jc.complete == jc.jobs)
        t.add(name, "advance messages run by RQ", f"{_worker_runs(client)} for {len(jobs) * cfg.turns} turns",
              "~3 per turn", None)
        t.add(name, "transcripts identical to a clean run", pct(jc.equal, jc.jobs), "100%", jc.equal == jc.jobs)
        extra = server.requests_for(jobs) - len(jobs) * cfg.turns
        t.add(name, "duplicate model calls", extra, "0", extra == 0)
        _effect_rows(t, name, client, jobs, cfg.turns, [])
        if jc.examples:
            t.notes.append(f"dup: {'; '.join(jc.examples)}")
    finally:
        procs.cleanup()


def scenario_redis(cfg: Config, server: W1Server, t: Table) -> None:
    name = "redis restart"
    procs = Procs(appendonly=True)
    try:
        url = procs.start_redis()
        procs.configure(server.url, CHAOS_LEASE=f"{cfg.lease:g}", CHAOS_QUEUE="chaos")
        client = redis.Redis.from_url(url)
        app = chaos_app.build(url, server.url, lease=cfg.lease)
        workers = 3
        names = [procs.start_worker(slot, sweep_interval=cfg.sweep, sweep_grace=cfg.grace)
                 for slot in range(workers)]
        procs.wait_ready(client, workers)
        jobs = [f"aof-{i:03d}" for i in range(cfg.redis_jobs)]
        total = len(jobs) * cfg.turns
        say(f"{name}: {len(jobs)} jobs x {cfg.turns} turns, {workers} workers, appendonly yes")
        t0 = time.monotonic()
        start_jobs(app, jobs, cfg.turns)
        deadline = t0 + cfg.timeout
        while time.monotonic() < deadline and server.requests_for(jobs) < 0.4 * total:
            time.sleep(0.05)
        at = server.requests_for(jobs)
        down, down_at = time.monotonic(), time.time()
        procs.stop_redis()
        time.sleep(1.0)
        procs.start_redis()
        outage = time.monotonic() - down
        window = (down_at, time.time())
        say(f"{name}: redis-server restarted after {at}/{total} model calls; outage {outage:.1f}s")
        while time.monotonic() < deadline and not _all_done(app, client, jobs):
            time.sleep(0.5)
        after = time.monotonic() - down - outage
        jc = check_jobs(app, jobs, cfg.turns)
        died = [n for n in names if procs.workers[n].poll() is not None]
        t.add(name, f"jobs complete ({len(jobs)} x {cfg.turns} turns; restart at {100 * at // total}% of turns)",
              pct(jc.complete, jc.jobs), "100%", jc.complete == jc.jobs)
        t.add(name, "outage (SIGTERM -> answering PING again)", secs(outage), "", None)
        t.add(name, "time from restart to all jobs settled", secs(after), "", None)
        errors = [rec.error or "" for j in jobs
                  if (rec := app.storage.get_job(j)) is not None and rec.status.value == "error"]
        t.add(name, "jobs failed by the outage", len(errors), "0", not errors)
        if errors:
            t.notes.append(f"redis: {errors[0][:300]}")
        t.add(name, "worker processes that exited", f"{len(died)} of {workers}", "0", not died)
        t.add(name, "messages lost / duplicated", f"{jc.lost} / {jc.extra}", "0 / 0", jc.lost == jc.extra == 0)
        t.add(name, "transcripts equal to the expected W1 transcript", pct(jc.equal, jc.jobs), "100%",
              jc.equal == jc.jobs)
        t.add(name, "live streams whose text equals the committed turns", pct(jc.jobs - jc.stream_mismatch, jc.jobs),
              "100%", jc.stream_mismatch == 0)
        extra = server.requests_for(jobs) - total
        t.add(name, "duplicate model calls", extra, f"<= turns in flight ({workers})", extra <= workers)
        _effect_rows(t, name, client, jobs, cfg.turns, [], [window])
        if jc.examples:
            t.notes.append(f"redis: {'; '.join(jc.examples)}")
        if died:
            t.notes.append(f"redis: exited workers' logs:\n{procs.logs()}")
    finally:
        procs.cleanup()


def _parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _wait(what: str, check: Any, timeout: float, procs: Procs) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"recovery: timed out after {timeout:.0f}s waiting for {what}\n{procs.logs()}")


def scenario_recovery(cfg: Config, t: Table) -> None:
    """Kill -> next turn with nothing configured: ``tests.apps.redis_app`` with the App's default lease, workers
    started with no sweep option (forking workers, as ``pipelines worker`` runs by default)."""
    import importlib
    import random

    from pipelines.engine.runner import DEFAULT_LEASE_SECONDS

    name = "recovery"
    procs = Procs()
    rng = random.Random(cfg.seed)
    try:
        url = procs.start_redis()
        procs.configure("", REDIS_URL=url, PIPELINES_NAP="120")
        procs.env.pop("PIPELINES_LEASE", None)  # the default, whatever the caller's environment says
        os.environ["REDIS_URL"] = url
        os.environ.pop("PIPELINES_LEASE", None)
        from tests.apps import redis_app

        redis_app = importlib.reload(redis_app)  # built on this scenario's redis-server
        app, client = redis_app.app, redis.Redis.from_url(url)
        app_path = redis_app.APP_PATH

        def start(slot: int) -> str:
            return procs.start_worker(slot, simple=False, sweep_interval=None, sweep_grace=None, app=app_path)

        for slot in range(2):
            start(slot)
        procs.wait_ready(client, 2)
        say(f"{name}: {cfg.recoveries} kills mid-turn, default lease {DEFAULT_LEASE_SECONDS:g} s, default sweep")
        took: list[float] = []
        for i in range(cfg.recoveries):
            job = f"recover-{i}"
            app.run_pipeline("sleepy", job_id=job)
            started = _wait(f"{job} to start its turn", lambda j=job: next(
                (e for e in client.lrange(redis_app.NAP_STARTED, 0, -1) if e.decode().split()[0] == j), None),
                60, procs)
            horse = int(started.decode().split()[1])
            worker = _parent_of(horse)
            victim = next(n for n, p in procs.workers.items() if p.pid == worker)
            time.sleep(rng.uniform(0, DEFAULT_LEASE_SECONDS / 3 + 0.5))  # anywhere in the renewal cycle
            killed_at = time.time()
            os.kill(worker, signal.SIGKILL)  # the worker's pid alone: its horse ends with it (Lifeline)
            procs.workers.pop(victim).wait(10)
            start(i + 2)  # as a supervisor would; whichever worker sweeps first takes the job over

            def next_turn(j: str = job, killed: int = horse) -> float | None:
                runs = [e.decode().split() for e in client.lrange(redis_app.NAP_RUNS, 0, -1)]
                return next((float(r[2]) for r in runs if r[0] == j and int(r[1]) != killed), None)

            took.append(_wait(f"{job}'s next turn", next_turn, 120, procs) - killed_at)
            _wait(f"{job} to complete", lambda j=job: (r := app.storage.get_job(j)) is not None
                  and r.status.value == "complete", 60, procs)
            procs.wait_ready(client, 2)
            say(f"{name}: {job} ran again {took[-1]:.1f} s after its worker was killed")
        m, _, mx = quantiles(took)
        t.add(name, f"kill -9 -> the job's next turn starts, defaults, median / max ({len(took)} kills)",
              f"{secs(m)} / {secs(mx)}", f"~10 s (lease {DEFAULT_LEASE_SECONDS:g} s renewed every third, "
              "sweep every 2 s)", mx <= DEFAULT_LEASE_SECONDS + 3)
        t.add(name, "each, in seconds", " ".join(f"{v:.1f}" for v in took), "", None)
    finally:
        procs.cleanup()


def scenario_clean(server: W1Server, t: Table) -> None:
    """One job through the same server on the memory adapters: the 'clean run' the others compare with."""
    from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
    from pipelines import Agent
    from tests.apps.agent_app import add

    clock = VirtualClock(start=1_000_000.0)
    storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
    agent = Agent(name="clean", model="openai/fake-model", tools=[add], system=chaos_app.SYSTEM, max_turns=20,
                  model_params={"api_base": server.url, "api_key": "sk-test", "timeout": 20})
    agent.run(job_id="clean-0", messages=[chaos_app.user_message("clean-0", 10)], storage=storage,
              scheduler=scheduler)
    scheduler.drain()
    same = storage.messages("clean-0") == expected_transcript("clean-0", 10)
    t.add("clean", "memory adapters, same server: transcript = expected W1", "yes" if same else "NO", "yes", same)


def scenario_faults(t: Table) -> None:
    from bench.chaos_faults import run_faults

    for r in run_faults():
        t.add("model fault", r.name, r.outcome, r.expected, r.ok)


def scenario_sqlite(cfg: Config, t: Table) -> None:
    jobs = max(2, cfg.jobs // 2)  # a file's workers turn over slower than Redis's: half the kill scenario's jobs
    for processes in (1, 4):
        say(f"sqlite: {jobs} jobs x {sqlite_app.TURNS} turns, {processes} process(es) on one file, "
            f"a kill every ~{cfg.kill_every:g}s")
        found = chaos_sqlite.run_sqlite_chaos(processes, jobs, kill_every=cfg.kill_every, timeout=cfg.timeout,
                                              seed=cfg.seed, say=say)
        say(f"sqlite x{processes}: {found.complete}/{jobs} complete in {found.seconds:.0f}s, {found.kills} kills")
        chaos_sqlite.add_rows(t, found, sqlite_app.TURNS)


# --- main --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller run (~1 min)")
    p.add_argument("--only", default="kill,dup,redis,faults,recovery,sqlite", help="comma-separated scenarios")
    p.add_argument("--jobs", type=int, help="jobs in the kill scenario (default 200; --quick 40)")
    p.add_argument("--turns", type=int, help="turns per job (default 10; --quick 5)")
    p.add_argument("--workers", type=int, help="workers in the kill scenario (default 4)")
    p.add_argument("--kill-every", type=float, help="seconds between kills (default 0.5)")
    p.add_argument("--lease", type=float, help="lease seconds (default 4)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    cfg = Config(seed=args.seed)
    if args.quick:
        cfg.jobs, cfg.turns, cfg.dup_jobs, cfg.redis_jobs, cfg.workers, cfg.timeout = 40, 5, 20, 20, 3, 180
        cfg.recoveries = 3
    for attr in ("jobs", "turns", "workers", "kill_every", "lease"):
        if getattr(args, attr) is not None:
            setattr(cfg, attr, getattr(args, attr))
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {"kill", "dup", "redis", "faults", "clean", "recovery", "sqlite"}
    if unknown:
        p.error(f"unknown scenarios: {sorted(unknown)}")
    t = Table()
    started = time.monotonic()
    server = W1Server()
    try:
        scenario_clean(server, t)
        if only & {"kill", "dup", "redis", "recovery"} and find_redis_server() is None:
            t.notes.append("redis-server not found: kill, dup, redis and recovery scenarios skipped")
            only -= {"kill", "dup", "redis", "recovery"}
        for key, fn in (("kill", scenario_kill), ("dup", scenario_dup), ("redis", scenario_redis)):
            if key in only:
                with contextlib.ExitStack():
                    fn(cfg, server, t)
        if "recovery" in only:
            scenario_recovery(cfg, t)
        if "faults" in only:
            say("faults: each model fault through an agent on the memory adapters")
            scenario_faults(t)
        if "sqlite" in only:
            scenario_sqlite(cfg, t)
    finally:
        server.stop()
    wall = time.monotonic() - started
    misses = sum(1 for r in t.rows if r[4] == "MISS")
    print(f"{TITLE} ({'quick' if args.quick else 'full'}; {wall:.0f} s; {misses} MISS)")
    print(f"machine: nproc {os.cpu_count()}; Python {sys.version.split()[0]}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(t.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
