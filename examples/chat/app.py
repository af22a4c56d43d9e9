"""A chat service over a durable agent, streamed to the browser and to the Vercel AI SDK.

    python examples/chat/app.py            # offline: memory adapters, a scripted model; open http://127.0.0.1:8000

Routes:
- ``POST /chat`` starts a conversation or continues it, and returns its stream. The body is what the
  AI SDK's ``useChat`` sends (``{"id", "messages": [UIMessage...]}``, the last user message is used) or
  ``{"id", "text"}``; ``"stream": false`` answers 202 instead. ``?format=parts`` streams the library's
  parts; the default is the AI SDK UI message stream. A call that needs approval shows as a tool part
  awaiting it; the message ``useChat`` sends after ``addToolApprovalResponse({id, approved, reason})``
  (its last assistant message holds the answered parts) approves or rejects the calls
  (``app.approve`` / ``app.reject``, the reason kept) and streams the run going on, the same message.
  Only calls of the served agent's jobs are answered here: another agent's job id is refused (409), as a
  new message to it is. A call decided already (in another tab) is not decided again: the answer is the
  rest of that call's run, not of a later one; 409 when that run is gone (a ``regenerate()`` undid it).
  ``useChat``'s ``regenerate()`` of the latest answer runs that run again (``app.retry(mode="full")``)
  and streams it; an earlier answer, or one still being written, is refused (409). So is an edit of a
  message sent already (``sendMessage({text, messageId})``): the transcript is append-only.
  A message to a conversation whose run goes on (``useChat``'s next message after ``stop()``, which only
  closes the connection) is sent to it (``app.send``) and its answer streamed once a turn took it (see
  :mod:`examples.chat.inbox`).
  The text of each turn comes once the turn committed (see ``hold_text`` in :mod:`pipelines.web.sse`).
  Only a JSON body is taken, and not from another site's page (``Origin``): a form there could approve calls.
  Only loopback ``Host`` names are answered unless ``build_app(hosts=[...])`` names more (``--name``): a
  DNS-rebinding page sends a same-origin request under its own name (every route refuses it, 403).
  Anything it refuses (a bad body, format or a cursor) is refused before a run starts.
- ``GET /chat/{id}/stream`` resumes it (``Last-Event-ID`` or ``?cursor=``; ``useChat``'s resume
  replays the latest answer; 204 for a chat with no run yet, as the AI SDK's reconnect expects).
- ``GET /`` a page that renders tokens as they arrive and reconnects with ``Last-Event-ID``.

With Redis + RQ, build the same Starlette app over your production ``App`` (``build_app(app)``) and
run the workers as usual: the web process only writes runs and reads streams.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
import threading
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from adapters.memory import MemoryScheduler, MemoryStorage
from examples.chat import history
from examples.chat.inbox import Sent, send_to_running, taken_at
from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError, JobConflictError, JobNotFoundError, PipelineError
from pipelines.engine.models import JobStatus, Message
from pipelines.testing import ScriptedModel, call, reply
from pipelines.web import sse_response
from pipelines.web.aisdk import run_start, undone
from pipelines.web.core import host_served

PAGE = Path(__file__).with_name("index.html")
ORDERS = {"A-1001": "shipped with DHL on Monday, arriving Thursday", "A-1002": "being packed"}


@tool
def lookup_order(order_id: str) -> str:
    """Where an order is."""
    return ORDERS.get(order_id, "no such order")


def scripted(messages: list[Message]) -> Any:
    """The offline model: looks an order up when asked about one, then answers at some length."""
    last = messages[-1]
    if last["role"] == "tool":
        return f"Your order is {last['content']}. Anything else I can help you with today?"
    text = str(last.get("content") or "")
    order = next((w.strip("?.!,") for w in text.split() if w.upper().startswith("A-")), None)
    if order:
        return reply("Let me look that order up.", call("lookup_order", order_id=order.upper()))
    return f"You said: {text}. I am a scripted assistant; ask me about order A-1001 to see a tool call."


def offline_app() -> App:
    """Memory adapters and the scripted model: no keys, no network."""
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
               agents=[Agent(name="chat", model=ScriptedModel(scripted), tools=[lookup_order])])


def build_app(app: App, *, agent: str = "chat", hosts: Collection[str] = ()) -> Starlette:
    """The Starlette app serving ``agent`` of ``app`` (see the module docstring).

    ``hosts``: the names it is reached under besides 127.0.0.1 / localhost / ::1 (``chat.example.com``);
    a request under any other ``Host`` is refused (403), as :func:`pipelines.web.ui.ui_app` without a token
    refuses it: a DNS-rebinding page comes under its own name.
    """
    drain_lock = threading.Lock()
    served = functools.partial(_on_known_hosts, frozenset(h.lower() for h in hosts))

    def run_in_process() -> None:
        with drain_lock:  # one in-process worker at a time (memory adapters); a no-op with real workers
            app.run_in_process()

    async def chat(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        try:
            fmt = _format(request)
            _check_cursor(request)
            # Storage reads and writes (a remote Redis, a long transcript): off the event loop, which serves
            # every other request and stream of this process meanwhile.
            begun = await asyncio.to_thread(_begin, app, agent, body)
        except PipelineError as exc:
            return _refused(exc)
        threading.Thread(target=run_in_process, daemon=True).start()
        if body.get("stream") is False:
            return JSONResponse({"id": begun.job_id}, status_code=202)
        try:  # a message to a running conversation: its answer starts at the turn that takes it
            start_at = begun.start_at if begun.sent is None else await taken_at(app, begun.sent, request)
        except JobConflictError as exc:
            return _refused(exc)
        if begun.sent is not None and start_at is None:
            return Response(status_code=204)  # the client left before a turn took its message
        # After approvals the client holds the message up to the wait: it gets what follows, in that message.
        # useChat's send path appends whatever text it gets, so each turn's text comes once committed
        # (a retried attempt that says something else is never shown); GET .../stream streams it live.
        return sse_response(app, begun.job_id, request, format=fmt, after=begun.after, start_at=start_at,
                            hold_text=True)

    async def stream(request: Request) -> Response:
        return _resume(app, request)

    async def page(request: Request) -> Response:
        return FileResponse(PAGE, media_type="text/html")

    return Starlette(routes=[Route("/", served(page)), Route("/chat", served(chat), methods=["POST"]),
                             Route("/chat/{id}/stream", served(stream))])


Endpoint = Callable[[Request], Awaitable[Response]]
_STATUS_CODES = {JobConflictError: 409, JobNotFoundError: 404}


def _refused(exc: PipelineError) -> Response:
    """What a refused ``POST /chat`` answers: 409 (the conversation is not in a state to take it), 404, else 400."""
    code = next((c for kind, c in _STATUS_CODES.items() if isinstance(exc, kind)), 400)
    return JSONResponse({"error": str(exc)}, status_code=code)


def _on_known_hosts(names: frozenset[str], endpoint: Endpoint) -> Endpoint:
    """``endpoint``, answering only a request whose ``Host`` is a loopback name or one of ``names``."""
    async def checked(request: Request) -> Response:
        if not host_served(request, names):
            return JSONResponse({"error": f"this chat answers only on 127.0.0.1 / localhost and the names it was "
                                          f"given (build_app(hosts=...)), not {request.url.hostname!r}"},
                                status_code=403)
        return await endpoint(request)
    return checked


def _resume(app: App, request: Request) -> Response:
    """``GET /chat/{id}/stream``: the conversation's stream from the client's cursor (the latest answer without)."""
    try:
        if app.get(request.path_params["id"]) is None:
            return Response(status_code=204)  # nothing to resume yet: what the AI SDK's reconnect expects
        return sse_response(app, request.path_params["id"], request, format=_format(request))
    except PipelineError as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)


async def _json_body(request: Request) -> Any:
    """The POST's JSON body, or the response refusing it: not JSON, or sent by another site's page.

    The AI SDK sends JSON, which a page of another origin can send only after the browser asked this server
    (a CORS preflight it does not answer); a form (it could approve calls) cannot. An ``Origin`` that is not
    this server is refused too.
    """
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return JSONResponse({"error": "POST /chat takes a JSON body (Content-Type: application/json)"},
                            status_code=415)
    origin = request.headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1] != request.headers.get("host"):
        return JSONResponse({"error": "cross-site request refused"}, status_code=403)
    try:
        return await request.json()
    except (ValueError, RecursionError):
        return JSONResponse({"error": "the body must be JSON"}, status_code=400)


def _format(request: Request) -> Any:
    fmt = request.query_params.get("format", "ai-sdk")
    if fmt not in ("parts", "ai-sdk"):
        raise InvalidInputError(f"format must be 'parts' or 'ai-sdk', got {fmt!r}")
    return fmt


_starting = threading.Lock()  # one run started at a time in this process: each POST streams its own


def _check_cursor(request: Request) -> None:
    """Refuse a client's cursor on a POST before anything is sent: its stream is the run the POST starts."""
    if request.headers.get("last-event-id") or request.query_params.get("cursor"):
        raise InvalidInputError("POST /chat streams the run it starts; resume a stream with GET /chat/{id}/stream")


@dataclass(frozen=True)
class Begun:
    """What a ``POST /chat`` started: its stream starts after ``after``, at ``start_at``, or at the turn that
    takes ``sent`` (a message to a conversation still running)."""

    job_id: str
    after: str | None = None
    start_at: str | None = None
    sent: Sent | None = None


def _begin(app: App, agent: str, body: Any) -> Begun:
    """Start or continue the run a ``POST /chat`` asks for."""
    if answers := _approval_answers(body):
        _check_agent(app, agent, body["id"])  # a call of another agent's job is not this endpoint's to decide
        return Begun(body["id"], after=_decide(app, body["id"], answers))
    text = None
    if isinstance(body, dict) and body.get("trigger") == "regenerate-message":
        job_id = _regenerated(app, agent, body)
        start: Callable[[], object] = functools.partial(app.retry, job_id, mode="full")
    else:
        job_id, text = _chat_input(body)
        _check_history(app, job_id, body)
        start = functools.partial(app.run_agent, agent, job_id=job_id, user=text)
    with _starting:
        # The stream's last part before this run starts: the stream this POST answers with begins after it,
        # so it shows this run, not the latest when it is served (another POST may have continued the
        # conversation by then). Across several web processes a race remains: stream a run by its id there.
        try:
            parts = list(app.stream(job_id, follow=False))
        except JobNotFoundError:
            parts = []
        before = parts[-1].id if parts else None
        if text is not None and _running(app, agent, job_id):
            return Begun(job_id, sent=send_to_running(app, job_id, text, before))
        start()
        # A new conversation's stream starts at its first part, not "the latest run": another POST may have
        # continued it by the time this response is served.
        first = None if before is not None else next(iter(app.stream(job_id, follow=False))).id
    return Begun(job_id, after=before, start_at=first)


def _running(app: App, agent: str, job_id: str) -> bool:
    """Whether ``job_id`` is a running conversation of ``agent`` (a new message joins it: see ``inbox``)."""
    view = app.get(job_id)
    if view is None or view.status is not JobStatus.RUNNING:
        return False
    _check_agent(app, agent, job_id)
    return True


def _check_agent(app: App, agent: str, job_id: str) -> None:
    """Raise :class:`JobConflictError` unless ``job_id`` is a job of ``agent`` (what ``run_agent`` refuses too)."""
    view = app.get(job_id)
    if view is None:
        raise JobNotFoundError(f"no conversation {job_id!r}: nothing waits for approval there")
    if view.pipeline != agent:
        raise JobConflictError(f"job {job_id!r} is a job of {view.pipeline!r}, not {agent!r}: this endpoint "
                               f"serves {agent!r} only")


def _regenerated(app: App, agent: str, body: dict[str, Any]) -> str:
    """The conversation whose latest answer ``useChat``'s ``regenerate()`` asks for again, once checked.

    The client dropped that answer and sends what it holds before it: the server runs the latest run
    again from its start (``app.retry(mode="full")``, its answer cut back), so both hold the same. An
    earlier answer cannot be regenerated in place (the conversation went on from it; ``app.fork`` it to a
    new id), nor one that is still being written: both are refused (409), as is a client that holds more
    or fewer user messages than the conversation (another tab went on with it). So is a run that took a
    message sent during it (after ``stop()``): the retry would cut that message away with its answer.
    """
    job_id = body.get("id")
    if not isinstance(job_id, str):
        raise InvalidInputError('the body needs a conversation "id" (a string)')
    _check_agent(app, agent, job_id)
    held = history.held_users(body)
    view, transcript = app.get(job_id), app.messages(job_id)  # read once: the checks below look at them
    if len(held) != sum(1 for m in transcript if history.from_person(m)):
        raise JobConflictError(f"only the latest answer of conversation {job_id!r} can be regenerated, as the "
                               "server holds it: this client holds other messages (an earlier answer, or another "
                               "tab went on); reload the conversation")
    history.check_agrees(job_id, held, transcript)  # the same count, and the same messages (an edit refused)
    if view is not None and any(history.from_person(m) for m in transcript[view.record.base_transcript_len:]):
        # A full retry cuts the transcript back to the run's start: a message a turn took from the inbox
        # (sent after stop() while the run went on) is after it, and would be lost.
        raise JobConflictError(f"the latest answer of conversation {job_id!r} took a message sent while it was "
                               "being written: regenerating it would drop that message; send a new one instead")
    return job_id


def _check_history(app: App, job_id: str, body: Any) -> None:
    """Refuse a new message from a client that disagrees with the conversation (409); see :mod:`history`.

    An edit (``sendMessage({text, messageId})``) of a message the conversation holds is refused: the client
    replaced it and dropped what followed, which an append-only transcript cannot do. An "edit" of a message
    the server never took (its first ``POST`` was lost) is a new message.
    """
    held = history.held_users(body)
    if not held:
        return  # {"id", "text"}: the client says nothing of what it holds
    try:
        transcript = app.messages(job_id)
    except JobNotFoundError:
        return  # a new conversation
    said = [m for m in transcript if history.from_person(m)]
    if history.is_edit(body) and len(held) <= len(said):
        if history.ui_text(held[-1]) == said[len(held) - 1].get("content"):
            raise JobConflictError(f"conversation {job_id!r} holds this message already: its answer is at GET "
                                   f"/chat/{job_id}/stream")
        raise JobConflictError(f"conversation {job_id!r}: a message sent already cannot be edited here (the "
                               "conversation went on from it); send a new message, or start a new conversation")
    history.check_agrees(job_id, held[:-1], transcript)


def _approval_answers(body: Any) -> list[dict[str, Any]]:
    """The tool parts a person answered (state ``approval-responded``) in a ``useChat`` body's last message."""
    messages = body.get("messages") if isinstance(body, dict) and isinstance(body.get("id"), str) else None
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return []
    parts = last.get("parts")
    return [p for p in parts if isinstance(p, dict) and p.get("state") == "approval-responded"
            and isinstance(p.get("toolCallId"), str) and isinstance(p.get("approval"), dict)
            ] if isinstance(parts, list) else []


def _decide(app: App, job_id: str, answers: list[dict[str, Any]]) -> str | None:
    """Approve or reject each answered call; the id of the stream's part the client's message ends at.

    That is the latest request for approval of one of the client's calls, not the job's latest: a tab
    left open answers a call another tab decided long ago, and its message is that call's run, however
    far the conversation went on since (``None``: the run going on now).
    """
    view = app.get(job_id)
    pending = {str(c.get("call_id")) for c in (view.pending_calls if view is not None else ())}
    decided = False
    for part in answers:
        call_id, approval = part["toolCallId"], part["approval"]
        if call_id not in pending:
            continue  # decided already (a second tab, a resent message): nothing to do twice
        try:
            if approval.get("approved") is True:
                app.approve(job_id, call_id)
            else:
                app.reject(job_id, call_id, reason=str(approval.get("reason") or "").strip() or "denied by the user")
        except JobConflictError:
            # Another tab decided it between the read above and this decision: decided already, as above.
            now = app.get(job_id)
            if now is not None and call_id in {str(c.get("call_id")) for c in now.pending_calls}:
                raise  # still pending: refused for another reason
            continue
        decided = True
    answered = {p["toolCallId"] for p in answers}
    parts = list(app.stream(job_id, follow=False))
    asked = [p.id for i, p in enumerate(parts) if p.type == "approval_requested"
             and answered & {str(c.get("call_id")) for c in p.data.get("calls") or [] if isinstance(c, dict)}
             and not undone(parts, run_start(parts, i))]  # a run a regenerate() undid is no message to go on
    if not asked and not decided:
        # Decided elsewhere, and the stream no longer holds that run (or a full retry undid it): no message
        # to go on with.
        raise JobConflictError(f"the calls answered were decided already and conversation {job_id!r} has "
                               "gone on since; reload it")
    return asked[-1] if asked else None


def _chat_input(body: Any) -> tuple[str, str]:
    """(conversation id, the user's new text) from a ``useChat`` body or ``{"id", "text"}``."""
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        raise InvalidInputError('the body needs a conversation "id" (a string)')
    text = body.get("text")
    if text is None:
        messages = body.get("messages")
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"
                 ] if isinstance(messages, list) else []
        parts = users[-1].get("parts") if users else None
        texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"
                 ] if isinstance(parts, list) else []
        text = "".join(t for t in texts if isinstance(t, str)) if all(isinstance(t, str) for t in texts) else None
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError('the body needs the user\'s "text" (or useChat "messages" ending with one)')
    return body["id"], text


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", action="append", default=[], help="a host name to answer besides loopback ones")
    args = parser.parse_args()
    uvicorn.run(build_app(offline_app(), hosts=args.name), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
