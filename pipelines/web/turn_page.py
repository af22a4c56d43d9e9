"""One turn's model call, as it was: what was sent (in short) and what came back, with the turn's attempts.

The request is kept in short with the answer when the model is called
(:func:`phases.agent_turn.model_call.request_summary`: how many messages, the
tools offered, the parameters with secrets hidden) and committed in the turn's
``model_response`` event; the messages themselves are the transcript's, stored
once, so the page links to them instead of copying them. The answer is the
assistant message the turn committed, with its finish reason and usage; an
attempt fenced off after its model answered (another worker moved the job on)
shows what it was told, where the storage keeps it (``app.read.fenced_answers``).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pipelines.engine.models import Event
from pipelines.errors import InvalidInputError, JobNotFoundError
from pipelines.web.core import UI, is_count
from pipelines.web.timeline import timeline

__all__ = ["MAX_EVENTS_READ", "turn_page"]

MAX_EVENTS_READ = 50_000
"""Events read to find a turn's: past it the page says the turn was not found among them."""


def turn_page(ui: UI, request: Request) -> Response:
    """The page of turn ``n`` of job ``job_id`` (``/jobs/<job_id>/turns/<n>``)."""
    job_id, raw = request.path_params["job_id"], request.path_params["n"]
    if not is_count(raw):
        raise InvalidInputError(f"a turn is a whole number >= 1, got {raw[:40]!r}")
    n = int(raw)
    view = ui.app.get(job_id)
    if view is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    events = _events_through(ui, job_id, n)
    mine = [e for e in events if e.turn == n]
    committed = next((e for e in mine if e.type == "turn_committed"), None)
    if committed is None:
        return ui.render(request, "error.html", 404, message=f"job {job_id!r} has no committed turn {n}")
    answer = next((e for e in mine if e.type == "model_response"), None)
    data: dict[str, Any] = dict(answer.data) if answer is not None and isinstance(answer.data, dict) else {}
    span = committed.data.get("messages") if isinstance(committed.data, dict) else None
    first, stop = (int(span[0]), int(span[1])) if isinstance(span, list) and len(span) == 2 else (0, 0)
    messages = ui.app.messages(job_id, first, stop) if stop > first else []
    row = next((t for t in timeline(events) if t.n == n), None)
    return ui.render(request, "turn.html", job_id=job_id, n=n, answer=data, request_sent=data.get("request"),
                     first=first, replies=[m for m in messages if m.get("role") == "assistant"],
                     results=[m for m in messages if m.get("role") == "tool"], turn=row,
                     last_turn=view.record.phases_done, fenced=ui.app.read.fenced_answers(job_id, n))


def _events_through(ui: UI, job_id: str, n: int) -> list[Event]:
    """The job's events up to turn ``n``'s commit (read by pages, at most :data:`MAX_EVENTS_READ`)."""
    out: list[Event] = []
    after: str | None = None
    while len(out) < MAX_EVENTS_READ:
        page = ui.app.events(job_id, after=after, limit=1000)
        if not page:
            break
        out.extend(page)
        if any(e.turn == n and e.type == "turn_committed" for e in page):
            break
        after = page[-1].id
    return out
