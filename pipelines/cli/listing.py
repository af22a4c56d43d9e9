"""``pipelines jobs`` (the listing, by cursor; counts; versions), ``reindex``, ``upgrade-records``, ``prune-functions``.

Registered by :func:`pipelines.cli.build_parser`; see that module for the
common ``--app`` option and exit codes.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from typing import TextIO

from pipelines.app import App, page_cursor, parse_cursor, tags_of
from pipelines.cli import loading
from pipelines.cli.args import printable
from pipelines.cli.loading import when
from pipelines.cli.runs import family_columns
from pipelines.engine.models import JobRecord, JobStatus
from pipelines.errors import ConfigurationError
from pipelines.worker import prune_functions, upgrade_records

__all__ = ["cmd_jobs", "cmd_prune_functions", "cmd_reindex", "cmd_upgrade_records"]

logger = logging.getLogger("pipelines")


def cmd_jobs(args: argparse.Namespace, out: TextIO) -> int:
    app = loading.load(args.app)
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
        # Tags, names and versions are text a caller chose: no control character of theirs reaches the terminal.
        print(printable(f"{r.job_id}\t{r.status.value}\t{r.pipeline}\t{phase}\tv{r.version}\t{when(r.updated_at)}"
                        f"\t{tags}{family_columns(r)}"), file=out)
    return 0


def _listing(app: App, status: JobStatus | None, args: argparse.Namespace) -> list[JobRecord]:
    """The listed records (oldest first); a full page names, on stderr, the cursor of the next (older) one."""
    before = getattr(args, "before", None)
    if before is None:
        records = [v.record for v in app.jobs(status=status, tags=args.tag or (), limit=args.limit)]
    else:  # the page after the cursor (storage lists newest first), then the same tag filter and order
        parse_cursor(before)
        wanted = set(args.tag or ())
        page = app.read.list_page(status=status, limit=args.limit, before=before)
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
    print(f"indexed {loading.load(args.app).reindex()} jobs", file=out)
    return 0


def cmd_upgrade_records(args: argparse.Namespace, out: TextIO) -> int:
    """Move the app's Redis prefix to the newest record format (adapters.redis.record_format): step 2 of 2."""
    prefix, moved = upgrade_records(loading.load(args.app))
    print(f"prefix {prefix!r}: " + ("records are written as a compact delta of a base, and events compact "
          "(format 3), by processes started from now on" if moved else "already in record format 3"), file=out)
    return 0


def cmd_prune_functions(args: argparse.Namespace, out: TextIO) -> int:
    """Delete other versions' function libraries from the app's Redis (adapters.redis.library.prune)."""
    keep, gone = prune_functions(loading.load(args.app))
    if gone is None:
        print("nothing to delete: this Redis server has no functions (the scripts run by EVALSHA)", file=out)
        return 0
    for name in gone:
        print(f"deleted {name} (another version's: a process of it still running loads it again)", file=out)
    print(f"kept {keep} (this version's)" if gone else f"nothing to delete: no library but this version's ({keep})",
          file=out)
    return 0


def _print_versions(records: list[JobRecord], out: TextIO) -> int:
    """What runs on which code version: one line per pipeline and version, with its jobs per status."""
    counts: dict[tuple[str, str], Counter[str]] = {}
    for r in records:
        counts.setdefault((r.pipeline, r.code_version or "-"), Counter())[r.status.value] += 1
    for (pipeline, version), by_status in sorted(counts.items()):
        summary = " ".join(f"{s}={n}" for s, n in sorted(by_status.items()))
        print(printable(f"{pipeline}\t{version}\t{sum(by_status.values())}\t{summary}"), file=out)
    return 0

