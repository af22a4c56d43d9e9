"""Finding runs for the jobs page: a search by id substring, tag, pipeline, status and time range.

Built on the listing every storage has (``list_jobs``: newest ``updated_at``
first, paged by :func:`~pipelines.app.read_model.page_cursor`), never on an index a
storage may lack. The listing is read in batches from a cursor and filtered
here; a request reads at most :data:`SCAN_LIMIT` records, so its cost follows
the page asked for, not the number of jobs stored. Where the budget runs out
before a page is full the page says how far it searched and its "next" link
goes on from there. The time range is on ``updated_at``, the listing's own
order: ``until`` is where the read starts, ``since`` where it stops.

The same module answers the table's live refresh (:func:`refresh`): the rows
a person is looking at, by id, in the order shown (rows never jump), and how
many jobs changed since the page was loaded.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from pipelines.app import App, page_cursor, parse_cursor, tags_of
from pipelines.engine.models import JobRecord, JobStatus, validate_job_id
from pipelines.errors import InvalidInputError

__all__ = ["BATCH", "SCAN_LIMIT", "Found", "Query", "find", "parse_time", "refresh"]

SCAN_LIMIT = 5000
"""Records one request reads at most while filtering (a search past it goes on from the next link)."""
BATCH = 250  # records per list_jobs call while scanning
MAX_IDS = 200  # rows a live refresh may ask for
NEWER_SCAN = 50  # the newest records a refresh reads to count what changed since the page loaded
MAX_TEXT = 200


@dataclass(frozen=True)
class Query:
    """What the person asked for; empty strings and ``None`` mean "any"."""

    status: JobStatus | None = None
    name: str = ""
    q: str = ""  # a substring of the job id
    tag: str = ""
    since: float | None = None
    until: float | None = None

    @property
    def narrows(self) -> bool:
        """Whether rows are filtered here (beyond the status the storage's own index answers)."""
        return bool(self.name or self.q or self.tag or self.since is not None or self.until is not None)

    def matches(self, r: JobRecord) -> bool:
        return ((not self.name or r.pipeline == self.name) and (not self.q or self.q in r.job_id)
                and (not self.tag or self.tag in tags_of(r))
                and (self.since is None or r.updated_at >= self.since)
                and (self.until is None or r.updated_at <= self.until)
                and (self.status is None or r.status is self.status))


@dataclass
class Found:
    """One page: its rows, the cursor the next page starts from (``None``: no more), how many records were read."""

    rows: list[JobRecord] = field(default_factory=list)
    next: str | None = None
    scanned: int = 0
    searched_to: float | None = None  # set when the budget ran out: the listing was read down to this time


def parse_time(raw: str, what: str) -> float | None:
    """A time from the form (``2026-12-03T18:00``, read as UTC like every time on the page) in seconds."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(raw[:40])
    except ValueError:
        raise InvalidInputError(f"{what} must be a date and time like 2026-12-03T18:00 (UTC), "
                                f"got {raw[:40]!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def check_text(value: str, what: str) -> str:
    value = value.strip()
    if len(value) > MAX_TEXT:
        raise InvalidInputError(f"{what} is at most {MAX_TEXT} characters, got {len(value)}")
    return value


def find(app: App, query: Query, *, size: int, before: str | None = None, scan_limit: int = SCAN_LIMIT) -> Found:
    """Up to ``size`` jobs matching ``query``, newest ``updated_at`` first, from the cursor ``before``."""
    parse_cursor(before)  # a malformed cursor is a 400 naming it, whatever the storage
    found = Found()
    if query.q and _exact(query.q) and before is None:
        view = app.get(query.q)  # the whole id typed: one read, wherever the job is in the listing
        if view is not None and query.matches(view.record):
            found.rows.append(view.record)
            # Other ids holding it are on the next pages, which the search goes on to (and which leave this one out).
            found.next = _TOP
            return found
    cursor = before if before is not None else _start(query.until)
    if not query.narrows:  # the storage's listing is the answer: one read of one page
        records = app.storage.list_jobs(status=query.status, limit=size + 1, before=cursor)
        found.rows, found.scanned = records[:size], len(records)
        found.next = page_cursor(records[size - 1]) if len(records) > size else None
        return found
    return _scan(app, query, found, size=size, cursor=cursor, budget=scan_limit)


def _scan(app: App, query: Query, found: Found, *, size: int, cursor: str | None, budget: int) -> Found:
    before_shown = cursor is not None and bool(query.q) and _exact(query.q)  # the first page showed that job
    while found.scanned < budget:
        asked = min(BATCH, budget - found.scanned)
        batch = app.storage.list_jobs(status=query.status, limit=asked, before=cursor)
        for r in batch:
            found.scanned += 1
            cursor = page_cursor(r)
            if query.since is not None and r.updated_at < query.since:
                found.next = None  # older than the range: nothing further down can match
                return found
            if query.matches(r) and not (r.job_id == query.q and before_shown):
                found.rows.append(r)
                if len(found.rows) == size:
                    found.next = cursor
                    return found
        if len(batch) < asked:
            return found  # the listing ended
    if cursor is not None:  # the budget ran out: say how far, and let the next link go on
        found.next = cursor
        found.searched_to = parse_cursor(cursor)[0]  # type: ignore[index]
    return found


def _exact(q: str) -> bool:
    try:
        validate_job_id(q)
    except InvalidInputError:
        return False
    return True


_TOP: Final = f"{sys.float_info.max!r}/-"  # a cursor before every job: the whole listing after it


def _start(until: float | None) -> str | None:
    """A cursor just after ``until`` in a newest-first listing (every job updated at ``until`` still comes)."""
    if until is None:
        return None
    return f"{math.nextafter(until, math.inf)!r}/-"


def refresh(app: App, ids: list[str], loaded: float | None, query: Query) -> tuple[list[JobRecord], int]:
    """The live refresh: the records of ``ids`` (in that order, missing ones left out) and how many jobs
    matching ``query`` were updated after ``loaded`` (among the :data:`NEWER_SCAN` newest)."""
    if len(ids) > MAX_IDS:
        raise InvalidInputError(f"a refresh asks for at most {MAX_IDS} rows, got {len(ids)}")
    for job_id in ids:
        validate_job_id(job_id)
    newer = 0
    listed: dict[str, JobRecord] = {}
    if loaded is not None:
        shown = set(ids)
        recent = app.storage.list_jobs(status=query.status, limit=NEWER_SCAN)
        newer = sum(1 for r in recent if r.updated_at > loaded and r.job_id not in shown and query.matches(r))
        # Rows of the newest page come with that one read; a running job is read whole (its journal says
        # whether its worker was lost), and so is any row the listing did not hold.
        listed = {r.job_id: r for r in recent if r.status is not JobStatus.RUNNING}
    rows = [listed.get(i) or app.storage.get_job(i) for i in ids]
    return [r for r in rows if r is not None], newer
