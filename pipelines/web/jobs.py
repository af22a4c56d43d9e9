"""The jobs page: counts by status (running split into in flight, queued, scheduled, worker lost), a search
(:mod:`pipelines.web.find`), pages by cursor, and a live refresh that updates rows in place."""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from pipelines.app import App, tags_of
from pipelines.engine.models import JobRecord, JobStatus
from pipelines.errors import InvalidInputError
from pipelines.web import find, work
from pipelines.web.core import UI, is_count

__all__ = ["COUNT_LIMIT", "PAGE_SIZE", "jobs_page", "row", "rows"]

PAGE_SIZE = 50
COUNT_LIMIT = 10_000
"""Records read to count jobs by status (storage has no status counter): past it the page says "at least"."""
BACK_LIMIT = 8  # cursors of earlier pages a link carries, so "previous" reads one page, not the pages before it


def query_int(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name) or str(default)
    if not is_count(raw) or int(raw) < 1:
        raise InvalidInputError(f"{name} must be a whole number >= 1, got {raw[:40]!r}")
    return int(raw)


def _query(request: Request) -> find.Query:
    params = request.query_params
    raw = params.get("status") or ""
    if raw and raw not in {s.value for s in JobStatus}:
        raise InvalidInputError(f"unknown status {raw[:40]!r}; one of {', '.join(s.value for s in JobStatus)}")
    return find.Query(status=JobStatus(raw) if raw else None, name=find.check_text(params.get("name", ""), "name"),
                      q=find.check_text(params.get("q", ""), "the job id searched"),
                      tag=find.check_text(params.get("tag", ""), "tag"),
                      since=find.parse_time(params.get("since", ""), "since"),
                      until=find.parse_time(params.get("until", ""), "until"))


def jobs_page(ui: UI, request: Request) -> Response:
    params = request.query_params
    query, page = _query(request), query_int(request, "page", 1)
    if params.get("partial"):  # the table's live refresh: the rows shown, in place
        return _refresh(ui, request, query)
    before = params.get("before") or None
    back = [c for c in params.get("back", "").split(",") if c][-BACK_LIMIT:]
    if before is None and page > 1:  # an old offset link: read down to it once, then go on by cursor
        found = _offset(ui.app, query, page)
    else:
        found = find.find(ui.app, query, size=PAGE_SIZE, before=before)
    counts, capped = _counts(ui.app)
    split = work.split_running(ui.app)
    args = {k: v for k, v in params.items() if k in ("status", "name", "q", "tag", "since", "until") and v}
    link = functools.partial(_link, args)
    prev = None
    if page > 1:
        # Past the cursors kept (BACK_LIMIT), the page before by its number: read down to once (_offset).
        prev = link(page - 1, back[-1] if back[-1] != "-" else None, back[:-1]) if back else link(page - 1)
    nxt = link(page + 1, found.next, [*back, before or "-"]) if found.next else None
    return ui.render(request, "jobs.html", rows=rows(ui.app, found.rows), counts=counts, capped=capped,
                     split=split.counts, split_capped=split.capped, page=page, prev=prev, next=nxt,
                     statuses=[s.value for s in JobStatus], names=ui.app.names, status=args.get("status", ""),
                     name=query.name, q=query.q, tag=query.tag, since=params.get("since", ""),
                     until=params.get("until", ""), scanned=found.scanned, searched_to=found.searched_to,
                     loaded=ui.app.scheduler.now())


def _refresh(ui: UI, request: Request, query: find.Query) -> Response:
    ids = [i for i in request.query_params.get("ids", "").split(",") if i]
    raw = request.query_params.get("loaded", "")
    try:
        loaded = float(raw) if raw else None
    except ValueError:
        raise InvalidInputError(f"loaded must be a time in seconds, got {raw[:40]!r}") from None
    records, newer = find.refresh(ui.app, ids, loaded, query)
    return ui.render(request, "jobs_rows.html", rows=rows(ui.app, records), newer=newer)


def _link(args: dict[str, str], page: int, cursor: str | None = None, back: list[str] | None = None) -> str:
    extra = {"before": cursor} if cursor else {}
    if back:
        extra["back"] = ",".join(back[-BACK_LIMIT:])
    return "?" + urlencode({**args, "page": page, **extra})


def _offset(app: App, query: find.Query, page: int) -> find.Found:
    """Page ``page`` of an offset link (no cursor): the pages before it are read once, a page at a time."""
    cursor: str | None = None
    for _ in range(page - 1):
        skipped = find.find(app, query, size=PAGE_SIZE, before=cursor)
        if skipped.next is None:
            return find.Found()
        cursor = skipped.next
    return find.find(app, query, size=PAGE_SIZE, before=cursor)


def _counts(app: App) -> tuple[dict[str, int], bool]:
    if app.has_listing_index:  # a storage with a status index answers without reading records
        return {s.value: int(app.count_jobs(status=s) or 0) for s in JobStatus}, False
    records = app.storage.list_jobs(limit=COUNT_LIMIT)
    counts = {s.value: 0 for s in JobStatus}
    for r in records:
        counts[r.status.value] += 1
    return counts, len(records) >= COUNT_LIMIT


def rows(app: App, records: list[JobRecord]) -> list[dict[str, Any]]:
    now = app.scheduler.now()
    return [row(r, work.place(app, r, now)) for r in records]


def row(r: JobRecord, where: str | None = None) -> dict[str, Any]:
    """A job as a row of the table; ``where``: a running job's place (:mod:`pipelines.web.work`)."""
    return {"id": r.job_id, "status": r.status.value, "place": where or "", "pipeline": r.pipeline,
            "turns": r.phases_done, "updated": r.updated_at, "tokens": r.usage.total_tokens, "cost": r.usage.cost_usd,
            "tags": tags_of(r), "error": r.error or ""}
