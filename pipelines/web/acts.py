"""The page's bigger actions, each with a confirm step: fork or rerun from a turn, send a message (or continue).

The first POST (CSRF-checked like every POST) changes nothing: it renders what
the action will do, with its options, and a second form carrying
``confirmed=yes``. That one acts through the App (``app.fork`` / ``app.rerun``
/ ``app.send``) and redirects (303) to a page that says what it did, with a link
to the job it made or moved: reloading that page does not send a message again.
A send's confirm form carries a one-time token: a second post of it (a double
click) sends nothing and says what the first did (a post refused leaves the
token unspent); a fork's carries its new id.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pipelines.engine.models import validate_job_id
from pipelines.errors import InvalidInputError, JobConflictError, JobNotFoundError
from pipelines.web.core import UI, is_count

__all__ = ["ACTIONS", "act", "done"]

ACTIONS = frozenset({"fork", "send"})
MAX_MESSAGE_CHARS = 32_000


def act(ui: UI, request: Request, job_id: str, action: str) -> Response:
    """Confirm (``confirmed`` missing) or do ``action`` on ``job_id`` from the posted form."""
    form: dict[str, str] = request.state.form
    view = ui.app.get(job_id)
    if view is None:
        raise JobNotFoundError(f"job {job_id!r} not found")
    plan = _fork_plan(job_id, form) if action == "fork" else _send_plan(view.finished, form)
    if form.get("confirmed") != "yes":
        return ui.render(request, "confirm.html", job_id=job_id, action=action, plan=plan)
    if action == "fork":
        handle = (ui.app.rerun(job_id, from_turn=plan["at_turn"], new_job_id=plan["new_job_id"], **plan["options"])
                  if plan["run"] else
                  ui.app.fork(job_id, at_turn=plan["at_turn"], new_job_id=plan["new_job_id"], **plan["options"]))
        said = {"did": "rerun" if plan["run"] else "fork", "at": str(plan["at_turn"]), "into": handle.job_id}
    else:
        # A second post of the same form (a double click) sends nothing: it says what the first one did.
        what = "continued" if view.finished else "sent"
        said = {"did": _send_once(ui, form.get("once", ""), what, lambda: ui.app.send(job_id, [plan["text"]]))}
    root = request.scope.get("root_path", "")
    return RedirectResponse(f"{root}/jobs/{job_id}/done?{urlencode(said)}", status_code=303)


def done(ui: UI, request: Request) -> Response:
    """What a confirmed action did (the page its POST redirected to), from the redirect's query."""
    job_id, params = request.path_params["job_id"], request.query_params
    validate_job_id(job_id)
    kind, target = params.get("did", ""), params.get("into") or job_id
    validate_job_id(target)
    if kind in ("fork", "rerun"):
        at = params.get("at", "")
        if not is_count(at):
            raise InvalidInputError(f"at must be a whole number >= 0, got {at[:40]!r}")
        did = (f"forked {job_id} after turn {at} into {target}, "
               + ("running now" if kind == "rerun" else "paused (resume it from its page)"))
    elif kind in ("continued", "sent"):
        did = f"{'continued' if kind == 'continued' else 'sent a message to'} {job_id}"
    else:
        raise InvalidInputError(f"unknown action {kind[:40]!r}")
    return ui.render(request, "done.html", did=did, target=target)


def _fork_plan(job_id: str, form: dict[str, str]) -> dict[str, Any]:
    raw = form.get("at_turn", "")
    if not is_count(raw):
        raise InvalidInputError(f"at_turn must be a whole number >= 0, got {raw[:40]!r}")
    at_turn = int(raw)
    new_id = form.get("new_job_id", "").strip() or f"{job_id[:80]}-fork{at_turn}-{secrets.token_hex(3)}"
    validate_job_id(new_id)
    options: dict[str, Any] = {}
    max_turns = form.get("max_turns", "").strip()
    if max_turns:
        if not is_count(max_turns) or not 1 <= int(max_turns) <= 10_000:
            raise InvalidInputError(f"max_turns must be a whole number from 1 to 10000, got {max_turns[:40]!r}")
        options["max_turns"] = int(max_turns)
    return {"at_turn": at_turn, "new_job_id": new_id, "run": form.get("run") == "yes", "options": options,
            "max_turns": max_turns}


def _send_plan(finished: bool, form: dict[str, str]) -> dict[str, Any]:
    text = form.get("text", "")
    if not text.strip():
        raise InvalidInputError("write a message to send")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidInputError(f"a message is at most {MAX_MESSAGE_CHARS} characters, got {len(text)}")
    return {"text": text, "continue": finished, "once": secrets.token_urlsafe(16)}


SPENT_KEPT = 10_000  # one-time tokens of sends remembered per page process (oldest forgotten first)
SENDING_WAIT = 30.0  # seconds a second post of a form waits for the first one's send to end


def _send_once(ui: UI, once: str, did: str, send: Callable[[], object]) -> str:
    """Send with the form's one-time token ``once``, unless a post of it sent already; what was done.

    A token is spent only by a send that went through: one refused (the run in progress, a failed job, a
    storage error) leaves it, so the same form sends once the cause is gone. A second post while the first
    is still sending waits for its outcome. A form without a token is refused: it is not the page's own.
    """
    if not once or len(once) > 64:
        raise InvalidInputError("this form has no one-time token (a page from before an upgrade?): open it again")
    for _ in range(3):
        with ui.spent_lock:
            if once in ui.spent:
                return ui.spent[once]
            busy = ui.sending.get(once)
            mine = busy is None
            if busy is None:
                busy = ui.sending[once] = threading.Event()
        if not mine:
            busy.wait(SENDING_WAIT)  # then: spent (it went through), or free again (it was refused)
            continue
        try:
            send()
            with ui.spent_lock:
                ui.spent[once] = did
                if len(ui.spent) > SPENT_KEPT:
                    del ui.spent[next(iter(ui.spent))]
        finally:
            with ui.spent_lock:
                ui.sending.pop(once, None)
            busy.set()
        return did
    raise JobConflictError("this form is being sent by another request that has not ended; open the job's page "
                           "to see whether the message arrived")
