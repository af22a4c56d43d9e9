"""``make chaos``'s SQLite scenario: W1 jobs on one file, worker processes killed with SIGKILL at random.

With one worker process, and with four sharing the file: each is
``python -m tests.apps.sqlite_app`` (SQLiteStorage + LocalScheduler, two
threads), and every ``kill_every`` seconds (jittered) a random one past
start-up is killed (once turns were committed since the last kill; at most
two kills per job) and a fresh one started. Half the jobs use ``add`` with the ``retry`` crash
policy, half the non-idempotent one with ``on_interrupted="reconcile"``; each
application of the tool's effect is a row in a separate SQLite ledger. Checked:
every job completes, each transcript exactly as a run without crashes writes
it, no message lost or duplicated, no reconcile effect applied twice, retry
effects applied again at most once per kill.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from adapters.sqlite import SQLiteStorage
from pipelines import JobStatus
from tests.apps import sqlite_app

__all__ = ["SQLiteChaos", "add_rows", "run_sqlite_chaos"]


class Rows(Protocol):
    def add(self, scenario: str, figure: str, value: Any, goal: str = "", ok: bool | None = None) -> None: ...


@dataclass
class SQLiteChaos:
    processes: int
    jobs: int
    complete: int = 0
    exact: int = 0
    lost: int = 0
    extra: int = 0
    kills: int = 0
    seconds: float = 0.0
    reconcile_repeats: int = 0
    retry_repeats: int = 0
    missing_effects: int = 0


def _messages(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
    finally:
        conn.close()


def _unfinished(storage: SQLiteStorage, ids: list[str]) -> list[str]:
    return [j for j in ids if (r := storage.get_job(j)) is None or r.status is not JobStatus.COMPLETE]


def run_sqlite_chaos(processes: int, jobs: int, *, kill_every: float = 0.5, timeout: float = 300.0,
                     seed: int = 7, say: Any = print) -> SQLiteChaos:
    """Run the scenario once on a fresh file in a temp dir; what it found."""
    folder = Path(tempfile.mkdtemp(prefix="chaos-sqlite-"))
    path, effects = folder / "w1.db", folder / "effects.db"
    env = {"PIPELINES_SQLITE_PATH": str(path), "PIPELINES_EFFECTS_PATH": str(effects)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the starter reads the same file and builds the same agents as the workers
    try:
        starter = sqlite_app.build(workers=0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    storage = starter.storage
    assert isinstance(storage, SQLiteStorage)
    ids = [f"sq-{n:03d}" for n in range(jobs)]
    for n, job_id in enumerate(ids):
        starter.run_agent("w1" if n % 2 == 0 else sqlite_app.RECONCILE_AGENT, job_id=job_id, user="go")
    workers = sqlite_app.Workers(path, folder, **env)
    rng = random.Random(seed + processes)
    out = SQLiteChaos(processes=processes, jobs=jobs)
    t0 = time.monotonic()
    try:
        for _ in range(processes):
            workers.start()
        next_kill, said, progress = t0 + kill_every, t0, -1
        # Each kill strands the killed process's jobs for a lease (5 s): without a budget one process killed
        # every half second spends the run waiting out leases.
        budget = 2 * jobs
        # The harness's own reads compete with the workers for the file and the CPU: every job's record is
        # read once a second (as chaos.py does), the message count only when a kill is due.
        left, checked = ids, 0.0
        while left and time.monotonic() < t0 + timeout:
            now = time.monotonic()
            if now - checked >= 1.0:
                checked, left = now, _unfinished(storage, ids)
                if not left:
                    break
            # Kill a process past start-up, and only once turns were committed since the last kill: on a
            # loaded machine a restarted process may need longer than ``kill_every`` to do anything at all.
            if (out.kills < budget and now >= next_kill and (done := _messages(path)) > progress
                    and (ready := workers.ready())):
                progress = done
                workers.kill(rng.choice(ready))
                workers.start()
                out.kills += 1
                next_kill = time.monotonic() + rng.uniform(0.5, 1.5) * kill_every
            if now - said >= 15:
                said = now
                say(f"sqlite x{processes}: {len(left)} jobs left, {out.kills} kills")
            time.sleep(0.05)
    finally:
        workers.stop_all()
    out.seconds = time.monotonic() - t0
    _check(storage, ids, out)
    _check_effects(effects, ids, out)
    storage.close()
    clean = (out.complete == out.exact == jobs and out.lost == out.extra == out.missing_effects == 0
             and out.reconcile_repeats == 0)
    if clean:
        shutil.rmtree(folder, ignore_errors=True)  # every run left ~1.5 MB in the temp dir
    else:
        say(f"sqlite x{processes}: kept {folder} (the database, the effects and the workers' logs)")
    return out


def _check(storage: SQLiteStorage, ids: list[str], out: SQLiteChaos) -> None:
    want = sqlite_app.expected()
    for job_id in ids:
        record = storage.get_job(job_id)
        out.complete += record is not None and record.status is JobStatus.COMPLETE
        got = [(m["role"], m.get("content")) for m in storage.messages(job_id)]
        out.exact += got == want
        have, need = Counter(got), Counter(want)
        out.lost += sum((need - have).values())
        out.extra += sum((have - need).values())


def _check_effects(effects: Path, ids: list[str], out: SQLiteChaos) -> None:
    conn = sqlite_app.effects_db(str(effects))
    try:
        applied = Counter(key for (key,) in conn.execute("SELECT key FROM applied"))
    finally:
        conn.close()
    calls_per_job = len(sqlite_app.expected()) // 2 - 1  # one tool call per turn but the last
    for n, job_id in enumerate(ids):
        keys = [k for k in applied if k.startswith(f"{job_id}/")]
        out.missing_effects += max(0, calls_per_job - len(keys))
        repeats = sum(applied[k] - 1 for k in keys)
        if n % 2 == 0:
            out.retry_repeats += repeats
        else:
            out.reconcile_repeats += repeats


def add_rows(t: Rows, r: SQLiteChaos, turns: int) -> None:
    """The scenario's rows in the chaos table."""
    name = f"sqlite x{r.processes}"

    def pct(a: int) -> str:
        return f"{a}/{r.jobs} ({100.0 * a / r.jobs:.0f}%)" if r.jobs else "0/0"

    t.add(name, f"jobs complete ({r.jobs} x {turns} turns, {r.processes} process(es) on one file)",
          pct(r.complete), "100%", r.complete == r.jobs)
    t.add(name, "worker processes SIGKILLed (and restarted)", f"{r.kills} in {r.seconds:.0f} s", "", None)
    t.add(name, "transcripts equal to the expected W1 transcript", pct(r.exact), "100%", r.exact == r.jobs)
    t.add(name, "messages lost / duplicated", f"{r.lost} / {r.extra}", "0 / 0", r.lost == r.extra == 0)
    t.add(name, "tool effects missing", r.missing_effects, "0", r.missing_effects == 0)
    t.add(name, "duplicate effects, reconcile tool (non-idempotent)", r.reconcile_repeats, "0",
          r.reconcile_repeats == 0)
    t.add(name, "duplicate effects, retry tool (interrupted mid-call)", r.retry_repeats,
          f"allowed by 'retry' (<= kills, {r.kills})", r.retry_repeats <= r.kills)
