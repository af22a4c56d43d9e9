"""A job's live stream over Server-Sent Events, for Starlette and FastAPI: :func:`sse_response`.

Every SSE event carries an ``id:``, so a browser's ``EventSource`` (or any
client sending ``Last-Event-ID``) resumes where it stopped: nothing missed,
nothing twice. In the ``parts`` format it is the part's cursor; in the
``ai-sdk`` format a part can make several chunks, and each one's id is
``<part id>:<k>`` (the k-th chunk made from that part), so a client cut off
between two chunks of one part resumes between them too. Comment lines go out as heartbeats
while nothing happens, so proxies keep the connection open. Storage is read
through :meth:`~pipelines.app.App.astream`: on memory and Redis a waiting
stream holds no thread (a thousand idle clients cost none of the executor's
few), and a client that goes away ends its wait at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from pipelines.app import App
from pipelines.engine.models import Event
from pipelines.errors import InvalidInputError, JobNotFoundError
from pipelines.web.aisdk import RUN_STARTS, UIMessageEncoder, latest_attempts, run_start, undone
from pipelines.web.cursors import check_in_stream, parts_after, parts_upto, split

__all__ = ["HEARTBEAT_SECONDS", "JobStreamResponse", "StreamFormat", "sse_response"]

StreamFormat = Literal["parts", "ai-sdk"]
HEARTBEAT_SECONDS = 15.0
_HEADERS = {"cache-control": "no-cache", "connection": "keep-alive", "x-accel-buffering": "no"}
_AI_SDK_HEADERS = {**_HEADERS, "x-vercel-ai-ui-message-stream": "v1"}


def sse_response(app: App, job_id: str, request: Request, *, format: StreamFormat = "parts",
                 after: str | None = None, heartbeat: float = HEARTBEAT_SECONDS,
                 hold_text: bool = False, start_at: str | None = None) -> JobStreamResponse:
    """The stream of ``job_id`` as a ``text/event-stream`` response.

    The starting cursor is the ``Last-Event-ID`` header, else the ``cursor``
    query parameter, else ``after`` (the server's choice; ``None``: from the
    start). ``format="parts"``: each event's data is the part as JSON (``id``,
    ``type``, ``turn``, ``data``), following the job until it ends.
    ``format="ai-sdk"``: the Vercel AI SDK UI message stream of the run the
    cursor is in (the latest run without a cursor), ending with it (see
    :mod:`pipelines.web.aisdk`). A malformed cursor, or one this job's stream
    never gave out, is answered 400 and an unknown job 404, with a JSON
    ``{"error": ...}`` body, before anything is streamed. ``hold_text=True``
    (``ai-sdk``): each turn's text comes whole once the turn committed, for a
    reader that cannot take text back (``useChat``'s send path; see
    :mod:`pipelines.web.aisdk`); its event ids end ``:h``, and a resume from
    one holds the text too, whatever ``hold_text`` says. ``start_at`` (the
    server's choice, instead of ``after``): the id of the part the stream starts
    at, that part included, for a client that holds nothing of it yet: the run
    a request just started (its first part, say), whatever runs follow it by the
    time the response is served. A part the stream no longer holds is a 400.
    """
    if format not in ("parts", "ai-sdk"):
        raise InvalidInputError(f"format must be 'parts' or 'ai-sdk', got {format!r}")
    if not heartbeat > 0:
        raise InvalidInputError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
    cursor = request.headers.get("last-event-id") or request.query_params.get("cursor")
    if not cursor and start_at is not None:  # the server's start: its ``after`` plays no part
        return JobStreamResponse(app, job_id, request, cursor=None, format=format, heartbeat=heartbeat,
                                 hold_text=hold_text, start_at=start_at)
    return JobStreamResponse(app, job_id, request, cursor=cursor or after, format=format, heartbeat=heartbeat,
                             hold_text=hold_text)


class JobStreamResponse(StreamingResponse):
    """The response :func:`sse_response` returns: checks the job and cursor when served, then streams."""

    def __init__(self, app: App, job_id: str, request: Request, *, cursor: str | None, format: StreamFormat,
                 heartbeat: float, hold_text: bool = False, start_at: str | None = None) -> None:
        self.app, self.job_id, self.request = app, job_id, request
        self.start_at = start_at  # a part the stream starts at (sse_response), when no cursor is given
        self.cursor, self.format, self.heartbeat = cursor, format, heartbeat
        self.chunk: int | None = None  # ai-sdk: the last chunk of the cursor's part the client has (None: all)
        self.hold_text = hold_text
        self.flags = ""  # ai-sdk: how the stream that gave out the cursor was made (pipelines.web.cursors.split)
        headers = _AI_SDK_HEADERS if format == "ai-sdk" else _HEADERS
        super().__init__(_nothing(), media_type="text/event-stream", headers=headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            backlog = await self._backlog()
        except JobNotFoundError as exc:
            await JSONResponse({"error": str(exc)}, status_code=404)(scope, receive, send)
            return
        except InvalidInputError as exc:
            await JSONResponse({"error": str(exc)}, status_code=400)(scope, receive, send)
            return
        self.body_iterator = self._events(backlog)
        del backlog  # the body's to let go of once replayed (see _events)
        await super().__call__(scope, receive, send)

    async def _backlog(self) -> list[Event]:
        """Every part stored now, after checking the job and the cursor (raises before anything is sent)."""
        if self.format == "ai-sdk":
            self.cursor, self.chunk, flags = split(self.cursor)
            # Resumed from a stream that held its text: the chunks to match are that stream's.
            self.hold_text = self.hold_text or "h" in flags
            self.flags = flags
        if self.cursor is not None:
            async for _ in self.app.astream(self.job_id, after=self.cursor, follow=False, timeout=0):
                pass  # read to its end: that checks the cursor
        parts = [part async for part in self.app.astream(self.job_id, follow=False)]
        if self.start_at is not None:
            return self._from(parts, self.start_at)
        if self.cursor is not None:
            check_in_stream(self.cursor, parts, self.job_id)
            upto = len(parts_upto(parts, self.cursor))
            # A bare part id where a run ended (a server's "after": a POST streaming the retry it started)
            # asks for what follows, none of that run: only a position inside an undone run is refused.
            ended = self.chunk is None and (upto == len(parts) or parts[upto].type in RUN_STARTS)
            if self.format == "ai-sdk" and upto and not ended:
                self._check_not_undone(parts, run_start(parts, upto - 1))
        return parts

    def _check_not_undone(self, parts: list[Event], first: int) -> None:
        """400 for a message of a run a full retry undid (its transcript is cut back): no chunk id is reused."""
        if undone(parts, first):
            raise InvalidInputError(f"the run of job {self.job_id!r} this stream position is in was undone by a "
                                    "full retry, which cut its transcript back: read the stream without a cursor")

    def _from(self, parts: list[Event], start: str) -> list[Event]:
        """The stream from part ``start`` on: ``parts`` from it, as a client that holds nothing of them reads it."""
        first = next((i for i, p in enumerate(parts) if p.id == start), None)
        if first is None:
            raise InvalidInputError(f"part {start!r:.60} is not in job {self.job_id!r}'s stream (any more)")
        self.cursor = None  # what comes before the part is not this stream's: the client holds none of it
        if self.format == "ai-sdk":  # the message of the run the part is in: it ends where the next run starts
            self._check_not_undone(parts, run_start(parts, first))
            end = next((i for i in range(first + 1, len(parts)) if parts[i].type in RUN_STARTS), len(parts))
            return parts[first:end]
        return parts[first:]

    async def _events(self, backlog: list[Event]) -> AsyncIterator[str]:
        emit: _Emitter
        if self.format == "ai-sdk":
            encoder = UIMessageEncoder(self.job_id, lambda a, b: self.app.messages(self.job_id, a, b),
                                       hold_text=self.hold_text)
            emit = _AiSdkEmitter(encoder, flags=self.flags)
            # The encoder reads the transcript at each turn's end: a storage round trip, so off the event loop.
            first = await asyncio.to_thread(emit.replay_ai, backlog, self.cursor, self.chunk)
        else:
            emit = _PartsEmitter()
            first = emit.replay(backlog, self.cursor)
        # Only where the live part begins is kept, not the parts read (all runs', on memory) for the whole connection.
        after = backlog[-1].id if backlog else self.cursor
        del backlog
        async for text in self._follow(first, after, emit):
            yield text

    async def _follow(self, first: list[str], after: str | None, emit: _Emitter) -> AsyncIterator[str]:
        for text in first:
            yield text
        gone = False
        if not emit.done:
            async for text in self._live(emit, after):
                if text is _GONE:
                    gone = True
                    break
                yield text
        if not gone:
            for text in emit.close():
                yield text

    async def _live(self, emit: _Emitter, after: str | None) -> AsyncIterator[str]:
        """Parts as they come, with heartbeats; yields ``_GONE`` when the client has left."""
        parts = _Parts(self.app.astream(self.job_id, after=after))
        # The client's leaving is awaited, not polled for: a quiet stream wakes only for its heartbeat (a
        # thousand idle streams polling twice a second kept a core a fifth busy).
        gone = asyncio.ensure_future(self._gone())
        quiet_since = time.monotonic()
        try:
            while not emit.done:
                part = await parts.next(timeout=self.heartbeat - (time.monotonic() - quiet_since), gone=gone)
                if part is _END:
                    return
                if isinstance(part, Event):
                    quiet_since = time.monotonic()
                    # Only a part whose chunks need the transcript reads storage, off the event loop; the
                    # rest (every text delta) is encoded here, with no hop through a thread.
                    for text in await asyncio.to_thread(emit.live, part) if emit.reads(part) else emit.live(part):
                        yield text
                elif gone.done():
                    yield _GONE
                    return
                elif time.monotonic() - quiet_since >= self.heartbeat:
                    quiet_since = time.monotonic()
                    yield ": keep-alive\n\n"
        finally:
            gone.cancel()
            await parts.close()

    async def _gone(self) -> None:
        """Returns when the client has disconnected (the ASGI server's ``http.disconnect``)."""
        while (await self.request.receive())["type"] != "http.disconnect":
            pass  # the rest of a request body nobody reads


_GONE = "\0gone"  # never a real SSE text: events end with a blank line
_END = object()


class _Parts:
    """The next part of an async stream, waited for at most ``timeout`` seconds without losing it."""

    def __init__(self, parts: AsyncIterator[Event]) -> None:
        self.parts = parts
        self.pending: asyncio.Future[Event] | None = None

    async def next(self, *, timeout: float, gone: asyncio.Future[None]) -> object:
        """The next part, ``None`` if none came in time (or ``gone`` is done), or ``_END`` when the stream is over."""
        if self.pending is None:
            self.pending = asyncio.ensure_future(anext(self.parts))
        either: set[asyncio.Future[Any]] = {self.pending, gone}
        done, _ = await asyncio.wait(either, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
        if self.pending not in done:
            return None
        pending, self.pending = self.pending, None
        try:
            return pending.result()
        except StopAsyncIteration:
            return _END

    async def close(self) -> None:
        if self.pending is not None:
            # The read in flight ends the generator when it sees the cancellation; its thread finishes
            # its one blocking read and is never asked for another.
            self.pending.cancel()
        else:
            await self.parts.aclose()  # type: ignore[attr-defined]


async def _nothing() -> AsyncIterator[str]:
    return
    yield  # an async generator with no items: the real one is set when the response is served


# json.dumps with options builds a new encoder per call; one for every part of every stream.
_PART_JSON = json.JSONEncoder(separators=(",", ":"), default=str)


def _event(data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}data: {_PART_JSON.encode(data)}\n\n"


class _Emitter:
    done = False

    def replay(self, backlog: list[Event], cursor: str | None) -> list[str]:
        raise NotImplementedError

    def live(self, part: Event) -> list[str]:
        raise NotImplementedError

    def reads(self, part: Event) -> bool:
        """Whether :meth:`live` reads storage for ``part`` (then it runs in a thread)."""
        return False

    def close(self) -> list[str]:
        return []


class _PartsEmitter(_Emitter):
    """``format="parts"``: one event per part, its data the part as JSON."""

    def replay(self, backlog: list[Event], cursor: str | None) -> list[str]:
        return [self.live(p)[0] for p in parts_after(backlog, cursor)]

    def live(self, part: Event) -> list[str]:
        return [_event(part.model_dump(mode="json"), part.id)]


class _AiSdkEmitter(_Emitter):
    """``format="ai-sdk"``: UI message chunks, the k-th made from a part with the id ``<part id>:<k>``."""

    def __init__(self, encoder: UIMessageEncoder, *, flags: str = "") -> None:
        self.encoder = encoder
        self.compacted = "c" in flags  # the client's cursor came from a replay of latest attempts only
        # The cursor's part sent its turn's text whole from the transcript (":w"): none of it had come live.
        self.whole = "w" in flags
        self.compact = False  # this stream is such a replay: its chunk ids say so (":c")

    def replay(self, backlog: list[Event], cursor: str | None) -> list[str]:
        return self.replay_ai(backlog, cursor, None)

    def replay_ai(self, backlog: list[Event], cursor: str | None, chunk: int | None) -> list[str]:
        """The chunks a client that has everything up to chunk ``chunk`` of part ``cursor`` is missing.

        The encoder's output is a function of the parts alone, so feeding the
        run's parts again from its start rebuilds what the client holds; of the
        cursor's own part only the chunks after ``chunk`` go out.

        Without a cursor the client holds nothing of the run (``useChat``'s resume: the AI SDK's
        ``DefaultChatTransport`` replays, ``resumeStreamIsReplay``): the run is sent with only each
        turn's latest attempt, so an abandoned attempt's text is never sent and the message keeps the
        run's one ``messageId``, which ``AbstractChat`` then replaces in place (a new id would add a
        second assistant message). When that dropped text, the stream's chunk ids end ``:c``: what a
        client holds from it is not what the parts rebuild, so a resume from one gets the run's message
        again under an id of its own. So does one whose part now makes other chunks than it did: a
        ``turn_committed`` whose turn's text came live, read once the live parts are gone (``live_ttl``),
        sends the text whole, and such chunks' ids end ``:w``.
        """
        upto = 0 if cursor is None else sum(1 for _ in parts_upto(backlog, cursor))
        if cursor is None or self.compacted or not upto or (chunk is not None and backlog[upto - 1].id != cursor):
            # No cursor, or what the client holds cannot be rebuilt (its part is gone: a Redis stream keeps
            # two runs, the newest; a bare id older than every part stored, "0" say; or it came from a replay of
            # latest attempts): it gets the whole run's message, under an id of its own when it holds one,
            # which the AI SDK's readers reset on.
            return self._again(backlog, upto, held=cursor is not None)
        first = run_start(backlog, upto - 1)
        seen, run = backlog[first:upto - 1], backlog[upto - 1:]
        for part in seen:  # rebuild what the client holds, silently
            self.encoder.feed(part, final=False)
        if chunk is None:  # a bare part id: the client has all of that part's chunks
            self.encoder.feed(run[0], final=len(run) == 1)
            self.done = self.encoder.ended and len(run) == 1
            return [] if self.done else self._send(run[1:], skip=None)
        head = self._chunks(run[0], final=len(run) == 1)
        if self.encoder.whole != self.whole:  # the part's chunks are not those the client counted: see above
            self.encoder, self.done = self.encoder.anew(), False
            return self._again(backlog, upto, held=True)
        return head[chunk + 1:] + ([] if self.done else self._send(run[1:], skip=None))

    def _again(self, backlog: list[Event], upto: int, *, held: bool) -> list[str]:
        """The whole message of the run part ``upto - 1`` is in (the latest run if 0); a new id if ``held``."""
        self.encoder.again = held
        run = backlog[run_start(backlog, upto - 1 if upto else None):]
        shown = latest_attempts(run)
        # Only a replay that dropped text is other than the function of the parts a cursor rebuilds.
        self.compact = shown is not run
        return self._send(shown, skip=None)

    def _send(self, run: list[Event], *, skip: int | None) -> list[str]:
        """The chunks of ``run``'s parts, without the first part's chunks up to number ``skip``."""
        out: list[str] = []
        for i, part in enumerate(run):
            events = self._chunks(part, final=i + 1 == len(run))
            out += events[skip + 1:] if i == 0 and skip is not None else events
            if self.done:
                break
        return out

    def live(self, part: Event) -> list[str]:
        return self._chunks(part, final=True)

    def reads(self, part: Event) -> bool:
        return part.type == "turn_committed"  # the encoder reads the turn's messages from the transcript

    def _chunks(self, part: Event, *, final: bool) -> list[str]:
        chunks = self.encoder.feed(part, final=final)
        self.done = self.encoder.ended
        flags = "".join(f for f, on in (("h", self.encoder.hold_text), ("c", self.compact), ("w", self.encoder.whole))
                        if on)
        suffix = f":{flags}" if flags else ""
        return [_event(c, f"{part.id}:{i}{suffix}") for i, c in enumerate(chunks)]

    def close(self) -> list[str]:
        # A message still open here lost its run's end: the job was deleted (or its storage lost it) while
        # followed. Said so, not ended as if the run had finished.
        error = self.encoder.abort("the job's stream ended before its run did: the job no longer exists")
        return [*(_event(c) for c in error), "data: [DONE]\n\n"]

