"""What every page of the web UI shares: :class:`UI` (the App, templates, secrets, sessions) and the headers."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipelines.app import App
from pipelines.web.guesses import Guesses
from pipelines.web.text import visible, visible_plain

__all__ = ["COOKIE", "CSP", "LOOPBACK_NAMES", "MAX_SESSIONS", "SESSION_SECONDS", "UI", "Endpoint", "Headers",
           "host_served", "is_count"]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"), (b"x-frame-options", b"DENY")]
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
COOKIE = "pipelines_ui"
SESSION_SECONDS = 12 * 3600
"""A login lasts this long (or until it logs out, or the server restarts)."""
MAX_SESSIONS = 10_000
"""Past this many live logins the oldest is dropped: a login form hammered cannot grow memory without bound."""
HERE = Path(__file__).parent

Endpoint = Callable[["UI", Request], Response]


class Sessions:
    """The logins this server process handed out: an id in the cookie, its expiry here; logout removes it.

    A copied cookie stops working at logout (the id is gone), at expiry, and
    when the server restarts (sessions live in the process, never in storage).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._live: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def open(self) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            now = self._clock()
            for old in [s for s, until in self._live.items() if until <= now]:
                del self._live[old]
            while len(self._live) >= MAX_SESSIONS:
                del self._live[next(iter(self._live))]
            self._live[sid] = now + SESSION_SECONDS
        return sid

    def valid(self, sid: str) -> bool:
        if not sid:
            return False
        with self._lock:
            until = self._live.get(sid)
        return until is not None and until > self._clock()

    def close(self, sid: str) -> None:
        with self._lock:
            self._live.pop(sid, None)


class UI:
    """Everything a request needs: the App, the templates, the secrets, the live sessions."""

    def __init__(self, app: App, *, token: str | None, read_only: bool) -> None:
        self.app, self.token, self.read_only = app, token, read_only
        self.key = secrets.token_bytes(32)  # signs CSRF tokens; sessions are ids this process holds
        self.sessions = Sessions()
        self.guesses = Guesses()  # wrong tokens per client address: a token is not guessed at server speed
        # One-time tokens of confirmed sends (pipelines.web.acts): a second post of one form sends nothing.
        self.spent: dict[str, str] = {}  # token -> what its first post did
        self.sending: dict[str, threading.Event] = {}  # token -> set when the post sending it is done
        self.spent_lock = threading.Lock()
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                      undefined=jinja2.StrictUndefined)
        self.env.filters["pretty"] = pretty_json
        self.env.filters["when"] = when
        self.env.filters["short_tag"] = short_tag
        self.env.filters["visible"] = visible
        self.env.filters["visible_plain"] = visible_plain

    def sign(self, what: str) -> str:
        return hmac.new(self.key, what.encode(), hashlib.sha256).hexdigest()

    def session_id(self, request: Request) -> str:
        """The request's live session id, or ``""`` (no cookie, a stale one, or a logged-out one)."""
        sid = request.cookies.get(COOKIE, "")
        return sid if self.sessions.valid(sid) else ""

    def bearer(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        return (self.token is not None and header.startswith("Bearer ")
                and hmac.compare_digest(header[7:].encode(), self.token.encode()))

    def csrf(self, request: Request) -> str:
        """A CSRF token bound to the session (a new login, or logging out, makes the old ones stale)."""
        if self.token is None:
            return self.sign("csrf:open")
        sid = self.session_id(request)
        return self.sign("csrf:session:" + sid) if sid else self.sign("csrf:bearer" if self.bearer(request)
                                                                       else "csrf:login")

    def logged_in(self, request: Request) -> bool:
        return self.token is None or self.bearer(request) or bool(self.session_id(request))

    def render(self, request: Request, template: str, code: int = 200, /, **ctx: Any) -> HTMLResponse:
        ctx.update(root=request.scope.get("root_path", ""), csrf=self.csrf(request), read_only=self.read_only,
                   login=self.token is not None and self.logged_in(request))
        html = self.env.get_template(template).render(**ctx)
        return HTMLResponse(html, status_code=code, headers={"cache-control": "no-store"})


class Headers:
    """Security headers on every response, static files included."""

    def __init__(self, app: ASGIApp) -> None:
        self.inner = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.inner(scope, receive, with_headers)


def host_served(request: Request, names: Collection[str] = ()) -> bool:
    """Whether ``request`` came under a loopback name or one of ``names`` (its ``Host``, port aside).

    A page of another site can make its own name resolve to 127.0.0.1 (DNS rebinding): the browser then
    sends it what a page of this server would send, same-origin as far as it knows, but under that name.
    A server without a login answers only names it knows.
    """
    return (request.url.hostname or "") in LOOPBACK_NAMES or (request.url.hostname or "") in names


def is_count(raw: str) -> bool:
    """Whether ``raw`` is a whole number >= 0 of at most 9 ASCII digits, as the page's numbers are written.

    ``str.isdigit`` alone takes ``"²"``, which ``int()`` refuses (a bare 500).
    """
    return raw.isascii() and raw.isdigit() and len(raw) <= 9


def pretty_json(value: Any) -> str:
    if isinstance(value, str):  # tool arguments arrive as JSON text: shown parsed when they parse
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            return value
        value = parsed
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def short_tag(tag: str) -> str:
    """A ``commit:<sha>`` tag as its first 12 hex digits (the whole tag is the title)."""
    return tag[:19] + "\u2026" if tag.startswith("commit:") and len(tag) > 19 else tag


def when(t: float | None) -> str:
    return "-" if not t else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")
