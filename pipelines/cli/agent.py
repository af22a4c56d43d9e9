"""``pipelines agent list`` and ``pipelines agent run``: an App's agents from the command line.

    pipelines agent list --app M:A
    pipelines agent run NAME --app M:A --input "..." [--job ID] [--context JSON] [--follow] [--timeout S]

``run`` starts one run (or continues the conversation ``--job``); with
``--follow`` it prints the answer's text as it streams and ends with the job,
otherwise it waits for the job and prints the answer. On an App with an
in-process scheduler the turns run in this process; on a queue, workers run them,
and when none has taken the job after ``NO_WORKER_SECONDS`` ``--follow`` says so on
stderr, naming the queue it waits on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from pipelines.cli.args import printable
from pipelines.errors import InvalidInputError, JobFailedError

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["NO_WORKER_SECONDS", "register"]

NO_WORKER_SECONDS = 5.0
"""How long ``agent run --follow`` waits for a worker to take the job before it says none has."""

AddCommand = Callable[[str, Callable[[argparse.Namespace, TextIO], int], str], argparse.ArgumentParser]


def _list(app: App, out: TextIO) -> int:
    from pipelines.agent import Agent

    for name, agent in sorted(app.agents.items()):
        if not isinstance(agent, Agent):  # another PipelineSource: nothing more to show than its name
            print(name, file=out)
            continue
        model = agent.config.model
        tools = ", ".join(sorted(agent.config.tmap)) or "-"
        print(f"{name}\tmodel={model if isinstance(model, str) else type(model).__name__}\ttools={tools}", file=out)
    return 0


def _context(text: str | None) -> object:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f"--context must be JSON: {exc}") from None


def _run(app: App, args: argparse.Namespace, out: TextIO) -> int:
    if not args.name or args.input is None:
        raise InvalidInputError("agent run needs the agent's NAME and --input")
    job_id = args.job or f"{args.name}-{uuid.uuid4().hex[:12]}"
    extra: dict[str, Any] = {"context": context} if (context := _context(args.context)) is not None else {}
    run = app.run_agent(args.name, job_id=job_id, user=args.input, **extra)
    print(f"job {job_id}", file=out, flush=True)
    began = time.monotonic()  # one --timeout for the stream and the wait after it together
    if args.follow:
        app.run_in_process()  # an in-process scheduler runs the turns here; a queue's workers run them
        watching = _watch_for_a_worker(app, job_id, args)
        open_line = False
        try:
            for part in run.stream(timeout=args.timeout):
                if part.type == "text_delta":  # the model's text, for a terminal: escapes shown, not obeyed
                    text = printable(str(part.data.get("text", "")))
                    print(text, end="", file=out, flush=True)
                    open_line = open_line or bool(text)
                elif part.type == "turn_committed":
                    print(file=out, flush=True)
                    open_line = False
        finally:
            watching.set()
            if open_line:  # an error line after it starts a line of its own
                print(file=out, flush=True)
    view = run.wait(timeout=args.timeout, since=began)
    if view.error:
        raise JobFailedError(f"job {job_id!r} failed: {view.error}")
    if not args.follow:
        result = view.result
        print(printable(result) if isinstance(result, str) else json.dumps(result, default=str), file=out)
    return 0


def _queue_of(app: App) -> str:
    """The queue a new run's first turn waits on (its interactive queue), as the scheduler names it."""
    return app.queue_of() or type(app.scheduler).__name__


def _watch_for_a_worker(app: App, job_id: str, args: argparse.Namespace) -> threading.Event:
    """After ``NO_WORKER_SECONDS``, say on stderr if no worker has taken the job yet; set the event to stop."""
    stop = threading.Event()
    first = app.get(job_id)
    if first is None or first.record.status.value != "running":
        return stop  # an in-process scheduler already ran it
    err: TextIO = getattr(args, "err", None) or sys.stderr

    def check() -> None:
        if stop.wait(NO_WORKER_SECONDS):
            return
        try:
            now = app.get(job_id)
            taken = (now is None or now.record.version != first.record.version
                     or app.storage.lease_owner(job_id) is not None)
        except Exception:  # noqa: BLE001 - a hint only: the stream reports a storage that is down
            return
        if taken or stop.is_set():
            return
        queue = _queue_of(app)
        path = args.app or os.environ.get("PIPELINES_APP")
        start = (f"`pipelines worker --app {path}`" if path and type(app.scheduler).__name__ == "RQScheduler"
                 else f"a worker of this app listening on {queue!r}")
        print(f"waiting: no worker has taken job {job_id!r} after {NO_WORKER_SECONDS:g}s; it waits on queue "
              f"{queue!r}: start {start}", file=err, flush=True)

    threading.Thread(target=check, name="pipelines-no-worker-hint", daemon=True).start()
    return stop


def register(add: AddCommand, load: Callable[[str | None], App], seconds: Callable[[str], float]) -> None:
    """Add ``pipelines agent list`` / ``pipelines agent run``."""

    def cmd_agent(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        return _list(app, out) if args.action == "list" else _run(app, args, out)

    p = add("agent", cmd_agent, "list the app's agents, or run one (agent run NAME --input ...)")
    p.add_argument("action", choices=["list", "run"])
    p.add_argument("name", nargs="?", help="with run: the agent's name")
    p.add_argument("--input", help="with run: the user's message")
    p.add_argument("--job", help="with run: the job id (a complete conversation goes on)")
    p.add_argument("--context", help="with run: the run's context, as JSON")
    p.add_argument("--follow", action="store_true", help="with run: print the answer as it streams")
    p.add_argument("--timeout", type=seconds, default=300.0, help="with run: seconds to wait (default: 300)")
