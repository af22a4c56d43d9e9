"""The web page to watch and steer runs: :func:`ui_app` (an ASGI app) and ``pipelines ui``.

A client of the :class:`~pipelines.app.App`, like the CLI: it reads with
``app.get`` / ``messages`` / ``read.recent_events`` / ``read.recent_logs`` /
``storage.list_jobs`` and acts with ``approve`` / ``reject`` / ``retry`` /
``cancel`` / ``pause`` / ``resume`` / ``fork`` / ``send``; tokens arrive
through :func:`pipelines.web.sse.sse_response`. The jobs page is
:mod:`pipelines.web.jobs`, a job's page :mod:`pipelines.web.job_page`.
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

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pipelines.app import App
from pipelines.errors import ConfigurationError, InvalidInputError
from pipelines.web import job_page
from pipelines.web.acts import ACTIONS, act, done
from pipelines.web.auth import guarded, login, login_form, logout, refusal
from pipelines.web.bulk import bulk
from pipelines.web.core import CSP, HERE, LOOPBACK_NAMES, UI, Headers
from pipelines.web.jobs import COUNT_LIMIT, PAGE_SIZE, jobs_page
from pipelines.web.sse import sse_response
from pipelines.web.turn_page import turn_page
from pipelines.web.workers import workers_page

__all__ = ["COUNT_LIMIT", "CSP", "PAGE_SIZE", "check_bind", "ui_app"]


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
        Route("/workers", page(workers_page)),
        Route("/bulk", page(bulk), methods=["POST"]),
        Route("/jobs/{job_id}", page(_job_page)),
        Route("/jobs/{job_id}/live", page(_job_live)),
        Route("/jobs/{job_id}/turns/{n}", page(turn_page)),
        Route("/jobs/{job_id}/stream", _stream_endpoint(ui)),
        Route("/jobs/{job_id}/done", page(done)),
        Route("/jobs/{job_id}/{action}", page(_act), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Headers)])


# --- one job --------------------------------------------------------------------------------------
def _job_page(ui: UI, request: Request) -> Response:
    return ui.render(request, "job.html", **job_page.context(ui, request))


def _job_live(ui: UI, request: Request) -> Response:
    return ui.render(request, "job_live.html", **job_page.context(ui, request, live=True))


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
    digest = form.get("digest") or None  # what the page showed: a call asking something else is refused
    steps: dict[str, Callable[[], object]] = {
        "approve": lambda: app.approve(job_id, call_id, digest=digest),
        "reject": lambda: app.reject(job_id, call_id, reason=form.get("reason", ""), digest=digest),
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
