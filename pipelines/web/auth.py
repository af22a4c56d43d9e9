"""The guard every page goes through: host check, login, form reading, CSRF; the login and logout pages."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pipelines.errors import InvalidInputError, JobConflictError, JobNotFoundError, PipelineError
from pipelines.web.core import COOKIE, UI, Endpoint, host_served

__all__ = ["MAX_FORM_BYTES", "guarded", "login", "login_form", "logout", "refusal", "too_many_guesses"]

# The longest thing a form carries is a message (MAX_MESSAGE_CHARS characters): each may take 4 bytes of
# UTF-8, sent as 12 (%XX each), so a message of the promised length in any script fits.
MAX_FORM_BYTES = 512 * 1024
MAX_FORM_FIELDS = 64  # a bulk action's job ids (one page of the jobs table) and a few fields
_STATUS_CODE = {JobNotFoundError: 404, JobConflictError: 409, InvalidInputError: 400}


def guarded(ui: UI, fn: Endpoint, *, login: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        refused = refusal(ui, request, login=login)
        if refused is not None:
            return refused
        if request.method == "POST":
            refused = await _read_form(ui, request) or _post_refusal(ui, request, login=login)
            if refused is not None:
                return refused
        return await _threaded(ui, fn, request)

    return endpoint


async def _threaded(ui: UI, fn: Endpoint, request: Request) -> Response:
    """Run ``fn`` in a thread (App calls block on storage) and turn library errors into pages."""
    from starlette.concurrency import run_in_threadpool

    try:
        return await run_in_threadpool(fn, ui, request)
    except PipelineError as exc:
        code = next((c for t, c in _STATUS_CODE.items() if isinstance(exc, t)), 500)
        return ui.render(request, "error.html", code, message=str(exc))


def refusal(ui: UI, request: Request, *, login: bool) -> Response | None:
    if ui.token is None and not host_served(request):
        # Without a token, a page reached under another name may be a DNS-rebinding attack.
        return ui.render(request, "error.html", 403, message="this page has no token, so it only answers "
                         "on 127.0.0.1 / localhost; start it with a token (PIPELINES_UI_TOKEN) to serve other names")
    if ui.token is not None and request.headers.get("authorization", "").startswith("Bearer "):
        refused = too_many_guesses(ui, request)
        if refused is not None:
            return refused
        if not ui.bearer(request):
            ui.guesses.wrong(_address(request))
    if login or ui.logged_in(request):
        return None
    if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    return ui.render(request, "error.html", 401, message="log in first (or send Authorization: Bearer)")


async def _read_form(ui: UI, request: Request) -> Response | None:
    """The urlencoded form into ``request.state.form`` (what the page's forms send); anything else refused."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        return ui.render(request, "error.html", 415, message="send the form as application/x-www-form-urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return ui.render(request, "error.html", 413, message=f"a form is at most {MAX_FORM_BYTES} bytes")
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS, errors="strict")
    except (UnicodeDecodeError, ValueError) as exc:
        return ui.render(request, "error.html", 400, message=f"unreadable form: {exc}")
    request.state.form = dict(pairs)
    request.state.form_pairs = pairs  # a name sent more than once: the jobs ticked for a bulk action
    return None


def _post_refusal(ui: UI, request: Request, *, login: bool) -> Response | None:
    origin = request.headers.get("origin")
    # "null" comes from privacy settings, not only from attackers: the CSRF token below decides then.
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        return ui.render(request, "error.html", 403, message="a form from another site was refused")
    sent = request.state.form.get("csrf", "")
    if not hmac.compare_digest(sent.encode(), ui.csrf(request).encode()):
        return ui.render(request, "error.html", 403,
                         message="missing or stale CSRF token: reload the page and try again")
    if ui.read_only and not login and request.url.path.rsplit("/", 1)[-1] != "logout":
        return ui.render(request, "error.html", 403, message="this page is read-only")
    return None


def login_form(ui: UI, request: Request) -> Response:
    if ui.token is None:
        return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
    return ui.render(request, "login.html", failed=False)


def login(ui: UI, request: Request) -> Response:
    refused = too_many_guesses(ui, request)
    if refused is not None:
        return refused  # right or wrong, the token is not looked at: a guesser learns nothing
    sent = request.state.form.get("token", "")
    if ui.token is None or not hmac.compare_digest(sent.encode(), ui.token.encode()):
        ui.guesses.wrong(_address(request))
        return ui.render(request, "login.html", 401, failed=True)
    ui.sessions.close(request.cookies.get(COOKIE, ""))  # a new login never keeps an old id alive
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
    response.set_cookie(COOKIE, ui.sessions.open(), httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


def too_many_guesses(ui: UI, request: Request) -> Response | None:
    """429 with ``Retry-After`` when the client's address sent too many wrong tokens (see pipelines.web.guesses)."""
    wait = ui.guesses.wait(_address(request))
    if not wait:
        return None
    response = ui.render(request, "error.html", 429, message=f"too many wrong tokens from this address: "
                         f"try again in {wait} s")
    response.headers["retry-after"] = str(wait)
    return response


def _address(request: Request) -> str:
    return request.client.host if request.client is not None else ""


def logout(ui: UI, request: Request) -> Response:
    """End the session on the server too: a copy of the cookie taken before logging out no longer logs in."""
    ui.sessions.close(request.cookies.get(COOKIE, ""))
    response = RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
