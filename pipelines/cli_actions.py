"""``pipelines`` commands for people acting on a job: pause, resume, approve, reject, and tail its events.

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from pipelines.engine.models import JobStatus

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["register"]

AddCommand = Callable[[str, Callable[[argparse.Namespace, TextIO], int], str], argparse.ArgumentParser]
LoadApp = Callable[[str | None], "App"]

_FINISHED = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)


def register(add: AddCommand, load: LoadApp, when: Callable[[float | None], str],
             seconds: Callable[[str], float], positive: Callable[[str], float]) -> None:
    """Add this module's commands to the parser (``add`` makes one subcommand)."""

    def cmd_pause(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        view = app.pause(args.job, wait=args.wait)
        if view.control == "pause":
            print(f"{view.job_id}: pause requested; it takes effect when the turn in flight commits", file=out)
            return 0
        rec = view.record
        print(f"{rec.job_id}: paused at phase {rec.checkpoint.next_phase if rec.checkpoint else '-'!r}", file=out)
        return 0

    def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        view = app.resume(args.job)
        print(f"{view.job_id}: resumed, status {view.status.value}", file=out)
        return 0

    def cmd_approve(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        app.approve(args.job, args.call)
        print(f"{args.job}: call {args.call} approved", file=out)
        return 0

    def cmd_reject(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        app.reject(args.job, args.call, reason=args.reason)
        print(f"{args.job}: call {args.call} rejected", file=out)
        return 0

    def cmd_tail(args: argparse.Namespace, out: TextIO) -> int:
        """Print the job's events; with --follow keep printing new ones until the job finishes."""
        return _tail(load(args.app), args, out, when)

    p = add("pause", cmd_pause, "pause a running job at its next turn boundary")
    p.add_argument("job")
    p.add_argument("--wait", type=seconds, default=30.0, help="seconds to wait for a turn in flight (default: 30)")
    p = add("resume", cmd_resume, "resume a paused job")
    p.add_argument("job")
    p = add("approve", cmd_approve, "approve a tool call a job is waiting on")
    p.add_argument("job")
    p.add_argument("call", help="the tool call id (see `pipelines status JOB`)")
    p = add("reject", cmd_reject, "reject a tool call a job is waiting on; the model gets the reason")
    p.add_argument("job")
    p.add_argument("call")
    p.add_argument("--reason", required=True, help="why; sent to the model as the tool's result")
    p = add("tail", cmd_tail, "print a job's events (--follow: live, until it finishes)")
    p.add_argument("job")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new events until the job ends")
    p.add_argument("--after", help="start after this event id (a cursor printed earlier)")
    # Kept for old scripts: following now blocks on the storage instead of polling.
    p.add_argument("--poll", type=positive, default=0.5, help="ignored (reads block on the storage)")
    p.add_argument("--timeout", type=seconds, default=0.0, help="stop following after this many seconds (0: never)")


def _tail(app: App, args: argparse.Namespace, out: TextIO, when: Callable[[float | None], str]) -> int:
    """Print the job's parts; with --follow, live (text as it arrives) until the job ends or --timeout."""
    for event in app.stream(args.job, after=args.after, follow=args.follow, timeout=args.timeout or None):
        turn = f" turn {event.turn}" if event.turn is not None else ""
        data = json.dumps(event.data, sort_keys=True)
        print(f"{when(event.timestamp)}  {event.id}  {event.type}{turn}  {data}", file=out, flush=True)
    return 0
