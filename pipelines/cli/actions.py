"""``pipelines`` commands for people acting on a job: pause, resume, approve, reject, tail its events,
fork it, delete it, and the retention sweep (``gc``).

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from pipelines.cli.args import count
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
    _register_lifecycle(add, load, seconds)


def _register_lifecycle(add: AddCommand, load: LoadApp, seconds: Callable[[str], float]) -> None:
    """fork, delete and gc: a job's life beyond one run."""

    def cmd_fork(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        view = app.fork(args.job, at_turn=args.at_turn, new_job_id=args.new_id, run=args.run).get()
        status = view.status.value if view is not None else "-"
        print(f"{args.new_id}: forked from {args.job} at turn {args.at_turn}, status {status}", file=out)
        return 0

    def cmd_delete(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        app.delete(args.job)
        print(f"{args.job}: deleted", file=out)
        return 0

    def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
        app = load(args.app)
        removed = app.gc(older_than=args.older_than, scan=args.scan, limit=args.limit,
                         all_pipelines=args.all_pipelines)
        for job_id in removed:
            print(job_id, file=out)
        print(f"{len(removed)} finished job(s) removed", file=out)
        return 0

    p = add("fork", cmd_fork, "start a new job from a job's checkpoint at an earlier turn (paused unless --run)")
    p.add_argument("job")
    p.add_argument("--at-turn", type=int, required=True, help="the turn (phases done; 0 = the start)")
    p.add_argument("--new-id", required=True, help="the new job's id")
    p.add_argument("--run", action="store_true", help="run the fork at once (a re-run from that turn)")
    p = add("delete", cmd_delete, "delete a finished, paused or failed job, its child runs and all they stored")
    p.add_argument("job")
    p = add("gc", cmd_gc, "delete finished jobs older than the app's retention (or --older-than)")
    p.add_argument("--older-than", type=seconds, default=None,
                   help="seconds since the job finished (default: the app's retention=)")
    p.add_argument("--scan", action="store_true",
                   help="also scan every record (jobs finished before the finished index existed)")
    p.add_argument("--limit", type=count, default=1000, help="at most this many jobs (default: 1000)")
    p.add_argument("--all-pipelines", action="store_true",
                   help="also jobs of pipelines the app does not register (by default another app's are kept)")


def _tail(app: App, args: argparse.Namespace, out: TextIO, when: Callable[[float | None], str]) -> int:
    """Print the job's parts; with --follow, live (text as it arrives) until the job ends or --timeout."""
    for event in app.stream(args.job, after=args.after, follow=args.follow, timeout=args.timeout or None):
        turn = f" turn {event.turn}" if event.turn is not None else ""
        data = json.dumps(event.data, sort_keys=True)
        print(f"{when(event.timestamp)}  {event.id}  {event.type}{turn}  {data}", file=out, flush=True)
    return 0
