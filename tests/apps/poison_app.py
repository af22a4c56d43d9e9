"""An agent whose tool kills the worker process running it (``os._exit``): a poison turn, on an SQLite file.

``python -m tests.apps.poison_app`` runs a worker process (the local scheduler's threads and its sweep) on
``$PIPELINES_SQLITE_PATH``; each call of the tool appends the worker's pid to ``$PIPELINES_POISON_LOG`` and then
ends the process at once, as a segfault in a C extension or the OOM killer would: no ``finally``, no lease let go.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from adapters.local import LocalScheduler
from adapters.sqlite import SQLiteStorage
from pipelines import Agent, App, tool
from pipelines.testing import ScriptedModel, call, reply

AGENT = "poisoned"


@tool
def crash(reason: str) -> str:
    """Run the C extension that takes the process down."""
    with open(os.environ["PIPELINES_POISON_LOG"], "a") as log:
        log.write(f"{os.getpid()}\n")
    os._exit(137)


def answer(messages: list[Any]) -> Any:
    if any(m.get("role") == "tool" for m in messages):
        return reply("survived")
    return reply("let me run it", call("crash", reason="segfault"))


def build(workers: int = 0) -> App:
    """The App on ``$PIPELINES_SQLITE_PATH``; ``workers`` threads once its scheduler starts."""
    storage = SQLiteStorage(os.environ["PIPELINES_SQLITE_PATH"])
    scheduler = LocalScheduler(workers=workers, poll=0.1, grace=0.3, sweep_interval=0.3)
    agent = Agent(name=AGENT, model=ScriptedModel(answer), tools=[crash], stream=False)
    return App(storage=storage, scheduler=scheduler, agents=[agent], provenance=False, lease_seconds=5.0)


def main() -> None:
    app = build(workers=1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with app.scheduler:  # type: ignore[attr-defined]
        print("ready", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
