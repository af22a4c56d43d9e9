"""The ``pipelines`` command (also ``python -m pipelines``): workers, the cron sweep, job inspection.

Every command takes ``--app pkg.mod:app`` (or ``$PIPELINES_APP``) and works on
that app's storage and scheduler::

    pipelines worker    --app X [--queue Q] [--burst] [--simple] [--name N]
                        [--sweep-interval S] [--sweep-grace S]
    pipelines advance   --app X --due        # cron: advance every due job (I7)
    pipelines advance   --app X JOB          # advance one job now
    pipelines status    --app X JOB [--json]
    pipelines log       --app X JOB
    pipelines transcript --app X JOB [--pretty]
    pipelines retry     --app X JOB [--full]
    pipelines cancel    --app X JOB [--wait S] [--force]
    pipelines jobs      --app X [--status running] [--limit N] [--version] [--before CURSOR] [--count]
    pipelines reindex   --app X              # put jobs stored before the listing indexes into them
    pipelines pause | resume --app X JOB
    pipelines approve   --app X JOB CALL
    pipelines reject    --app X JOB CALL --reason "..."
    pipelines tail      --app X JOB [--follow] [--after EVENT_ID]
    pipelines fork      --app X JOB --at-turn N --new-id ID [--run]
    pipelines delete    --app X JOB
    pipelines gc        --app X [--older-than S] [--scan]
    pipelines ui        --app X [--host 127.0.0.1] [--port 8008] [--token-file F] [--read-only]
    pipelines dev       --app X [--db .phaserunner/dev.db] [--workers 4] [--port 8008]  # one process, SQLite
    pipelines migrate   --app X              # upgrade the schema of the app's SQLite file

Exit codes: 0 success, 1 an error explained on stderr in one line as ``error: ...``
with the fix when there is one (unknown job, bad app path, Redis unreachable, ...),
2 bad command-line usage, 141 the reader of the output went away (``| head``).

The worker is an RQ worker that also sweeps: every ``--sweep-interval``
seconds (default 2; 0 disables) a background thread re-enqueues the jobs that
have been due for ``--sweep-grace`` seconds (default 5) and are not leased
(a lost message, a dead worker's turn). So when a whole worker dies
mid-phase, another worker finishes the job once the lease expires, without
cron and without waiting for RQ's own cleanup (~11 minutes): with the default
10 s lease (renewed every third of it), the turn runs again ~7-12 s after
the kill. The grace is shorter than any lease a kill leaves behind, so it
never delays that; it keeps the sweep off a message that is merely waiting. The sweep only
enqueues; the advance runs in a work-horse as usual (running it in the
parent's thread deadlocked horses forked mid-import). ``pipelines advance
--due`` from cron advances due jobs in its own process, for when no worker
is running. What a worker runs is fixed when it starts (its ``--app`` and
its one entry point), and its horse and scheduler child end with it: see
:mod:`pipelines.worker`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from adapters.base import page_cursor, parse_cursor
from pipelines import cli_actions, cli_agent, cli_dev, health
from pipelines.app import App, tags_of
from pipelines.cli_args import count, non_negative, port, printable
from pipelines.cli_errors import closed_pipe, error_line
from pipelines.engine.control import load_job
from pipelines.engine.errors import ConfigurationError, JobNotFoundError, PipelineError
from pipelines.engine.models import JobRecord, JobStatus, Message, validate_job_id
from pipelines.engine.runner import AdvanceResult
from pipelines.worker import ADVANCE_FUNC, APP_ENV, load_app, use_app

if TYPE_CHECKING:
    from adapters.rq import RQScheduler

__all__ = ["build_parser", "main"]

logger = logging.getLogger("pipelines")


# --- helpers ------------------------------------------------------------------
def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _load(path: str | None) -> App:
    path = path or os.environ.get(APP_ENV)
    if not path:
        raise ConfigurationError(f"no app given: pass --app package.module:app or set {APP_ENV}")
    # The console script does not put the working directory on sys.path
    # (python -m does); an app module next to the user must still import.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_app(path)
    except PipelineError:
        raise
    except Exception as exc:  # the user's module failed at import: say so, without a traceback
        raise ConfigurationError(f"cannot load app {path!r}: {type(exc).__name__}: {exc}") from exc


def _record(app: App, job_id: str) -> JobRecord:
    return load_job(app.storage, job_id)


def _rq_scheduler(app: App) -> RQScheduler:
    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler

    if not isinstance(app.scheduler, RQScheduler):
        raise ConfigurationError(
            f"`pipelines worker` needs an app whose scheduler is adapters.rq.RQScheduler, "
            f"not {type(app.scheduler).__name__}"
        )
    if isinstance(app.storage, RedisStorage) and app.scheduler.namespace != app.storage.prefix:
        # Two apps on one Redis would otherwise overwrite each other's queue messages.
        raise ConfigurationError(
            f"the RQ scheduler's namespace {app.scheduler.namespace!r} differs from the storage prefix "
            f"{app.storage.prefix!r}; build it with RQScheduler.for_storage(storage, ...)")
    return app.scheduler


# --- commands -----------------------------------------------------------------
def _warm_up(app: App) -> Callable[[], object] | None:
    """What imports and warms litellm before the worker's first take (None: no agent needs it).

    It runs to the end before the worker asks RQ for a job (adapters.rq_priority), never beside one:
    a job taken while litellm still loads (~4 s, 10 s and more on a busy 2-core host) holds the
    job's lease through the import, and a worker that dies meanwhile costs the job a whole lease.
    When litellm loaded on a thread after the first take, workers restarted every few seconds
    (make chaos) advanced no job at all. Forked work-horses inherit the loaded module.
    """
    if not any(agent.uses_litellm for agent in app.agents.values()):
        return None  # no agent calls litellm: forking a process that imported it would only cost
    try:
        module = importlib.import_module("phases.litellm_model")
    except ImportError:
        return None
    warm = getattr(module, "warm", None)
    return warm if callable(warm) else None


def _sweeper(app: App, interval: float, grace: float, stop: threading.Event) -> threading.Thread:
    def sweep() -> None:
        try:
            requeued = app.requeue_overdue(grace=grace)
        except Exception:  # Redis down for a moment must not end the sweep for good
            logger.warning("sweep failed; trying again in %.1fs", interval, exc_info=True)
            return
        if requeued:
            logger.warning("sweep: re-enqueued %d overdue job(s): %s", len(requeued), ", ".join(requeued[:10]))

    def loop() -> None:
        while not stop.wait(interval):
            sweep()

    # One sweep in the main thread first: its lazy imports happen now, not in
    # the thread while the worker forks.
    sweep()
    thread = threading.Thread(target=loop, name="pipelines-sweep", daemon=True)
    thread.start()
    return thread


def cmd_worker(args: argparse.Namespace, out: TextIO) -> int:
    from rq import Queue
    from rq.serializers import JSONSerializer

    from adapters.rq_entry import entry_point_job
    from adapters.rq_priority import PrioritySimpleWorker, PriorityWorker

    app = _load(args.app)
    scheduler = _rq_scheduler(app)
    use_app(app, path=args.app or os.environ.get(APP_ENV))
    # Interactive first, then background (a share of takes keeps it from starving: adapters.rq_priority).
    names = [args.queue] if args.queue else scheduler.queue_names
    queues = [Queue(name, connection=scheduler.connection, serializer=JSONSerializer) for name in names]
    worker_class = PrioritySimpleWorker if args.simple else PriorityWorker
    # The worker runs its entry point and nothing else a message names (pipelines.worker's docstring).
    worker = worker_class(queues, connection=scheduler.connection, name=args.name, serializer=JSONSerializer,
                          job_class=entry_point_job(ADVANCE_FUNC))
    worker.background_every = args.background_every
    worker.warm_up = _warm_up(app)
    stop = threading.Event()
    if args.sweep_interval > 0:
        _sweeper(app, args.sweep_interval, args.sweep_grace, stop)
    try:
        worker.work(burst=args.burst, with_scheduler=True, logging_level=args.log_level)
    finally:
        stop.set()
    return 0


def cmd_advance(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    if args.due == bool(args.job):
        raise ConfigurationError("give either --due or one JOB id")
    if args.due:
        for job_id, result in app.advance_due(grace=args.grace, limit=args.limit):
            print(f"{job_id} {result.value}", file=out)
        return 0
    result = app.advance(validate_job_id(args.job))
    if result is AdvanceResult.UNKNOWN:
        raise JobNotFoundError(f"job {args.job!r} not found")
    print(f"{args.job} {result.value}", file=out)
    return 0


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    rec = _record(app, args.job)
    if args.json:
        print(rec.model_dump_json(indent=2), file=out)
        return 0
    cp = rec.checkpoint
    rows: list[tuple[str, Any]] = [
        ("job", rec.job_id), ("pipeline", rec.pipeline), ("status", rec.status.value), ("version", rec.version),
    ]
    if cp is not None:
        rows += [("phase", cp.next_phase), ("attempt", cp.attempt), ("due", _when(cp.due_at))]
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
    owner = app.storage.lease_owner(rec.job_id)
    if owner is not None:
        rows.append(("lease", f"held by {owner}"))
    rows += [("created", _when(rec.created_at)), ("updated", _when(rec.updated_at))]
    for key, value in rows:
        print(f"{key + ':':<13}{printable(str(value))}", file=out)  # a title or an error may quote the model
    return 0


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


def _family_columns(rec: JobRecord) -> str:
    """Extra listing columns, only for jobs in a parent/child family (other lines stay as they were)."""
    parts = [f"parent={rec.parent_job}"] if rec.parent_job is not None else []
    parts += [f"children={len(rec.children)}"] if rec.children else []
    return "".join(f"\t{p}" for p in parts)


def cmd_log(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    _record(app, args.job)
    for e in app.storage.logs(args.job):
        print(printable(f"{_when(e.timestamp)}  {e.level:<5}  {e.phase or '-'}  {e.message}"), file=out)
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
    app = _load(args.app)
    _record(app, args.job)
    for i, m in enumerate(app.storage.messages(args.job)):
        print(_pretty(i, m) if args.pretty else json.dumps(m, ensure_ascii=False), file=out)
    return 0


def cmd_retry(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    rec = app.retry(args.job, mode="full" if args.full else "resume").record
    phase = rec.checkpoint.next_phase if rec.checkpoint else "-"
    print(f"{rec.job_id}: retried ({'full' if args.full else 'resume'}) at phase {phase!r}, "
          f"status {rec.status.value}", file=out)
    return 0


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    view = app.cancel(args.job, wait=args.wait, force=args.force)
    if view.control == "cancel":
        print(f"{view.job_id}: cancel requested; it takes effect when the turn in flight commits", file=out)
        return 0
    rec = view.record
    kept = f", checkpoint kept at phase {rec.checkpoint.next_phase!r}" if rec.checkpoint else ""
    print(f"{rec.job_id}: cancelled{kept}", file=out)
    return 0


def cmd_jobs(args: argparse.Namespace, out: TextIO) -> int:
    app = _load(args.app)
    status = JobStatus(args.status) if args.status else None
    if getattr(args, "count", False):
        return _print_counts(app, status, out)
    # Storage skips a record it cannot read and logs it by id: say so on stderr, list the rest.
    handler = logging.StreamHandler(getattr(args, "err", None) or sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    logger.addHandler(handler)
    try:
        records = _listing(app, status, args)
    finally:
        logger.removeHandler(handler)
    if getattr(args, "by_version", False):
        return _print_versions(records, out)
    for r in records:
        phase = r.checkpoint.next_phase if r.checkpoint else "-"
        tags = ",".join(tags_of(r)) or "-"
        print(f"{r.job_id}\t{r.status.value}\t{r.pipeline}\t{phase}\tv{r.version}\t{_when(r.updated_at)}\t{tags}"
              f"{_family_columns(r)}", file=out)
    return 0


def _listing(app: App, status: JobStatus | None, args: argparse.Namespace) -> list[JobRecord]:
    """The listed records (oldest first); a full page names, on stderr, the cursor of the next (older) one."""
    before = getattr(args, "before", None)
    if before is None:
        records = [v.record for v in app.jobs(status=status, tags=args.tag or (), limit=args.limit)]
    else:  # the page after the cursor (storage lists newest first), then the same tag filter and order
        parse_cursor(before)
        wanted = set(args.tag or ())
        page = app.storage.list_jobs(status=status, limit=args.limit, before=before)
        records = sorted((r for r in page if wanted <= set(tags_of(r))), key=lambda r: (r.created_at, r.job_id))
    if records and len(records) >= args.limit and app.has_listing_index:
        last = min(records, key=lambda r: (r.updated_at, r.job_id))  # the listing's last: where the next goes on
        print(f"more: pipelines jobs --before {page_cursor(last)}", file=getattr(args, "err", None) or sys.stderr)
    return records


def _print_counts(app: App, status: JobStatus | None, out: TextIO) -> int:
    """Jobs per status, from the storage's listing index (no record is read)."""
    if not app.has_listing_index:
        raise ConfigurationError(f"{type(app.storage).__name__} cannot count jobs (no listing index); "
                                 "use `pipelines jobs`")
    for s in [status] if status else list(JobStatus):
        print(f"{s.value}\t{app.count_jobs(status=s)}", file=out)
    if status is None:
        print(f"all\t{app.count_jobs()}", file=out)
    return 0


def cmd_reindex(args: argparse.Namespace, out: TextIO) -> int:
    """Put jobs stored before the listing indexes existed into them (safe while workers run)."""
    print(f"indexed {_load(args.app).reindex()} jobs", file=out)
    return 0


def _print_versions(records: list[JobRecord], out: TextIO) -> int:
    """What runs on which code version: one line per pipeline and version, with its jobs per status."""
    counts: dict[tuple[str, str], Counter[str]] = {}
    for r in records:
        counts.setdefault((r.pipeline, r.code_version or "-"), Counter())[r.status.value] += 1
    for (pipeline, version), by_status in sorted(counts.items()):
        summary = " ".join(f"{s}={n}" for s, n in sorted(by_status.items()))
        print(f"{pipeline}\t{version}\t{sum(by_status.values())}\t{summary}", file=out)
    return 0


def cmd_ui(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the web page (pipelines.web.ui); a non-loopback host needs a token."""
    try:
        import uvicorn

        from pipelines.web.ui import check_bind, ui_app
    except ImportError as exc:
        raise ConfigurationError(f"the web page needs the web extra: pip install 'phaserunner[web]' ({exc})") from exc
    token = cli_dev.ui_token(args)
    check_bind(args.host, token)  # before loading anything: an unsafe address is refused at once
    asgi = ui_app(_load(args.app), token=token, read_only=args.read_only)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"serving the web page on http://{host}:{args.port}/{' (read-only)' if args.read_only else ''}",
          file=out, flush=True)
    uvicorn.run(asgi, host=args.host, port=args.port, log_level="warning")
    return 0


# --- parser -------------------------------------------------------------------
def _positive_or_zero(text: str) -> float:
    """A finite number of seconds >= 0 (``inf`` and ``nan`` are refused here, not deep inside)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _positive(text: str) -> float:
    """A finite number of seconds > 0."""
    value = _positive_or_zero(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pipelines`` (exposed for docs and tests)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--app", help=f"the App to use, as package.module:app (default: ${APP_ENV})")
    parser = argparse.ArgumentParser(prog="pipelines", description="Durable, checkpointed pipelines on Redis + RQ.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable[[argparse.Namespace, TextIO], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(func=fn)
        return p

    p = add("worker", cmd_worker, "run an RQ worker (with RQ's scheduler and a due-job sweep)")
    p.add_argument("--queue", help="queue to listen on (default: the app scheduler's queue)")
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    p.add_argument("--simple", action="store_true", help="run jobs in this process (SimpleWorker), no fork")
    p.add_argument("--name", help="worker name (default: generated by RQ)")
    p.add_argument("--sweep-interval", type=_positive_or_zero, default=2.0,
                   help="seconds between sweeps of overdue jobs; 0 disables (default: 2)")
    p.add_argument("--sweep-grace", type=_positive_or_zero, default=5.0,
                   help="only sweep jobs due for at least this many seconds (default: 5)")
    p.add_argument("--log-level", default="INFO", help="RQ's logging level (default: INFO)")
    p.add_argument("--background-every", type=non_negative, default=5,
                   help="under sustained interactive load, take background work at least once in this many "
                        "takes (default: 5; 0 = only when no interactive work waits)")

    p = add("advance", cmd_advance, "advance one job, or every due job (--due, for cron)")
    p.add_argument("job", nargs="?", help="the job id (omit with --due)")
    p.add_argument("--due", action="store_true", help="advance every running job that is due and not leased")
    p.add_argument("--grace", type=_positive_or_zero, default=0.0, help="with --due: only jobs due this long")
    p.add_argument("--limit", type=count, default=1000, help="with --due: at most this many jobs (default: 1000)")

    p = add("status", cmd_status, "show a job's status, phase, error and result")
    p.add_argument("job")
    p.add_argument("--json", action="store_true", help="print the whole record as JSON")

    p = add("log", cmd_log, "print a job's log")
    p.add_argument("job")

    p = add("transcript", cmd_transcript, "print a job's messages, one JSON object per line")
    p.add_argument("job")
    p.add_argument("--pretty", action="store_true", help="human-readable instead of JSON lines")

    p = add("retry", cmd_retry, "retry a failed or cancelled job (resume from its checkpoint)")
    p.add_argument("job")
    p.add_argument("--full", action="store_true", help="restart from the first phase and the initial state")

    p = add("cancel", cmd_cancel, "cancel a job at its next turn boundary, keeping its checkpoint")
    p.add_argument("job")
    p.add_argument("--wait", type=_positive_or_zero, default=30.0,
                   help="seconds to wait for a turn in flight (default: 30)")
    p.add_argument("--force", action="store_true", help="do not wait: a turn in flight is fenced off and discarded")

    p = add("jobs", cmd_jobs, "list jobs: id, status, pipeline, phase, version, updated, tags")
    p.add_argument("--tag", action="append", help="only jobs with this tag (repeat: all of them)")
    p.add_argument("--status", choices=[s.value for s in JobStatus], help="only jobs in this status")
    p.add_argument("--limit", type=count, default=1000, help="at most this many (default: 1000)")
    p.add_argument("--version", dest="by_version", action="store_true",
                   help="what runs on which code version: pipeline, version, jobs, jobs per status")
    p.add_argument("--before", metavar="CURSOR", help="the next page: the cursor a full page printed on stderr")
    p.add_argument("--count", action="store_true", help="only count jobs per status (from the listing index)")
    add("reindex", cmd_reindex, "put jobs stored before the listing indexes existed into them (safe while running)")
    p = add("ui", cmd_ui, "serve the web page to watch and steer runs (needs phaserunner[web])")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; others need a token)")
    p.add_argument("--port", type=port, default=8008, help="port, 1-65535 (default: 8008)")
    cli_dev.add_token_options(p)
    p.add_argument("--read-only", action="store_true", help="show runs, refuse every action")
    cli_actions.register(add, _load, _when, _positive_or_zero, _positive)
    health.register(add, _load, _positive_or_zero)
    cli_agent.register(add, _load, _positive_or_zero)
    cli_dev.register(add, _load)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the ``pipelines`` command; returns the exit code (see the module docstring)."""
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    app_path = getattr(args, "app", None) or os.environ.get(APP_ENV)
    try:
        args.err = err
        code: int = args.func(args, out)
        out.flush()  # a reader that went away shows here, not in the flush at exit
    except PipelineError as exc:
        print(error_line(exc, app_path), file=err)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `pipelines jobs | head -1`: the reader has what it wanted
        return closed_pipe(out)
    except Exception as exc:
        # Backend errors that escaped an adapter (a Redis connection refused
        # while RQ starts a worker) are still the user's to fix, not a bug.
        if type(exc).__module__.split(".")[0] in ("redis", "rq"):
            print(error_line(exc, app_path), file=err)
            return 1
        raise
    return code
