"""W1-like agent jobs on an SQLite file, for the crash tests: ``python -m tests.apps.sqlite_app`` runs workers.

The file is ``$PIPELINES_SQLITE_PATH``. Turn k < T of a job: the scripted model
answers ~200 bytes of text and one tool call ``add(a=k, b=1)``; the tool returns
``{"sum": k+1}``; the last turn says "done". Both take a few milliseconds, so a
``kill -9`` lands inside a turn as often as between turns. Every answer is decided
from the transcript, so a turn re-run after a crash gives the same messages and
the finished transcript is known exactly (:func:`expected`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

from adapters.local import LocalScheduler
from adapters.sqlite import SQLiteStorage
from pipelines import Agent, App, tool
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

TURNS = int(os.environ.get("PIPELINES_W1_TURNS", "8"))
TEXT = "All right, let me add these numbers for you. " * 4  # ~200 bytes


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    time.sleep(0.005)
    return {"sum": a + b}


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
    agent = Agent(name="w1", model=ScriptedModel(answer), tools=[add], max_turns=TURNS + 2, stream=False)
    return App(storage=storage, scheduler=scheduler, agents=[agent], provenance=False, lease_seconds=5.0)


def main() -> None:
    app = build(workers=int(os.environ.get("PIPELINES_WORKERS", "2")), poll=0.1, grace=0.3, sweep_interval=0.5)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with app.scheduler:  # type: ignore[attr-defined]
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
