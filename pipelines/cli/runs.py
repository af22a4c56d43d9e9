"""``pipelines`` commands about one job: advance, status, log, transcript, retry, cancel.

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from pipelines import AdvanceResult, JobStatus
from pipelines.cli import loading
from pipelines.cli.args import json_printable, printable
from pipelines.cli.loading import when
from pipelines.engine.models import JobRecord, Message, validate_job_id
from pipelines.errors import ConfigurationError, JobNotFoundError

__all__ = ["cmd_advance", "cmd_cancel", "cmd_log", "cmd_retry", "cmd_status", "cmd_transcript", "family_columns"]


def cmd_advance(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    if args.due == bool(args.job):
        raise ConfigurationError("give either --due or one JOB id")
    if args.due:
        results = app.advance_due(grace=args.grace, limit=args.limit)
        for job_id, result in results:
            print(f"{job_id} {result.value}", file=out)
        # A job it could not advance (why is logged) fails the run: a cron's monitor must see it.
        return 1 if any(result is AdvanceResult.UNREACHED for _, result in results) else 0
    result = app.advance(validate_job_id(args.job))
    if result is AdvanceResult.UNKNOWN:
        raise JobNotFoundError(f"job {args.job!r} not found")
    print(f"{args.job} {result.value}", file=out)
    return 0


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    rec = app.read.record(args.job)
    if args.json:
        print(json_printable(rec.model_dump_json(indent=2)), file=out)
        return 0
    cp = rec.checkpoint
    pipeline = rec.pipeline if rec.pipeline in app.registry.pipelines else (
        f"{rec.pipeline} (not registered in this app: another app's on the storage, or taken out of this one; "
        "this app's workers do not run it)")
    rows: list[tuple[str, Any]] = [
        ("job", rec.job_id), ("pipeline", pipeline), ("status", rec.status.value), ("version", rec.version),
    ]
    if cp is not None:
        rows += [("phase", cp.next_phase), ("attempt", cp.attempt)]
        if rec.status in (JobStatus.RUNNING, JobStatus.PAUSED):  # a paused one's delay is kept for its resume
            rows.append(("due", when(cp.due_at)))
    rows += [("phases done", rec.phases_done), ("transcript", f"{rec.transcript_len} messages")]
    if rec.forked_from is not None:
        rows.append(("forked from", f"{rec.forked_from} at turn {rec.at_turn}"))
    rows += _family_rows(rec, app.view(rec).title)
    if rec.error:
        rows.append(("error", rec.error))
    if rec.waiting:
        rows.append(("waiting", json.dumps(rec.waiting)))
    if rec.result is not None:
        rows.append(("result", json.dumps(rec.result)))
    u = rec.usage
    if u.model_calls:
        rows.append(("usage", f"{u.model_calls} calls, {u.total_tokens} tokens, ${u.cost_usd:.6f}"))
    rows += _lease_rows(app, rec)
    rows += [("created", when(rec.created_at)), ("updated", when(rec.updated_at))]
    for key, value in rows:
        print(f"{key + ':':<13}{printable(str(value))}", file=out)  # a title or an error may quote the model
    return 0


def _lease_rows(app: Any, rec: JobRecord) -> list[tuple[str, Any]]:
    """Who holds the job's lease, or that its last holder was lost mid-turn (the lease ran out, not let go)."""
    lease = app.read.lease_state(rec.job_id)
    rows: list[tuple[str, Any]] = []
    if lease.owner is not None:
        rows.append(("lease", f"held by {lease.owner}"))
    elif lease.lapsed and rec.status is JobStatus.RUNNING:
        rows.append(("lease", "ran out without being let go: its worker was lost mid-turn; the next worker or "
                              "the sweep (`pipelines advance --due`) runs the turn again"))
    if rec.interrupted and rec.status is JobStatus.RUNNING:  # a poison turn in the making (App(max_interrupted_turns))
        limit = app.max_interrupted_turns
        rows.append(("interrupted", f"{rec.interrupted} time(s) in a row without committing (its worker died or "
                     "stalled past its lease); " + ("no limit" if limit is None else f"the job fails at {limit}")))
    return rows


def _family_rows(rec: JobRecord, title: str | None) -> list[tuple[str, Any]]:
    """A child run's parent and a parent's children (agents and pipelines used as tools), and the title."""
    rows: list[tuple[str, Any]] = []
    if title:
        rows.append(("title", title))
    if rec.parent_job is not None:
        rows.append(("parent", f"{rec.parent_job} (call {rec.parent_call})"))
    if rec.children:
        rows.append(("children", ", ".join(rec.children)))
    return rows


def family_columns(rec: JobRecord) -> str:
    """Extra listing columns, only for jobs in a parent/child family (other lines stay as they were)."""
    parts = [f"parent={rec.parent_job}"] if rec.parent_job is not None else []
    parts += [f"children={len(rec.children)}"] if rec.children else []
    return "".join(f"\t{p}" for p in parts)


def cmd_log(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    for e in app.read.logs(args.job):
        print(printable(f"{when(e.timestamp)}  {e.level:<5}  {e.phase or '-'}  {e.message}"), file=out)
    return 0


def _pretty(i: int, m: Message) -> str:
    role = str(m.get("role", "?"))
    head = f"[{i}] {role}"
    if role == "tool":
        head += f" ({m.get('tool_call_id', '?')})"
    content = m.get("content")
    text = content if isinstance(content, str) else (json.dumps(content) if content is not None else "")
    lines = [f"{head}: {text}".rstrip()]
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        lines.append(f"    -> {fn.get('name', '?')}({fn.get('arguments', '')}) [{call.get('id', '?')}]")
    # Model and tool text, for a terminal: an escape sequence in it is shown, not obeyed.
    return printable("\n".join(lines))


def cmd_transcript(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    for i, m in enumerate(app.read.messages(args.job)):
        print(_pretty(i, m) if args.pretty else json_printable(json.dumps(m, ensure_ascii=False)), file=out)
    return 0


def cmd_retry(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    rec = app.retry(args.job, mode="full" if args.full else "resume").record
    phase = rec.checkpoint.next_phase if rec.checkpoint else "-"
    print(f"{rec.job_id}: retried ({'full' if args.full else 'resume'}) at phase {phase!r}, "
          f"status {rec.status.value}", file=out)
    return 0


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
    view = app.cancel(args.job, wait=args.wait, force=args.force)
    if view.control == "cancel":
        print(f"{view.job_id}: cancel requested; it takes effect when the turn in flight commits", file=out)
        return 0
    rec = view.record
    kept = f", checkpoint kept at phase {rec.checkpoint.next_phase!r}" if rec.checkpoint else ""
    print(f"{rec.job_id}: cancelled{kept}", file=out)
    return 0

