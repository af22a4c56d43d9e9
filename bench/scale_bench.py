"""Figures 9 and 10 (issue 16): what grows with stored jobs, and what one turn costs Redis.

    python -m bench.scale_bench                          # both figures, both layouts (~1.5 min on 2 cores)
    python -m bench.scale_bench --quick                  # a smoke-sized run (< 30 s)
    python -m bench.scale_bench --only 9 --stored 1000,100000 --due 100 --runs 9
    python -m bench.scale_bench --only 10 --jobs 5 --turns 200 --cap-runs 5 --buckets 0,64

**Figure 9, ``advance --due`` with many finished jobs.** ``App.advance_due()``
(what ``pipelines advance --due`` runs) advancing ``--due`` jobs of a trivial
one-phase pipeline (it returns ``Done``), with 1,000 vs 100,000 finished jobs
stored under the same prefix. The finished jobs are seeded first (the create
script, pipelined 1,000 per round trip; timed apart, never inside the figure);
each run creates the due jobs (not timed), times ``advance_due()`` and deletes
them again (not timed), so the stored count stays exact. Goal: the ratio
100,000 / 1,000 <= 1.2x (the cost grows with what is due, not with what is stored).

**Figure 10, Redis cost per turn (capacity).** W1 agent jobs (bench/w1.py) on
``RedisStorage``, advanced in-process one turn per ``App.try_advance`` (no
queue: the storage's own cost; RQ's commands come on top). Over a run of
``--jobs`` jobs of ``--turns`` turns (job creation included), deltas of the
private server's ``INFO`` divided by the turns: commands executed
(``commandstats``; Lua scripts count once plus each command they call),
bytes in and out (``total_net_input_bytes`` / ``total_net_output_bytes``),
CPU (``used_cpu_user + used_cpu_sys``), whence the turns/s one Redis core can
carry (1 / CPU per turn). The INFO calls' own cost is measured and subtracted.
Commands the client sent are counted by wrapping the client. Memory per
finished job: ``MEMORY USAGE ... SAMPLES 0`` summed over the keys ``SCAN``
finds on the job's key base (its hash tag), over its transcript bytes (the
stored message JSON); goal <= 1.5x. Both layouts: ``buckets=0`` (global
indexes) and ``buckets=64`` (Redis Cluster's hash-tagged buckets).

Nothing is asserted: a missed goal is printed ``MISS``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import NoopScheduler, Report, check_transcript, say, timed  # noqa: E402  (sets litellm env)

TITLE = "phaserunner scale figures (issue 16)"
SEED_BATCH = 1000


@dataclass(frozen=True)
class Sizes:
    stored: tuple[int, ...]  # finished jobs stored, figure 9 (the first is the baseline of the ratio)
    due: int
    runs: int  # figure 9 runs per stored size
    jobs: int  # figure 10 jobs per run
    turns: int
    cap_runs: int
    buckets: tuple[int, ...]


FULL = Sizes(stored=(1_000, 100_000), due=100, runs=9, jobs=5, turns=200, cap_runs=5, buckets=(0, 64))
QUICK = Sizes(stored=(1_000, 10_000), due=100, runs=3, jobs=1, turns=50, cap_runs=3, buckets=(0, 64))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _storage(url: str, prefix: str, buckets: int) -> Any:
    from adapters.redis import RedisStorage

    return RedisStorage.from_url(url, prefix=prefix, buckets=buckets)


# --- figure 9: advance --due with many finished jobs ----------------------------
def seed_finished(storage: Any, n: int, start: int = 0) -> float:
    """Store ``n`` finished (COMPLETE) job records through ``create_job``, its script pipelined; seconds taken.

    ``create_job`` builds the script's arguments as always; only its round trip is batched
    (``SEED_BATCH`` creates per pipeline), so the records and index entries are the ones a create writes.
    """
    from pipelines.engine.models import JobRecord, JobStatus

    script = storage.scripts.create
    t0 = time.perf_counter()
    now = time.time() - n
    try:
        for lo in range(start, start + n, SEED_BATCH):
            pipe = storage.client.pipeline(transaction=False)
            storage.scripts.create = functools.partial(script, client=pipe)
            for i in range(lo, min(start + n, lo + SEED_BATCH)):
                storage.create_job(JobRecord(job_id=f"done-{i:06d}", pipeline="one", status=JobStatus.COMPLETE,
                                             result={"n": i}, version=1, phases_done=1, created_at=now + i,
                                             updated_at=now + i))
            bad = [r for r in pipe.execute() if _text(r) != "ok"]
            if bad:
                raise RuntimeError(f"seeding finished jobs: create replied {bad[:3]}")
    finally:
        storage.scripts.create = script
    return time.perf_counter() - t0


def one_phase_app(storage: Any) -> Any:
    from pipelines import App, Done, Phase

    def finish(ctx: Any) -> Done:
        return Done(result={"ok": True})

    return App(storage=storage, scheduler=NoopScheduler(), pipelines={"one": [Phase("finish", finish)]},
               provenance=False)


def due_run(app: Any, due: int, tag: str) -> float:
    """Create ``due`` due jobs (not timed), time ``app.advance_due()``, delete them (not timed); seconds."""
    from pipelines import AdvanceResult

    ids = [f"due-{tag}-{i:04d}" for i in range(due)]
    for job_id in ids:
        app.run_pipeline("one", job_id=job_id, initial_state={})
    with timed() as t:
        done = app.advance_due()
    results = dict(done)
    if sorted(results) != ids or any(r is not AdvanceResult.COMPLETED for r in results.values()):
        raise RuntimeError(f"advance_due ran {len(done)} of {due} due jobs: {list(results.items())[:3]}")
    for job_id in ids:
        app.storage.delete_job(job_id)
    return t[0]


def fig9(rep: Report, url: str, sz: Sizes) -> None:
    import redis

    from pipelines import JobStatus

    base = sz.stored[0]
    flush = redis.Redis.from_url(url)
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    for buckets in sz.buckets:
        say(f"figure 9: buckets={buckets}: seeding {' and '.join(f'{n:,}' for n in sz.stored)} finished jobs")
        apps = {}
        for n in sz.stored:
            storage = _storage(url, f"s9b{buckets}n{n}", buckets)
            took = seed_finished(storage, n)
            count = storage.count_jobs(JobStatus.COMPLETE)
            if count != n:
                raise RuntimeError(f"seeded {n} finished jobs, count_jobs says {count}")
            rep.notes.append(f"figure 9, buckets={buckets}: seeded {n:,} finished jobs in {took:.1f} s "
                             f"({took / n * 1e6:.0f} us each, pipelined create script; not in the figure)")
            apps[n] = one_phase_app(storage)
        say(f"figure 9: buckets={buckets}: advance_due() with {sz.due} due jobs, {sz.runs} runs per size")
        times: dict[int, list[float]] = {n: [] for n in sz.stored}
        for r in range(sz.runs + 1):  # run 0 warms up (scripts loaded, layout checked) and is not counted
            for n in sz.stored:  # interleaved, so a busy moment on the machine hits both sizes alike
                took = due_run(apps[n], sz.due, f"r{r}")
                if r:
                    times[n].append(took)
        for n in sz.stored:
            rep.add(f"9{next(letters)}", f"buckets={buckets}: advance_due(), {sz.due} due, {n:,} finished stored",
                    [v * 1e3 for v in times[n]], "ms", fmt="{:.1f}")
        for n in sz.stored[1:]:
            rep.ratio(f"9{next(letters)}", f"buckets={buckets}: {n:,} / {base:,} finished stored", times[n],
                      times[base], "<= 1.2", lambda v: v <= 1.2)
        for app in apps.values():
            app.storage.client.close()
        flush.flushdb()  # a private server: the next layout starts from an empty keyspace
    flush.close()


# --- figure 10: what one turn costs Redis ---------------------------------------
class CallCounter:
    """Counts the commands a storage sends (pipelined ones too) and its round trips.

    Through its client's ``execute_command``, and the two ways that skip it: the turn's functions on
    the connection a thread keeps (adapters/redis/held.py), and a journal write whose reply is read
    later with the commit sent right behind it (adapters/redis/deferred.py's ``Deferred.write``). Each
    command counts a round trip (it has its reply), waited for or not.
    """

    def __init__(self, storage: Any) -> None:
        from tests.redis_spy import spy_commands  # the client's commands and the two ways that skip it

        self.commands = 0
        self.round_trips = 0
        client = storage.client
        make_pipeline = client.pipeline

        def counting(send: Any, *args: Any) -> Any:
            self.commands += 1
            self.round_trips += 1
            return send(*args)

        spy_commands(storage, counting)

        def pipeline(*args: Any, **options: Any) -> Any:
            pipe = make_pipeline(*args, **options)
            run = pipe.execute

            def execute(*a: Any, **kw: Any) -> Any:
                self.commands += len(pipe.command_stack)
                self.round_trips += 1
                return run(*a, **kw)

            pipe.execute = execute
            return pipe

        client.pipeline = pipeline


@dataclass
class Snapshot:
    commands: int  # commandstats calls summed
    net_in: int
    net_out: int
    cpu: float  # seconds, user + sys of the whole server process
    used_memory: int

    def __sub__(self, other: Snapshot) -> Snapshot:
        return Snapshot(self.commands - other.commands, self.net_in - other.net_in, self.net_out - other.net_out,
                        self.cpu - other.cpu, self.used_memory - other.used_memory)


def snapshot(info: Any) -> Snapshot:
    stats, cpu, mem = info.info("stats"), info.info("cpu"), info.info("memory")
    commands = sum(int(v["calls"]) for v in info.info("commandstats").values())
    return Snapshot(commands, int(stats["total_net_input_bytes"]), int(stats["total_net_output_bytes"]),
                    float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), int(mem["used_memory"]))


def job_memory(storage: Any, job_id: str) -> dict[str, int]:
    """MEMORY USAGE (SAMPLES 0) of each key SCAN finds on the job's key base (its hash tag), by role."""
    from bench.retention import job_bytes

    keys = storage.keys(job_id)
    base = keys.record.rsplit(":", 1)[0]
    found = sorted(_text(k) for k in storage.client.scan_iter(match=f"{base}:*", count=1000))
    sizes = {k.rsplit(":", 1)[1]: int(storage.client.memory_usage(k, samples=0) or 0) for k in found}
    if sum(sizes.values()) != job_bytes(storage, job_id):  # bench/retention.py sums the JobKeys it knows of
        say(f"note: {job_id}: SCAN found keys beyond JobKeys: {found}")
    return sizes


def capacity_run(url: str, buckets: int, sz: Sizes, tag: str, warm: bool = False) -> dict[str, Any]:
    import redis

    from bench.apps import w1_agent
    from bench.w1 import USER
    from pipelines import AdvanceResult, App

    turns, jobs = (20, 1) if warm else (sz.turns, sz.jobs)
    storage = _storage(url, f"cap{buckets}", buckets)
    app = App(storage=storage, scheduler=NoopScheduler(), agents=[w1_agent(turns)])
    info = redis.Redis.from_url(url)
    calib = snapshot(info)
    calib = snapshot(info) - calib  # what one snapshot costs the server
    storage.client.memory_purge()
    counter = CallCounter(storage)
    ids = [f"{tag}-{j}" for j in range(jobs)]
    before = snapshot(info)
    t0 = time.perf_counter()
    advanced = 0
    for job_id in ids:
        app.run_agent("w1", job_id=job_id, messages=[USER])
        while True:
            result = app.try_advance(job_id)
            advanced += 1
            if result is AdvanceResult.COMPLETED:
                break
            if result is not AdvanceResult.ADVANCED:
                raise RuntimeError(f"turn {advanced} of {job_id}: {result}")
    wall = time.perf_counter() - t0
    sent, trips = counter.commands, counter.round_trips
    delta = snapshot(info) - before - calib
    memory, kept, transcript, roles = [], [], [], {}
    for job_id in ids:
        raw = info.lrange(storage.keys(job_id).messages, 0, -1)
        check_transcript([json.loads(m) for m in raw], turns)
        roles = job_memory(storage, job_id)
        memory.append(sum(roles.values()))
        kept.append(sum(roles.values()) - roles.get("live", 0))
        transcript.append(sum(map(len, raw)))
    info.close()
    storage.client.close()
    n = jobs * turns
    if advanced != n:
        raise RuntimeError(f"{advanced} advances for {jobs} x {turns} turns")
    return {"turns": n, "commands": delta.commands / n, "sent": sent / n, "trips": trips / n,
            "in": delta.net_in / n, "out": delta.net_out / n, "cpu_us": delta.cpu / n * 1e6, "wall_ms": wall / n * 1e3,
            "memory": memory, "kept": kept, "transcript": transcript, "used_memory": delta.used_memory / jobs,
            "roles": roles}


def script_times(url: str, buckets: int, turns: int) -> dict[str, tuple[float, float]]:
    """Server time per turn by script / command, from SLOWLOG at 0 us over one more job (not a measured run).

    {name: (us per turn, calls per turn)}; a script's time includes the commands it calls, which are listed
    again on their own.
    """
    import redis

    from bench.apps import w1_agent
    from bench.w1 import USER
    from pipelines import App

    storage = _storage(url, f"cap{buckets}", buckets)
    s = storage.scripts
    names = {getattr(s, a).sha: a for a in ("create", "commit", "step", "load", "renew", "release", "publish", "send",
                                            "dropped", "control", "delete")}
    names.update({s.commit.name: "commit", s.step.name: "step", s.load.name: "load"})  # by FCALL
    app = App(storage=storage, scheduler=NoopScheduler(), agents=[w1_agent(turns)])
    info = redis.Redis.from_url(url)
    old = info.config_get("slowlog-*")
    entries: list[Any] = []
    try:
        info.config_set("slowlog-max-len", 10_000)  # drained after every turn (~100 entries each)
        info.config_set("slowlog-log-slower-than", 0)
        info.slowlog_reset()
        app.run_agent("w1", job_id="by-script", messages=[USER])
        for _ in range(turns):
            app.try_advance("by-script")
            entries += info.slowlog_get(10_000)
            info.slowlog_reset()
    finally:
        for key, value in old.items():
            info.config_set(key, value)
        info.close()
        storage.client.close()
    us: dict[str, float] = {}
    calls: dict[str, float] = {}
    for e in entries:
        cmd = [_text(a) for a in e["command"].split()[:2]]
        name = cmd[0].lower()
        if name in ("slowlog", "config", "info"):
            continue
        if name in ("evalsha", "fcall") and len(cmd) > 1:
            name = f"script {names.get(cmd[1], cmd[1][:8])}"
        us[name] = us.get(name, 0.0) + e["duration"] / turns
        calls[name] = calls.get(name, 0.0) + 1 / turns
    return {k: (us[k], calls[k]) for k in sorted(us, key=lambda k: -us[k])}


def fig10(rep: Report, url: str, sz: Sizes) -> None:
    import redis

    info = redis.Redis.from_url(url)
    c0 = snapshot(info).cpu
    time.sleep(1.0)
    idle = snapshot(info).cpu - c0
    info.close()
    by: dict[int, list[dict[str, Any]]] = {}
    say(f"figure 10: W1 in-process, {sz.cap_runs} runs of {sz.jobs} jobs x {sz.turns} turns per layout, "
        f"layouts {', '.join(map(str, sz.buckets))} interleaved")
    for buckets in sz.buckets:
        capacity_run(url, buckets, sz, "warm", warm=True)
        by[buckets] = []
    for r in range(sz.cap_runs):  # interleaved, so a busy moment on the machine hits both layouts alike
        for buckets in sz.buckets:
            by[buckets].append(capacity_run(url, buckets, sz, f"r{r}"))
    for buckets in sz.buckets:
        top = list(script_times(url, buckets, sz.turns).items())[:8]
        rep.notes.append(f"figure 10, buckets={buckets}: server time per turn by script/command (SLOWLOG at 0 us, one "
                         "more job; a script includes what it calls): "
                         + ", ".join(f"{name} {t:.0f} us ({c:.2f}x)" for name, (t, c) in top))
    rows: list[tuple[str, str, Callable[[dict[str, Any]], list[float]], str, str, Any, str]] = [
        ("commands sent by the client per turn", "cmd/turn", lambda r: [r["sent"]], "", None, "{:.2f}"),
        ("round trips per turn", "rt/turn", lambda r: [r["trips"]], "", None, "{:.2f}"),
        ("commands executed per turn (commandstats, in scripts too)", "cmd/turn", lambda r: [r["commands"]], "",
         None, "{:.1f}"),
        ("bytes in per turn (client -> Redis)", "B/turn", lambda r: [r["in"]], "", None, "{:,.0f}"),
        ("bytes out per turn (Redis -> client)", "B/turn", lambda r: [r["out"]], "", None, "{:,.0f}"),
        ("server CPU per turn (used_cpu_user + sys)", "us/turn", lambda r: [r["cpu_us"]], "", None, "{:.1f}"),
        ("ceiling of one Redis core (1 / CPU per turn)", "turns/s", lambda r: [1e6 / r["cpu_us"]], "", None,
         "{:,.0f}"),
        ("client wall time per turn (in-process, for scale)", "ms", lambda r: [r["wall_ms"]], "", None, "{:.3f}"),
        (f"memory per finished {sz.turns}-turn job (its keys, SCAN)", "KiB",
         lambda r: [m / 1024 for m in r["memory"]], "", None, "{:,.1f}"),
        ("  transcript bytes of that job (message JSON)", "KiB", lambda r: [t / 1024 for t in r["transcript"]], "",
         None, "{:,.1f}"),
        ("  memory / transcript bytes", "x", lambda r: [m / t for m, t in zip(r["memory"], r["transcript"],
                                                                               strict=True)],
         "<= 1.5", lambda v: v <= 1.5, "{:.2f}"),
        ("  the same once its live stream expired (live_ttl)", "x",
         lambda r: [m / t for m, t in zip(r["kept"], r["transcript"], strict=True)], "<= 1.5", lambda v: v <= 1.5,
         "{:.2f}"),
        ("used_memory growth per job stored (indexes, allocator)", "KiB", lambda r: [r["used_memory"] / 1024], "",
         None, "{:,.1f}"),
    ]
    for i, (name, unit, pick, target, ok, fmt) in enumerate(rows):
        letter = "abcdefghijklmnopqrstuvwxyz"[i]
        for buckets in sz.buckets:
            values = [v for run in by[buckets] for v in pick(run)]
            rep.add(f"10{letter}.{buckets}", f"buckets={buckets}: {name}", values, unit, target, ok, fmt)
    for buckets in sz.buckets:
        roles = by[buckets][-1]["roles"]
        parts = ", ".join(f"{role} {n / 1024:,.1f}" for role, n in sorted(roles.items(), key=lambda kv: -kv[1]))
        rep.notes.append(f"figure 10, buckets={buckets}: one finished job's keys (MEMORY USAGE, KiB): {parts}")
    turns = sum(r["turns"] for runs in by.values() for r in runs)
    rep.notes.append(f"figure 10: the idle server used {idle * 1e3:.1f} ms CPU per second (serverCron), included "
                     "in the CPU per turn")
    rep.notes.append(f"figure 10: {turns:,} measured turns; per turn includes job creation; no queue (RQ's own "
                     "commands per turn come on top); bytes sent / transcript byte: see figure 4a of bench/run.py")


# --- main ------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(s.strip().replace("_", "")) for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke-sized (stored 1,000 vs 10,000; 1 job x 50 turns)")
    p.add_argument("--only", default="9,10", help="comma-separated figures (default: 9,10)")
    p.add_argument("--stored", help="finished jobs stored, figure 9, e.g. 1000,100000 (the first is the base)")
    p.add_argument("--due", type=int, help="due jobs advanced per run, figure 9 (default 100)")
    p.add_argument("--runs", type=int, help="figure 9 runs per size (>= 3; default 9)")
    p.add_argument("--jobs", type=int, help="figure 10 jobs per run (default 5)")
    p.add_argument("--turns", type=int, help="figure 10 turns per job (default 200)")
    p.add_argument("--cap-runs", type=int, help="figure 10 runs (default 5)")
    p.add_argument("--buckets", help="layouts, e.g. 0,64 (default)")
    args = p.parse_args(argv)
    sz = QUICK if args.quick else FULL
    from dataclasses import replace

    over: dict[str, Any] = {}
    if args.stored:
        over["stored"] = _ints(args.stored)
    if args.buckets:
        over["buckets"] = _ints(args.buckets)
    for name in ("due", "jobs", "turns", "cap_runs"):
        if getattr(args, name) is not None:
            over[name] = max(1, getattr(args, name))
    if args.runs is not None:
        over["runs"] = max(3, args.runs)
    sz = replace(sz, **over)
    only = {s.strip() for s in args.only.split(",") if s.strip()}

    from bench.procs import Children, find_redis_server

    if find_redis_server() is None:
        print("scale bench skipped: redis-server not found (apt-get install redis-server)")
        return 0
    rep = Report()
    started = time.perf_counter()
    kids = Children()
    try:
        url = kids.redis()
        if "9" in only:
            fig9(rep, url, sz)
        if "10" in only:
            fig10(rep, url, sz)
    finally:
        rep.notes.extend(kids.notes)
        kids.cleanup()
    rep.show(f"{TITLE} ({'quick' if args.quick else 'full'}; figure 9 median of {sz.runs} runs, figure 10 "
              f"{sz.cap_runs} runs of {sz.jobs} x {sz.turns} turns; spread min-max; "
              f"{time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
