"""A loopback OpenAI-compatible chat server for tests: scripted replies, every request recorded.

In a test, use the ``fake_openai`` fixture (tests/conftest.py)::

    fake_openai.script(rate_limited(retry_after=1), text_reply("hi"))
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": "sk-test"})

``script(*items)`` queues replies served one per request, in order. An item may
also be a function ``body -> Reply``: it stays at the head of the queue and
answers every later request (so a test can compute replies from the messages).
With nothing scripted, the server answers 400 "script exhausted" (a permanent
error, so a test that under-scripts fails fast instead of retrying).

As a process, for system tests whose worker processes call it::

    python -m tests.fake_openai --port 0 --mode w1

prints ``READY http://127.0.0.1:PORT/v1`` on stdout once it listens.
Mode ``w1`` is the benchmark workload of DESIGN.md, computed from the messages
only (stateless, safe for many concurrent jobs); mode ``echo`` answers text.
``--chunk-delay S`` paces streamed chunks (and records when each was sent).

Streaming: a request with ``"stream": true`` gets the same reply as Server-Sent
Events over chunked HTTP, as OpenAI sends it: a role chunk, the text in pieces
of ``chunk_chars``, each tool call's id and name then its arguments split in
pieces, a chunk with the finish reason, a usage chunk with empty ``choices``
(when ``stream_options.include_usage`` asks for it), then ``data: [DONE]``.
:func:`broken_stream` closes the connection after N chunks (no ``[DONE]``, no
terminating HTTP chunk); :func:`error_chunk` sends an error event after N
chunks instead. Error replies (4xx/5xx) are sent as plain JSON, streamed or not.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "FakeOpenAI",
    "Reply",
    "Responder",
    "bad_request",
    "broken_stream",
    "call",
    "close_litellm_clients_of",
    "context_window_exceeded",
    "echo_reply",
    "empty_choices",
    "error_chunk",
    "malformed_tool_reply",
    "rate_limited",
    "running",
    "server_error",
    "slow",
    "streamed",
    "text_reply",
    "tool_reply",
    "unauthorized",
    "unavailable",
    "unknown_tool_reply",
    "w1_reply",
]


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    ``message`` set: a chat completion with that assistant message (``choices``
    empty when ``empty`` is set). Otherwise ``status`` + ``error`` as an OpenAI
    error body. ``delay`` seconds pass before anything is sent.
    """

    status: int = 200
    message: dict[str, Any] | None = None
    finish_reason: str = "stop"
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    empty: bool = False
    chunk_chars: int = 4
    chunk_delay: float = 0.0
    break_after: int | None = None
    error_after: int | None = None
    raw_chunks: list[Any] | None = None  # streamed as they are (then [DONE]): a provider's odd shapes


Responder = Callable[[dict[str, Any]], Reply]
"""A function of the request body (the parsed JSON) that returns the reply."""


# --- reply builders ----------------------------------------------------------


def text_reply(content: str, *, finish_reason: str = "stop", **extras: Any) -> Reply:
    """A plain assistant answer; ``extras`` become message fields (e.g. ``reasoning_content``)."""
    return Reply(message={"role": "assistant", "content": content, **extras}, finish_reason=finish_reason)


def call(name: str, arguments: dict[str, Any] | str, *, id: str | None = None) -> dict[str, Any]:
    """One tool call for :func:`tool_reply`; a ``str`` ``arguments`` is sent as is (may be invalid JSON)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id or "", "type": "function", "function": {"name": name, "arguments": args}}


def tool_reply(*calls: dict[str, Any], content: str | None = None, **extras: Any) -> Reply:
    """An assistant message asking for one or several tool calls (finish_reason ``tool_calls``)."""
    numbered = [{**c, "id": c["id"] or f"call_{i}"} for i, c in enumerate(calls)]
    message = {"role": "assistant", "content": content, "tool_calls": numbered, **extras}
    return Reply(message=message, finish_reason="tool_calls")


def malformed_tool_reply(name: str = "add") -> Reply:
    """A tool call whose arguments are not JSON."""
    return tool_reply(call(name, '{"a": 1, "b": '))


def unknown_tool_reply(name: str = "no_such_tool") -> Reply:
    """A call of a tool the request never offered."""
    return tool_reply(call(name, {}))


def empty_choices() -> Reply:
    """A 200 completion with ``choices: []``."""
    return Reply(message={}, empty=True)


def _error(status: int, message: str, type_: str, code: str | None = None, **headers: str) -> Reply:
    return Reply(status=status, error={"message": message, "type": type_, "param": None, "code": code},
                 headers=dict(headers))


def rate_limited(retry_after: float | None = 1) -> Reply:
    """429, with a ``Retry-After`` header (seconds) unless ``retry_after`` is None."""
    headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
    reply = _error(429, "Rate limit reached for fake-model. Please try again later.", "requests", "rate_limit_exceeded")
    return Reply(status=429, error=reply.error, headers=headers)


def server_error(status: int = 500) -> Reply:
    """A 5xx (500 by default; 502, 504, 529 work too)."""
    return _error(status, "The server had an error while processing your request.", "server_error")


def unavailable() -> Reply:
    """503 Service Unavailable."""
    return _error(503, "The engine is currently overloaded, please try again later.", "server_error")


def bad_request(message: str = "Invalid value for 'messages'.") -> Reply:
    """400 invalid_request_error."""
    return _error(400, message, "invalid_request_error")


def context_window_exceeded() -> Reply:
    """400 with OpenAI's ``code: context_length_exceeded`` body."""
    return _error(400, "This model's maximum context length is 8192 tokens. However, your messages resulted in "
                  "9000 tokens. Please reduce the length of the messages.", "invalid_request_error",
                  "context_length_exceeded")


def unauthorized() -> Reply:
    """401 invalid_api_key (the message never echoes the key, unlike OpenAI's)."""
    return _error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")


def slow(seconds: float, then: Reply | None = None) -> Reply:
    """``then`` (a text reply by default), sent only after ``seconds``: for client timeouts."""
    base = then or text_reply("slow answer")
    return Reply(status=base.status, message=base.message, finish_reason=base.finish_reason, error=base.error,
                 headers=base.headers, delay=seconds, empty=base.empty)


def streamed(reply: Reply, *, chunk_chars: int = 4, chunk_delay: float = 0.0) -> Reply:
    """``reply`` streamed in pieces of ``chunk_chars`` characters, ``chunk_delay`` seconds apart."""
    if chunk_chars < 1 or chunk_delay < 0:
        raise ValueError("chunk_chars must be >= 1 and chunk_delay >= 0")
    return replace(reply, chunk_chars=chunk_chars, chunk_delay=chunk_delay)


def broken_stream(reply: Reply, after: int = 3) -> Reply:
    """``reply`` streamed, but the connection closes after ``after`` chunks (no ``[DONE]``)."""
    if after < 1:
        raise ValueError("a broken stream sends at least one chunk (after >= 1)")
    return replace(reply, break_after=after)


def error_chunk(reply: Reply, after: int = 3, message: str = "The server had an error while streaming.") -> Reply:
    """``reply`` streamed, but after ``after`` chunks an error event (``data: {"error": ...}``) ends it."""
    if after < 1:
        raise ValueError("an error chunk comes after at least one chunk (after >= 1)")
    return replace(reply, error_after=after, error={"message": message, "type": "server_error", "param": None,
                                                     "code": None})


def echo_reply(body: dict[str, Any]) -> Reply:
    """Responder: answer with the text of the last message."""
    messages = body.get("messages") or [{}]
    return text_reply(f"echo: {messages[-1].get('content')}")


_TURNS = re.compile(r"turns=(\d+)")
_W1_PAD = "The quick brown fox jumps over the lazy dog. "


def w1_reply(body: dict[str, Any]) -> Reply:
    """Responder for benchmark workload W1 (DESIGN.md), from the messages alone.

    T comes from ``turns=T`` in the first user message (default 10). The turn
    number k is 1 + the number of assistant messages so far; turn k < T answers
    ~200 bytes of text and one call ``add(a=k, b=1)`` (id ``call_<k>``), turn T
    answers "done".
    """
    messages: list[dict[str, Any]] = body.get("messages") or []
    first_user = next((m for m in messages if m.get("role") == "user"), {})
    found = _TURNS.search(str(first_user.get("content") or ""))
    total = int(found.group(1)) if found else 10
    k = 1 + sum(1 for m in messages if m.get("role") == "assistant")
    if k >= total:
        return text_reply("done")
    text = (f"Turn {k} of {total}: adding one. " + _W1_PAD * 5)[:200]
    return tool_reply(call("add", {"a": k, "b": 1}, id=f"call_{k}"), content=text)


# --- the server --------------------------------------------------------------


class FakeOpenAI:
    """The server. ``start()`` binds 127.0.0.1 (port 0: a free one); ``url`` ends in ``/v1``.

    ``requests`` holds every request body received on the completions route,
    ``timestamps`` the matching ``time.monotonic()`` values, ``sent_text``
    each streamed text chunk with the time it was sent.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        self._lock = threading.Lock()
        self._queue: list[Reply | Responder] = []
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests: list[dict[str, Any]] = []
        self.timestamps: list[float] = []
        # (time.monotonic(), text) of every streamed chunk with text, as it was sent.
        self.sent_text: list[tuple[float, str]] = []
        self._connections: set[socket.socket] = set()  # keep-alive connections open now (closed by stop)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *items: Reply | Responder) -> None:
        """Append replies to the queue; a callable item answers every request from then on."""
        with self._lock:
            self._queue.extend(items)

    def reset(self) -> None:
        """Forget the script and the recorded requests."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.timestamps.clear()
            self.sent_text.clear()

    def start(self) -> FakeOpenAI:
        self._server = ThreadingHTTPServer((self._host, self._port), _make_handler(self))
        # Handler threads may sit in a slow reply; they must not block shutdown.
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits for it, once per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-openai",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close what this server's clients left open.

        A keep-alive connection outlives ``shutdown()`` (its handler thread waits for the next request),
        and litellm keeps its client, pooled connection and all, in a module-level cache for the life of
        the process: closed here, or each test's server left an open socket on both sides that the
        interpreter reported as unclosed when the test process exited (stray lines after pytest's summary).
        """
        self._stopping.set()
        port = self._server.server_address[1] if self._server is not None else None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(5)
        if port is not None:
            close_litellm_clients_of(port)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            self.timestamps.append(time.monotonic())
            head = self._queue[0] if self._queue else None
            if isinstance(head, Reply):
                self._queue.pop(0)
        if head is None:
            return bad_request("fake_openai: script exhausted (no reply queued for this request)")
        if isinstance(head, Reply):
            return head
        return head(body)

    def _sent(self, chunk: dict[str, Any]) -> None:
        """Note when a streamed chunk with text went out (for latency measurements)."""
        choices = chunk.get("choices") or [{}]
        text = (choices[0].get("delta") or {}).get("content")
        if text:
            with self._lock:
                self.sent_text.append((time.monotonic(), text))

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


@contextmanager
def running(*, host: str = "127.0.0.1", port: int = 0) -> Iterator[FakeOpenAI]:
    """A started server, stopped on exit."""
    server = FakeOpenAI(host=host, port=port).start()
    try:
        yield server
    finally:
        server.stop()


def _completion(body: dict[str, Any], reply: Reply, n: int) -> dict[str, Any]:
    message = dict(reply.message or {})
    # Rough, deterministic token counts: 4 characters a token.
    prompt_chars = len(json.dumps(body.get("messages") or []))
    completion_chars = len(json.dumps(message))
    choices = [] if reply.empty else [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                                       "logprobs": None}]
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "fake-model",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": completion_chars // 4,
                  "total_tokens": (prompt_chars + completion_chars) // 4},
    }


def _delta_chunk(body: dict[str, Any], n: int, delta: dict[str, Any] | None, finish: str | None = None,
                 usage: dict[str, int] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": f"chatcmpl-fake-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                             "model": body.get("model") or "fake-model", "choices": []}
    if delta is not None:
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _stream_deltas(reply: Reply) -> list[dict[str, Any]]:
    """The deltas of ``reply``'s message, in the order OpenAI streams them."""
    message = dict(reply.message or {})
    content = message.pop("content", None)
    calls = message.pop("tool_calls", None) or []
    message.pop("role", None)
    # Provider extras (reasoning_content and the like) ride on the role chunk.
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "", **message}]
    deltas += [{"content": piece} for piece in _pieces(content or "", reply.chunk_chars)]
    for index, c in enumerate(calls):
        fn = c.get("function") or {}
        deltas.append({"tool_calls": [{"index": index, "id": c.get("id"), "type": "function",
                                       "function": {"name": fn.get("name"), "arguments": ""}}]})
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                   for piece in _pieces(str(fn.get("arguments") or ""), reply.chunk_chars)]
    return deltas


def stream_chunks(body: dict[str, Any], reply: Reply, n: int) -> list[dict[str, Any]]:
    """Every SSE chunk of a streamed ``reply`` (before ``[DONE]``): deltas, the finish, the usage."""
    usage = _completion(body, reply, n)["usage"]
    chunks = [] if reply.empty else [_delta_chunk(body, n, d) for d in _stream_deltas(reply)]
    if not reply.empty:
        chunks.append(_delta_chunk(body, n, {}, finish=reply.finish_reason))
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append(_delta_chunk(body, n, None, usage=usage))
    return chunks


def close_litellm_clients_of(port: int) -> None:
    """Close and forget the clients litellm cached for a server on 127.0.0.1:``port`` (sync ones; an async
    client's connections belong to an event loop that is gone by now and are forgotten with it)."""
    address = f":{port}/"
    litellm = sys.modules.get("litellm")
    cache = getattr(litellm, "in_memory_llm_clients_cache", None)
    entries = getattr(cache, "cache_dict", None)
    if not isinstance(entries, dict):
        return
    for key, client in list(entries.items()):
        if address not in str(getattr(client, "base_url", "")):
            continue
        close = getattr(client, "close", None)
        if callable(close) and not inspect.iscoroutinefunction(close):
            with contextlib.suppress(Exception):
                close()
        entries.pop(key, None)


def _make_handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # Keep-alive like a real API: the SDK pools connections.
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with fake._lock:
                fake._connections.add(self.connection)

        def finish(self) -> None:
            with fake._lock:
                fake._connections.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests read fake.requests; access logs are noise

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def handle(self) -> None:
            # A client that dropped a kept-alive connection (after a broken stream): nothing to serve.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                super().handle()

        def _write_chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, body: dict[str, Any], reply: Reply) -> None:
            chunks = stream_chunks(body, reply, len(fake.requests)) if reply.raw_chunks is None else reply.raw_chunks
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, chunk in enumerate(chunks):
                    if i and reply.chunk_delay:
                        fake._wait(reply.chunk_delay)
                    if i == reply.break_after:
                        # Gone mid-stream: no [DONE], no terminating HTTP chunk.
                        self.close_connection = True
                        return
                    if i == reply.error_after:
                        self._write_chunk(b"data: " + json.dumps({"error": reply.error}).encode() + b"\n\n")
                        break
                    self._write_chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    fake._sent(chunk)
                else:
                    if reply.break_after is not None:  # asked to break later than the reply's end: before [DONE]
                        self.close_connection = True
                        return
                    self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (a killed worker)

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/health", "/v1/models"):
                self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                return
            try:
                reply = fake._next_reply(body)
            except Exception as exc:  # noqa: BLE001 - a broken responder must show up in the test, not hang it
                self._send(500, {"error": {"message": f"fake_openai responder failed: {exc!r}", "type": "fake"}})
                return
            if reply.delay:
                fake._wait(reply.delay)
            if reply.message is not None and body.get("stream"):
                self._stream(body, reply)
            elif reply.message is not None:
                self._send(200, _completion(body, reply, len(fake.requests)), reply.headers)
            else:
                self._send(reply.status, {"error": reply.error or {}}, reply.headers)

    return Handler


_MODES: dict[str, Responder] = {"w1": w1_reply, "echo": echo_reply}


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.fake_openai --port N --mode w1``: serve until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m tests.fake_openai", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback only; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (printed on stdout)")
    parser.add_argument("--mode", choices=sorted(_MODES), default="w1", help="how replies are computed")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("the fake server binds loopback only")
    server = FakeOpenAI(host=args.host, port=args.port)
    server.script(_MODES[args.mode])
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"READY {server.url}", flush=True)
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
