"""The web page to watch and steer runs: :func:`ui_app` (an ASGI app) and ``pipelines ui``.

A client of the :class:`~pipelines.app.App`, like the CLI: it reads with
``app.get`` / ``messages`` / ``logs`` / ``events`` / ``storage.list_jobs`` and
acts with ``approve`` / ``reject`` / ``retry`` / ``cancel`` / ``pause`` /
``resume``; tokens arrive through :func:`pipelines.web.sse.sse_response`.
Server-rendered HTML (jinja2, autoescaped) with one small static script; every
asset ships in the package (no CDN, no build step)::

    from pipelines.web.ui import ui_app
    asgi = ui_app(app)                            # loopback only, no login
    asgi = ui_app(app, token="s3cret")            # login form or Authorization: Bearer s3cret
    asgi = ui_app(app, read_only=True)            # watch, never act

Safe by default: without a token only loopback ``Host`` names are served (a
DNS-rebinding page gets 403); with one, every request needs the session cookie
(HttpOnly, SameSite=Strict) the login form sets, or the bearer header. Every
state change is a POST carrying a CSRF token bound to the session; GETs change
nothing. A Content-Security-Policy forbids inline scripts.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from phases import journal
from pipelines.app import App
from pipelines.engine.errors import ConfigurationError, InvalidInputError, JobNotFoundError
from pipelines.engine.models import JobRecord, JobStatus
from pipelines.web.acts import ACTIONS, act
from pipelines.web.auth import guarded, login, login_form, logout, refusal
from pipelines.web.core import CSP, HERE, LOOPBACK_NAMES, UI, Headers, pretty_json
from pipelines.web.jobs import COUNT_LIMIT, PAGE_SIZE, jobs_page, row
from pipelines.web.sse import sse_response
from pipelines.web.timeline import timeline

__all__ = ["COUNT_LIMIT", "CSP", "PAGE_SIZE", "check_bind", "ui_app"]

TRANSCRIPT_LIMIT = 1000  # the page shows the last messages of a longer conversation


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (:class:`ConfigurationError` saying why)."""
    if host.strip("[]") not in LOOPBACK_NAMES and not token:
        raise ConfigurationError(f"refusing to serve the web page on {host!r} without a token: anyone who can reach "
                                 "it could steer your runs; set PIPELINES_UI_TOKEN or pass --token-file")


def ui_app(app: App, *, token: str | None = None, read_only: bool = False) -> Starlette:
    """The web page for ``app`` as an ASGI app (mount it, or serve it with ``pipelines ui``).

    ``token``: when given, every request needs it (login form -> session
    cookie, or ``Authorization: Bearer``); without it only loopback host
    names are served. ``read_only``: actions are hidden and refused (403).
    """
    if not isinstance(app, App):
        raise InvalidInputError(f"ui_app needs a pipelines.App, got {type(app).__name__}")
    if token is not None and (not isinstance(token, str) or len(token) < 8):
        raise InvalidInputError("the web page's token must be a string of at least 8 characters")
    ui = UI(app, token=token, read_only=bool(read_only))
    page = functools.partial(guarded, ui)
    routes = [
        Route("/", page(jobs_page)),
        Route("/login", page(login_form, login=True)),
        Route("/login", page(login, login=True), methods=["POST"]),
        Route("/logout", page(logout), methods=["POST"]),
        Route("/jobs/{job_id}", page(_job_page)),
        Route("/jobs/{job_id}/live", page(_job_live)),
        Route("/jobs/{job_id}/stream", _stream_endpoint(ui)),
        Route("/jobs/{job_id}/{action}", page(_act), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Headers)])


# --- one job --------------------------------------------------------------------------------------
def _job_context(ui: UI, job_id: str) -> dict[str, Any]:
    view = ui.app.get(job_id)
    if view is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    rec = view.record
    start = max(0, rec.transcript_len - TRANSCRIPT_LIMIT)
    messages = ui.app.messages(job_id, start)
    results = {str(m.get("tool_call_id")): m for m in messages if m.get("role") == "tool"}
    state = None if rec.checkpoint is None else rec.checkpoint.state
    events = ui.app.events(job_id, limit=500)
    return {"job": row(rec), "rec": rec, "view": view, "skipped": start, "messages": _conversation(messages, start),
            "results": results, "logs": ui.app.logs(job_id)[-500:], "events": events, "turns": timeline(events),
            "state": state, "ledger": _ledger(rec), "pending": list(view.pending_calls),
            "finished": view.finished, "actions": _actions(rec),
            "pending_reply": _pending_reply(rec, view.pending_calls), "is_agent": rec.pipeline in ui.app.agents}


def _pending_reply(rec: JobRecord, pending: object) -> dict[str, Any] | None:
    """The model's reply of the open turn while its calls wait for approval: shown, labelled, not yet committed."""
    if rec.status is not JobStatus.WAITING or not pending or rec.checkpoint is None:
        return None
    answer = rec.checkpoint.journal.get(journal.MODEL)
    message = answer.get("message") if isinstance(answer, dict) else None
    if not isinstance(message, dict):
        return None
    return _conversation([message], rec.transcript_len)[0]


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


def _ledger(rec: JobRecord) -> list[dict[str, str]]:
    """Each tool call of the open turn: intended (answered by the model), started, done, interrupted."""
    entries = {} if rec.checkpoint is None else rec.checkpoint.journal
    started = entries.get(journal.TOOLS_STARTED)
    started_ids = {str(i) for i in started} if isinstance(started, list) else set()
    stuck = rec.status is JobStatus.WAITING and (rec.waiting or {}).get("kind") != "approval"
    rows = []
    for call in journal.model_calls(entries):
        call_id = str(call.get("id", ""))
        if journal.tool_key(call_id) in entries:
            state = "done"
        elif call_id in started_ids:
            state = "interrupted" if stuck or rec.status is JobStatus.ERROR else "started"
        else:
            state = "intended"
        rows.append({"id": call_id, "name": str((call.get("function") or {}).get("name", "?")), "state": state})
    return rows


def _actions(rec: JobRecord) -> list[str]:
    s = rec.status
    return [a for a, ok in (("pause", s is JobStatus.RUNNING), ("resume", s is JobStatus.PAUSED),
                            ("cancel", s in (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)),
                            ("retry", s in (JobStatus.ERROR, JobStatus.CANCELLED))) if ok]


def _job_page(ui: UI, request: Request) -> Response:
    return ui.render(request, "job.html", **_job_context(ui, request.path_params["job_id"]))


def _job_live(ui: UI, request: Request) -> Response:
    return ui.render(request, "job_live.html", **_job_context(ui, request.path_params["job_id"]))


def _stream_endpoint(ui: UI) -> Callable[[Request], Awaitable[Response]]:
    async def stream(request: Request) -> Response:
        refused = refusal(ui, request, login=False)
        if refused is not None:
            return refused
        return sse_response(ui.app, request.path_params["job_id"], request)

    return stream


# --- actions --------------------------------------------------------------------------------------
def _act(ui: UI, request: Request) -> Response:
    job_id, action = request.path_params["job_id"], request.path_params["action"]
    if action in ACTIONS:  # the ones with a confirm step of their own
        return act(ui, request, job_id, action)
    form: dict[str, str] = request.state.form
    app = ui.app
    call_id = form.get("call_id", "")
    steps: dict[str, Callable[[], object]] = {
        "approve": lambda: app.approve(job_id, call_id),
        "reject": lambda: app.reject(job_id, call_id, reason=form.get("reason", "")),
        "retry": lambda: app.retry(job_id, mode=form.get("mode", "resume")),  # type: ignore[arg-type]
        "cancel": lambda: app.cancel(job_id, wait=2.0),
        "pause": lambda: app.pause(job_id, wait=2.0),
        "resume": lambda: app.resume(job_id),
    }
    step = steps.get(action)
    if step is None:
        raise InvalidInputError(f"unknown action {action[:40]!r}; one of {', '.join([*steps, *sorted(ACTIONS)])}")
    step()
    root = request.scope.get("root_path", "")
    return RedirectResponse(f"{root}/jobs/{job_id}", status_code=303)
