"""``pipelines health``: is the deployment of an App able to advance its jobs? Fit for a container probe.

Checks, each a :class:`Check`: storage reachable; the due backlog and its
oldest overdue job (beyond ``max_overdue`` seconds is unhealthy: nothing is
advancing jobs); for an RQ scheduler, workers registered and alive and the
size of RQ's failed-job registry (reported, never fatal: phaserunner records
failures on the job). Exit code 0 when every check passes, 1 otherwise.

A ``pipelines worker`` is alive while the key it renews every few seconds
exists (:func:`adapters.rq.lifeline.alive_key`, a TTL of ~10 s): a worker
killed with ``kill -9`` is dead here within that TTL, not after RQ's own
heartbeat expires (minutes). Other RQ workers are judged by RQ's heartbeat.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from pipelines.engine.errors import PipelineError

if TYPE_CHECKING:
    from pipelines.app import App

__all__ = ["Check", "check", "register"]


@dataclass(frozen=True)
class Check:
    """One health check: its name, whether it passed, and what it found."""

    name: str
    ok: bool
    detail: str


def check(app: App, *, max_overdue: float = 60.0) -> list[Check]:
    """Run every check against ``app`` (see the module docstring)."""
    try:
        app.storage.get_job("health-check")  # one round trip; the id need not exist
    except PipelineError as exc:
        return [Check("storage", False, f"unreachable: {exc}")]
    checks = [Check("storage", True, f"{type(app.storage).__name__} reachable"), _backlog(app, max_overdue)]
    return checks + _rq_checks(app)


def _backlog(app: App, max_overdue: float) -> Check:
    now = app.scheduler.now()
    due = app.storage.due_jobs(now, limit=100_000)
    if not due:
        return Check("backlog", True, "no job is due")
    oldest = app.storage.get_job(due[0])
    late = now - oldest.checkpoint.due_at if oldest is not None and oldest.checkpoint is not None else 0.0
    detail = f"{len(due)} due; oldest {due[0]} overdue by {late:.1f} s (limit {max_overdue:g} s)"
    return Check("backlog", late <= max_overdue, detail)


def _rq_checks(app: App) -> list[Check]:
    try:
        from adapters.rq import RQScheduler
    except ImportError:  # rq not installed: this app cannot be using it
        return []
    if not isinstance(app.scheduler, RQScheduler):
        return [Check("workers", True, f"not checked for {type(app.scheduler).__name__}")]
    from rq import Worker

    scheduler = app.scheduler
    workers = Worker.all(connection=scheduler.connection, queue=scheduler.queue)
    alive = _alive(scheduler.connection, workers)
    failed = scheduler.queue.failed_job_registry.count
    return [
        Check("workers", bool(alive), f"{len(alive)} alive of {len(workers)} registered on queue "
                                      f"{scheduler.queue_name!r}"),
        Check("failed", True, f"{failed} in RQ's failed-job registry"),
    ]


def _alive(connection: Any, workers: list[Any]) -> list[Any]:
    """The workers of ``workers`` that are alive: by their alive key if they keep one, else by RQ's heartbeat."""
    from adapters.rq.lifeline import ALIVE_FIELD, alive_key

    pipe = connection.pipeline(transaction=False)
    for w in workers:
        pipe.hget(w.key, ALIVE_FIELD)
        pipe.exists(alive_key(w.name))
    replies = pipe.execute()
    now = datetime.now(UTC)
    alive = []
    for w, keeps_key, key_exists in zip(workers, replies[::2], replies[1::2], strict=True):
        if keeps_key is not None:
            beating = bool(key_exists)
        else:  # a worker that keeps no alive key (a plain `rq worker`)
            beating = w.last_heartbeat is not None and (
                now - w.last_heartbeat.replace(tzinfo=UTC)).total_seconds() <= max(60, w.worker_ttl)
        if beating:
            alive.append(w)
    return alive


AddCommand = Callable[[str, Callable[[argparse.Namespace, TextIO], int], str], argparse.ArgumentParser]


def register(add: AddCommand, load: Callable[[str | None], App], seconds: Callable[[str], float]) -> None:
    """Add ``pipelines health`` to the command line."""

    def cmd_health(args: argparse.Namespace, out: TextIO) -> int:
        started = time.monotonic()
        checks = check(load(args.app), max_overdue=args.max_overdue)
        if args.json:
            print(json.dumps({"ok": all(c.ok for c in checks), "checks": [asdict(c) for c in checks],
                              "seconds": round(time.monotonic() - started, 3)}), file=out)
        else:
            for c in checks:
                print(f"{'ok  ' if c.ok else 'FAIL'}  {c.name:<9} {c.detail}", file=out)
        return 0 if all(c.ok for c in checks) else 1

    p = add("health", cmd_health, "check storage, the due backlog and the workers (exit 0 healthy, 1 not)")
    p.add_argument("--max-overdue", type=seconds, default=60.0,
                   help="a job overdue longer than this is unhealthy (default: 60)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
