"""``pipelines agent list`` and ``pipelines agent run``: an App's agents from the command line.

    pipelines agent list --app M:A
    pipelines agent run NAME --app M:A --input "..." [--job ID] [--context JSON] [--follow] [--timeout S]

``run`` starts one run (or continues the conversation ``--job``); with
``--follow`` it prints the answer's text as it streams and ends with the job,
otherwise it waits for the job and prints the answer. On an App with an
in-process scheduler the turns run in this process; on a queue, workers run them.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from pipelines.cli_args import printable
from pipelines.engine.errors import InvalidInputError, JobFailedError

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["register"]

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
    if args.follow:
        app.run_in_process()  # an in-process scheduler runs the turns here; a queue's workers run them
        for part in run.stream(timeout=args.timeout):
            if part.type == "text_delta":  # the model's text, for a terminal: escapes shown, not obeyed
                print(printable(str(part.data.get("text", ""))), end="", file=out, flush=True)
            elif part.type == "turn_committed":
                print(file=out, flush=True)
    view = run.wait(timeout=args.timeout)
    if view.error:
        raise JobFailedError(f"job {job_id!r} failed: {view.error}")
    if not args.follow:
        result = view.result
        print(printable(result) if isinstance(result, str) else json.dumps(result, default=str), file=out)
    return 0


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
