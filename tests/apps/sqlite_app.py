"""W1-like agent jobs on an SQLite file, for the crash tests: ``python -m tests.apps.sqlite_app`` runs workers.

The file is ``$PIPELINES_SQLITE_PATH``. Turn k < T of a job: the scripted model
answers ~200 bytes of text and one tool call ``add(a=k, b=1)``; the tool returns
``{"sum": k+1}``; the last turn says "done". Both take a few milliseconds, so a
``kill -9`` lands inside a turn as often as between turns. Every answer is decided
from the transcript, so a turn re-run after a crash gives the same messages and
the finished transcript is known exactly (:func:`expected`).

With ``$PIPELINES_EFFECTS_PATH`` set (``make chaos``'s SQLite scenario), ``add``
applies an *effect* in that separate SQLite file (one transaction: a row per
application, and the result by idempotency key), and a second agent,
``w1_reconcile``, declares it non-idempotent with ``on_interrupted="reconcile"``:
after a crash mid-call it looks the key up instead of applying it again.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from adapters.local import LocalScheduler
from adapters.sqlite import SQLiteStorage
from pipelines import Agent, App, Tool, ToolContext, tool
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply
from tests.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parents[2]

TURNS = int(os.environ.get("PIPELINES_W1_TURNS", "8"))
TEXT = "All right, let me add these numbers for you. " * 4  # ~200 bytes


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    time.sleep(0.005)
    return {"sum": a + b}


RECONCILE_AGENT = "w1_reconcile"
_EFFECTS = """CREATE TABLE IF NOT EXISTS applied (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY NOT NULL, body TEXT NOT NULL);"""


class AddArgs(BaseModel):
    a: int
    b: int


def effects_db(path: str) -> sqlite3.Connection:
    """The effect ledger (created on first use); autocommit, one connection per caller."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_EFFECTS)
    return conn


def ledger_tools(path: str) -> tuple[Tool, Tool]:
    """``add`` recording each application in the ledger: idempotent (retry) and non-idempotent (reconcile)."""
    local = threading.local()

    def conn() -> sqlite3.Connection:
        found: sqlite3.Connection | None = getattr(local, "conn", None)
        if found is None:
            found = local.conn = effects_db(path)
        return found

    def execute(args: AddArgs, ctx: ToolContext) -> dict[str, int]:
        time.sleep(0.005)
        result = {"sum": args.a + args.b}
        db = conn()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO applied VALUES (?, ?, ?)", (ctx.idempotency_key, os.getpid(), time.time()))
        db.execute("INSERT OR REPLACE INTO results VALUES (?, ?)", (ctx.idempotency_key, json.dumps(result)))
        db.execute("COMMIT")
        return result

    def reconcile(args: AddArgs, ctx: ToolContext) -> Any:
        row = conn().execute("SELECT body FROM results WHERE key = ?", (ctx.idempotency_key,)).fetchone()
        return None if row is None else json.loads(row[0])

    retry = Tool(name="add", description="Add two numbers.", input_model=AddArgs, execute=execute)
    recon = Tool(name="add", description="Add two numbers.", input_model=AddArgs, execute=execute,
                 idempotent=False, on_interrupted="reconcile", reconcile=reconcile)
    return retry, recon


def answer(messages: list[Message]) -> Any:
    time.sleep(0.005)
    k = sum(1 for m in messages if m.get("role") == "tool")
    if k + 1 >= TURNS:
        return reply("done")
    return reply(f"{TEXT}(turn {k})", call("add", a=k, b=1))


def expected(turns: int = TURNS) -> list[tuple[str, Any]]:
    """(role, content) of every message of a finished job, in order."""
    out: list[tuple[str, Any]] = [("user", "go")]
    for k in range(turns - 1):
        out += [("assistant", f"{TEXT}(turn {k})"), ("tool", json.dumps({"sum": k + 1}))]
    return [*out, ("assistant", "done")]


def build(workers: int = 0, **options: Any) -> App:
    """The App on ``$PIPELINES_SQLITE_PATH``; ``workers`` threads once its scheduler starts."""
    storage = SQLiteStorage(os.environ["PIPELINES_SQLITE_PATH"])
    scheduler = LocalScheduler(workers=workers, **options)
    effects = os.environ.get("PIPELINES_EFFECTS_PATH")
    if effects:
        retry, recon = ledger_tools(effects)
        tools = [("w1", retry), (RECONCILE_AGENT, recon)]
    else:
        tools = [("w1", add)]
    agents = [Agent(name=name, model=ScriptedModel(answer), tools=[t], max_turns=TURNS + 2, stream=False)
              for name, t in tools]
    return App(storage=storage, scheduler=scheduler, agents=agents, provenance=False, lease_seconds=5.0)


class Workers:
    """Worker processes of this app (``python -m tests.apps.sqlite_app``) on one file; each logs to its own file;
    ``env``: more environment (``PIPELINES_EFFECTS_PATH``)."""

    def __init__(self, path: Path, logdir: Path, **env: str) -> None:
        self.env = {**os.environ, "PIPELINES_SQLITE_PATH": str(path), "PIPELINES_WORKERS": "2", **env}
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self._logs: dict[int, Path] = {}

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        path = self.logdir / f"w{self.started}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tests.apps.sqlite_app"], cwd=ROOT, env=self.env,
                                    stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.procs.append(proc)
        self._logs[proc.pid] = path
        return proc

    def ready(self) -> list[subprocess.Popen[bytes]]:
        """The processes past start-up (their local workers run): a kill before that proves nothing."""
        return [p for p in self.procs if self._logs[p.pid].read_bytes().startswith(b"ready")]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.kill(proc)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logdir.glob("*.log"))


def main() -> None:
    app = build(workers=int(os.environ.get("PIPELINES_WORKERS", "2")), poll=0.1, grace=0.3, sweep_interval=0.5)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with app.scheduler:  # type: ignore[attr-defined]
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
