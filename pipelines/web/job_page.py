"""One job's page, paged so a long job stays usable: what it reads and how the live refresh patches it.

* The conversation shows :data:`MESSAGES_PAGE` messages, the latest by
  default, with a link to the ones before (``?upto=n``: messages before n).
* Events are shown newest first, :data:`EVENTS_PAGE` at a time
  (``?events_before=<event id>``), and the log's latest lines likewise
  (``?logs_skip=n``); both are read from the end of the job's history where
  the storage can (``Feature.RECENT``), so a page costs a page.
* The timeline shows the latest :data:`TIMELINE_TURNS` turns of the latest
  :data:`TIMELINE_EVENTS` events.
* The live refresh (``/jobs/<id>/live?from=n&logs_seen=k&events_seen=id``)
  sends the parts of the page that change (status, approvals, actions,
  timeline; ledger, usage, state) and, of the conversation, the log and the
  events, only what came after what the page shows: a 1,200-message
  conversation is not sent again after each event. A transcript cut back (a
  full retry) makes the page reload.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from starlette.requests import Request

from pipelines.app.open_turn import pending_reply, tool_ledger
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry
from pipelines.errors import InvalidInputError, JobNotFoundError
from pipelines.web import work
from pipelines.web.core import UI, is_count, pretty_json
from pipelines.web.jobs import row
from pipelines.web.timeline import timeline

__all__ = ["EVENTS_PAGE", "LOGS_PAGE", "MESSAGES_PAGE", "TIMELINE_EVENTS", "TIMELINE_TURNS", "context"]

MESSAGES_PAGE = 100
EVENTS_PAGE = 100
LOGS_PAGE = 100
TIMELINE_EVENTS = 300  # the latest events the timeline is drawn from
TIMELINE_TURNS = 40  # rows of the timeline at most: the latest turns


def _number(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name, "")
    if not raw:
        return None
    if not is_count(raw):
        raise InvalidInputError(f"{name} must be a whole number >= 0, got {raw[:40]!r}")
    return int(raw)


def context(ui: UI, request: Request, *, live: bool = False) -> dict[str, Any]:
    """What ``job.html`` (or, with ``live``, ``job_live.html``) renders for the request's job."""
    job_id = request.path_params["job_id"]
    view = ui.app.get(job_id)
    if view is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    rec = view.record
    total = rec.transcript_len
    if live:  # only what the page does not show yet
        shown = _number(request, "from")
        # Cut back and grown again meanwhile (a retry from the start, by another operator): the page's last
        # message is no longer the transcript's at that place, and what follows it would be another run's.
        tail = request.query_params.get("tail") or None
        moved = shown is not None and 0 < shown <= total and tail is not None and tail != _tail(
            ui.app.messages(job_id, shown - 1, shown))
        # More than a page behind (a tab left open while a fast job ran on, or ``from=0``): the page reloads and
        # shows the latest page, rather than one response carrying the whole transcript.
        reset = shown is not None and (shown > total or moved or total - shown > MESSAGES_PAGE)
        start, stop = (total if shown is None or reset else shown), total
        window_start = _number(request, "first") or 0  # the first message the page shows
    else:
        upto = _number(request, "upto")
        stop = total if upto is None else min(upto, total)
        start, reset = max(0, stop - MESSAGES_PAGE), False
        window_start = start
    messages = ui.app.messages(job_id, start, stop) if stop > start else []
    events_before = request.query_params.get("events_before") or None
    logs_skip = _number(request, "logs_skip") or 0
    if live:  # the log and the events are patched too: only what came after what the page shows
        events: list[Event] = []
        logs: list[LogEntry] = []
        new_logs, logs_total = _new_logs(ui, request, job_id)
        new_events = _new_events(ui, request, job_id)
    else:
        events = ui.app.read.recent_events(job_id, before=events_before, limit=EVENTS_PAGE)
        logs, logs_total = ui.app.read.recent_logs(job_id, skip=logs_skip, limit=LOGS_PAGE)
        new_logs = new_events = None
    turns = timeline(ui.app.read.recent_events(job_id, limit=TIMELINE_EVENTS)[::-1])
    state = None if rec.checkpoint is None else rec.checkpoint.state
    place = work.place(ui.app, rec)
    return {"job": row(rec, place), "rec": rec, "view": view, "place": place or "",
            "messages": _conversation(messages, start), "start": start, "stop": stop, "total": total,
            "reset": reset, "follows": stop == total, "page_size": MESSAGES_PAGE, "window_start": window_start,
            "tail": _tail(messages[-1:]) if messages else request.query_params.get("tail", ""),
            "events": events, "older_events": events[-1].id if len(events) == EVENTS_PAGE else None,
            "events_paged": events_before is not None,
            "logs": logs[::-1], "logs_skip": logs_skip, "logs_total": logs_total, "logs_page": LOGS_PAGE,
            "new_logs": new_logs, "new_events": new_events,
            "turns": turns[-TIMELINE_TURNS:], "state": state, "ledger": tool_ledger(rec),
            "pending": list(view.pending_calls),
            "finished": view.finished, "actions": _actions(rec),
            "pending_reply": _pending_reply(rec, view.pending_calls), "is_agent": rec.pipeline in ui.app.agents}


def _new_logs(ui: UI, request: Request, job_id: str) -> tuple[list[LogEntry] | None, int]:
    """The log lines after the ``logs_seen`` the page shows (newest first); ``None`` when it does not follow."""
    seen = _number(request, "logs_seen")
    if seen is None:
        return None, 0
    _, total = ui.app.read.recent_logs(job_id, limit=0)
    if total <= seen:
        return [], total
    fresh, total = ui.app.read.recent_logs(job_id, limit=min(LOGS_PAGE, total - seen))
    return fresh[::-1], total


def _new_events(ui: UI, request: Request, job_id: str) -> list[Event] | None:
    """The events after ``events_seen`` (newest first; "": the page shows none yet); ``None``: not asked."""
    if "events_seen" not in request.query_params:
        return None
    seen = request.query_params["events_seen"] or None
    if seen is None:
        return ui.app.read.recent_events(job_id, limit=EVENTS_PAGE)
    return ui.app.read.events(job_id, after=seen, limit=EVENTS_PAGE)[::-1]


def _pending_reply(rec: JobRecord, pending: object) -> dict[str, Any] | None:
    """The model's reply of the open turn while its calls wait for approval: shown, labelled, not yet committed."""
    message = pending_reply(rec) if pending else None
    return None if message is None else _conversation([message], rec.transcript_len)[0]


def _conversation(messages: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages, start):
        content = m.get("content")
        text = content if isinstance(content, str) else ("" if content is None else pretty_json(content))
        calls = [{"id": c.get("id", ""), "name": (c.get("function") or {}).get("name", "?"),
                  "arguments": (c.get("function") or {}).get("arguments", "")}
                 for c in m.get("tool_calls") or [] if isinstance(c, dict)]
        out.append({"n": i, "role": str(m.get("role", "?")), "text": text, "calls": calls,
                    "call_id": m.get("tool_call_id"), "name": m.get("name")})
    return out


def _actions(rec: JobRecord) -> list[str]:
    s = rec.status
    return [a for a, ok in (("pause", s is JobStatus.RUNNING), ("resume", s is JobStatus.PAUSED),
                            ("cancel", s in (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)),
                            ("retry", s in (JobStatus.ERROR, JobStatus.CANCELLED))) if ok]


def _tail(last: list[Any]) -> str:
    """A short digest of the page's last message (``[]``: none), which a later refresh checks is still there."""
    return hashlib.sha256(json.dumps(last[-1], sort_keys=True).encode()).hexdigest()[:16] if last else ""
