"""A job's stream over real HTTP: uvicorn on 127.0.0.1, read with httpx (and with the `ai` npm package)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from examples.chat.app import build_app
from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Event
from pipelines.streams import turn_texts
from pipelines.testing import ScriptedModel, call, reply
from pipelines.web import sse_response
from tests import node_tools
from tests.streaming_helpers import committed_texts, followed_texts_match, run_to_the_end

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
TEXT = "Order A-1 left the warehouse yesterday and should arrive within two days. " * 4


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def model() -> ScriptedModel:
    return ScriptedModel(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply(
        "Checking.", call("lookup", order="A-1")))


def routes(app: App, heartbeat: float = 15.0) -> Starlette:
    async def stream(request: Request) -> Response:
        fmt = request.query_params.get("format", "parts")
        return sse_response(app, request.path_params["id"], request, format=fmt, heartbeat=heartbeat)  # type: ignore[arg-type]
    return Starlette(routes=[Route("/jobs/{id}/stream", stream)])


@contextmanager
def serve(asgi: Any) -> Iterator[str]:
    """``asgi`` on a real uvicorn server on 127.0.0.1, in a thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def read_events(response: httpx.Response) -> Iterator[tuple[str | None, str]]:
    """(id, data) of each SSE event; comment lines come as (None, ':...')."""
    event_id, data = None, []
    for line in response.iter_lines():
        if line.startswith(":"):
            yield None, line
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield event_id, "\n".join(data)
            event_id, data = None, []


def get_parts(base: str, job_id: str, query: str = "", **headers: str) -> list[Event]:
    with httpx.stream("GET", f"{base}/jobs/{job_id}/stream{query}", headers=headers, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        parts = []
        for event_id, data in read_events(r):
            if event_id is not None:
                part = Event.model_validate_json(data)
                assert part.id == event_id
                parts.append(part)
        return parts


def memory_app() -> App:
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=model(), tools=[lookup])])


@pytest.fixture(params=["memory", "redis"])
def app(request: pytest.FixtureRequest) -> Iterator[App]:
    if request.param == "memory":
        yield memory_app()
        return
    storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="sse")
    # A queue nothing consumes: the tests advance the jobs themselves.
    yield App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="sse-test"),
              agents=[Agent(name="a", model=model(), tools=[lookup])])
    storage.close()


def test_resuming_from_last_event_id_or_cursor_misses_nothing_and_repeats_nothing(app: App) -> None:
    app.run_agent("a", job_id="r1", messages=["where is A-1?"])
    run_to_the_end(app, "r1")
    with serve(routes(app)) as base:
        everything = get_parts(base, "r1")
        assert [p.id for p in everything] == [p.id for p in app.stream("r1")]
        assert everything[-1].type == "job_finished"
        # Each turn's text the replay still carries is the transcript's (on Redis only the last turn's is live).
        texts, committed = turn_texts(everything), committed_texts(app, "r1")
        assert texts and max(texts) == max(committed) and all(committed[t] == texts[t] for t in texts)
        for cut in range(1, len(everything)):
            last = everything[cut - 1].id
            rest = get_parts(base, "r1", **{"Last-Event-ID": last})
            assert [p.id for p in everything[:cut] + rest] == [p.id for p in everything]
        via_query = get_parts(base, "r1", f"?cursor={everything[2].id}")
        assert [p.id for p in via_query] == [p.id for p in everything[3:]]



def test_an_ai_sdk_cursor_older_than_every_part_gets_the_whole_run(app: App) -> None:
    # "0" (or an id whose parts are gone): the client holds nothing these parts rebuild, so all of the run comes.
    app.run_agent("a", job_id="r0", messages=["where is A-1?"])
    run_to_the_end(app, "r0")
    oldest = "0" if isinstance(app.storage, MemoryStorage) else "1-0"  # ids are positions / <ms>-<seq>
    with serve(routes(app)) as base, httpx.stream("GET", f"{base}/jobs/r0/stream?format=ai-sdk",
                                                 headers={"Last-Event-ID": oldest}, timeout=30) as r:
        assert r.status_code == 200
        chunks = [json.loads(data) for event_id, data in read_events(r) if event_id is not None]
    assert chunks[0]["type"] == "start" and chunks[-1] == {"type": "finish", "finishReason": "stop"}
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said == "".join(m["content"] or "" for m in run_messages(app, "r0") if m["role"] == "assistant")


def test_an_ai_sdk_follower_of_a_job_deleted_meanwhile_is_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not a message that just ends as if its run had finished: an error says why.
    import pipelines.streams

    monkeypatch.setattr(pipelines.streams, "_AWAIT", 0.2)  # how soon a quiet follower looks at the job again
    app = memory_app()
    app.run_agent("a", job_id="g1", messages=["where is A-1?"])  # running, no worker: nothing more comes
    threading.Timer(0.5, app.storage.delete_job, args=("g1",)).start()  # behind the App's back
    with serve(routes(app)) as base, httpx.stream("GET", f"{base}/jobs/g1/stream?format=ai-sdk", timeout=30) as r:
        chunks = [data for event_id, data in read_events(r) if not data.startswith(":")]
    assert json.loads(chunks[0])["type"] == "start" and chunks[-1] == "[DONE]"
    assert json.loads(chunks[-3]) == {"type": "error", "errorText": "the job's stream ended before its run did: "
                                                                     "the job no longer exists"}
    assert json.loads(chunks[-2]) == {"type": "finish", "finishReason": "error"}


def test_the_chat_examples_post_streams_the_run_it_started_not_the_latest() -> None:
    # Two POSTs on one conversation: the first one's stream, served after the second continued it, is its run.
    from examples.chat.app import _begin, offline_app

    app = offline_app()
    begun = _begin(app, "chat", {"id": "c", "text": "one"})
    first = begun.start_at
    assert begun.after is None and first == next(iter(app.stream("c", follow=False))).id
    app.drain()
    before = _begin(app, "chat", {"id": "c", "text": "two"}).after
    app.drain()
    _begin(app, "chat", {"id": "c", "text": "three"})  # another client's POST, before the stream is served
    app.drain()
    assert before is not None
    with serve(routes(app)) as base, httpx.stream("GET", f"{base}/jobs/c/stream?format=ai-sdk",
                                                 headers={"Last-Event-ID": before}, timeout=30) as r:
        chunks = [json.loads(data) for event_id, data in read_events(r) if event_id is not None]
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said.startswith("You said: two.") and "three" not in said
    # The first POST of a new conversation, served after the others: its stream starts at the job's first part
    # (no cursor meant "the latest run": the first message was answered with another's reply).
    async def from_first(request: Request) -> Any:
        # The server's start wins over its own ``after`` (a stale one is no 400 then).
        return sse_response(app, "c", request, format="ai-sdk", start_at=first, after="not-a-cursor", hold_text=True)

    with serve(Starlette(routes=[Route("/first", from_first)])) as base, \
            httpx.stream("GET", f"{base}/first", timeout=30) as r:
        chunks = [json.loads(data) for event_id, data in read_events(r) if event_id is not None]
    said = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert said.startswith("You said: one.") and "two" not in said and "three" not in said
    assert [c["type"] for c in chunks].count("start") == 1 and chunks[-1]["type"] == "finish"

def test_a_follower_receives_the_text_live_and_the_response_ends_with_the_job(app: App) -> None:
    app.run_agent("a", job_id="r2", messages=["where is A-1?"])
    worker = threading.Thread(target=run_to_the_end, args=(app, "r2"))
    parts: list[Event] = []
    with serve(routes(app)) as base, httpx.stream("GET", f"{base}/jobs/r2/stream", timeout=30) as r:
        for event_id, data in read_events(r):
            if event_id is None:
                continue
            parts.append(Event.model_validate_json(data))
            if len(parts) == 1:
                worker.start()  # the job runs only once the client is following it
    worker.join(10)
    assert parts[0].type == "job_started" and parts[-1].type == "job_finished"
    assert followed_texts_match(app, "r2", parts)
    if isinstance(app.storage, MemoryStorage):  # it keeps every part: nothing is behind the stream's front
        assert turn_texts(parts) == committed_texts(app, "r2")


def test_bad_cursors_and_unknown_jobs_are_clear_http_errors_and_nothing_is_written(app: App) -> None:
    app.run_agent("a", job_id="short", messages=["hi"])
    app.run_agent("a", job_id="long", messages=["where is A-1?"])
    run_to_the_end(app, "long")
    far = list(app.stream("long"))[-1].id
    before = {j.job_id: j.record.checkpoint for j in app.jobs()}
    with serve(routes(app)) as base:
        for url, headers, status, words in [
            ("/jobs/short/stream", {"Last-Event-ID": "not-a-cursor"}, 400, "cursor"),
            ("/jobs/short/stream?cursor=12x", {}, 400, "cursor"),
            # Past 64 bits: Redis itself refuses the id, which was a StorageError and a 500.
            ("/jobs/short/stream", {"Last-Event-ID": "18446744073709551616-0"}, 400, "is out of range"),
            ("/jobs/short/stream?cursor=0-18446744073709551616&format=ai-sdk", {}, 400, "is out of range"),
            ("/jobs/short/stream", {"Last-Event-ID": far}, 400, "not a part id of job 'short'"),  # another job's
            ("/jobs/nope/stream", {}, 404, "not found"),
            ("/jobs/nope/stream?format=ai-sdk", {}, 404, "not found"),
        ]:
            r = httpx.get(base + url, headers=headers, timeout=10)
            assert r.status_code == status, (url, r.text)
            assert r.headers["content-type"] == "application/json" and words in r.json()["error"]
    assert {j.job_id: j.record.checkpoint for j in app.jobs()} == before
    assert app.get("nope") is None


@pytest.mark.parametrize("cursor", ["18446744073709551616-0", "18446744073709551616", "1_0-0", "\u0661"])
def test_app_stream_refuses_a_cursor_past_64_bits_or_not_ascii_digits_alike_on_every_backend(
        app: App, cursor: str) -> None:
    app.run_agent("a", job_id="c", messages=["hi"])
    with pytest.raises(InvalidInputError, match=r"stream cursor .* (is out of range|is not a part id)"):
        list(app.stream("c", after=cursor, follow=False))
    with pytest.raises(InvalidInputError, match=r"stream cursor .* (is out of range|is not a part id)"):
        list(app.stream("c", after=cursor, timeout=0.01))


class CountingStorage(MemoryStorage):
    """Counts the stream reads; a blocking read waits at most 0.1 s, so a follower reads again and again."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.in_flight = 0
        self.lock = threading.Lock()

    def read_live(self, job_id: str, *, after: str | None = None, block: float | None = None) -> list[Event]:
        with self.lock:
            self.reads += 1
            self.in_flight += 1
        try:
            return super().read_live(job_id, after=after, block=None if block is None else min(block, 0.1))
        finally:
            with self.lock:
                self.in_flight -= 1

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        with self.lock:  # the reads the SSE endpoint makes: async, with no thread held while they wait
            self.reads += 1
            self.in_flight += 1
        try:
            return await super().aread_live(job_id, after=after, block=None if block is None else min(block, 0.1))
        finally:
            with self.lock:
                self.in_flight -= 1


def test_a_client_that_disconnects_stops_the_reads_and_a_quiet_stream_sends_heartbeats() -> None:
    storage = CountingStorage()
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model())])
    app.run_agent("a", job_id="idle", messages=["hi"])  # running, never advanced: the stream stays open
    with serve(routes(app, heartbeat=0.2)) as base:
        with httpx.stream("GET", f"{base}/jobs/idle/stream", timeout=30) as r:
            events = read_events(r)
            assert next(events)[0] is not None  # job_started
            assert next(events) == (None, ": keep-alive")  # nothing happens: a heartbeat
            reads_while_connected = storage.reads
            assert next(events) == (None, ": keep-alive")
            assert storage.reads > reads_while_connected  # the follower keeps reading while the client is there
        deadline = time.monotonic() + 20
        settled = None
        while time.monotonic() < deadline:  # after the client left, the reads stop (no assertion on how fast)
            seen = storage.reads
            time.sleep(0.5)  # five capped reads' time
            if storage.reads == seen and storage.in_flight == 0:
                settled = seen
                break
        assert settled is not None, "the stream kept reading storage after its client disconnected"
        time.sleep(0.5)
        assert storage.reads == settled


# --- the Vercel AI SDK UI message stream ---------------------------------------------------------
def ai_sdk_chunks(base: str, path: str) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    with httpx.stream("GET", base + path, timeout=30) as r:
        assert r.status_code == 200
        chunks = [json.loads(d) for i, d in read_events(r) if i is not None or not d.startswith(":")
                  if d != "[DONE]"]
        return r.headers, chunks


def test_ai_sdk_format_has_the_protocol_header_and_one_step_per_turn(app: App) -> None:
    # A turn whose text deltas are gone (an earlier run's, or the live stream expired) sends its text from the
    # transcript with its turn_committed; here the run's every part is kept.
    app.run_agent("a", job_id="c1", messages=["where is A-1?"])
    run_to_the_end(app, "c1")
    with serve(routes(app)) as base:
        headers, chunks = ai_sdk_chunks(base, "/jobs/c1/stream?format=ai-sdk")
    assert headers["x-vercel-ai-ui-message-stream"] == "v1"
    types = [c["type"] for c in chunks]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("start-step") == types.count("finish-step") == 2
    tool_in = next(c for c in chunks if c["type"] == "tool-input-available")
    assert tool_in["toolName"] == "lookup" and tool_in["input"] == {"order": "A-1"}
    tool_out = next(c for c in chunks if c["type"] == "tool-output-available")
    assert tool_out["toolCallId"] == tool_in["toolCallId"] and tool_out["output"] == "order A-1: shipped"
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "Checking." + TEXT


def run_node(api: str, chat_id: str, transcript: list[dict[str, Any]]) -> str:
    if (reason := node_tools.skip_reason()) is not None:  # no node, or node without npm: skipped, said once
        pytest.skip(reason)
    if not node_tools.installed():
        pytest.fail("tests/node has no node_modules: run `make node-deps` (npm ci in tests/node)")
    out = subprocess.run(["node", str(NODE_DIR / "read_ui_message.mjs"), api, chat_id, json.dumps(transcript)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def run_messages(app: App, job_id: str) -> list[dict[str, Any]]:
    """The latest run's committed messages after its user message."""
    msgs = app.messages(job_id)
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    return msgs[last_user + 1:]


def test_the_ai_packages_own_reader_assembles_exactly_the_transcript_of_the_latest_run() -> None:
    app = memory_app()
    with serve(build_app(app, agent="a")) as base:
        app.run_agent("a", job_id="chat-1", messages=["where is A-1?"])
        app.drain()
        run_node(base + "/chat", "chat-1", run_messages(app, "chat-1"))
        app.run_agent("a", job_id="chat-1", user="and A-2?")  # the conversation goes on: a second answer
        app.drain()
        run_node(base + "/chat", "chat-1", run_messages(app, "chat-1"))


def test_the_ai_packages_own_reader_assembles_a_finished_redis_conversation_whose_live_stream_expired(
        redis_url: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="sse-node")
    app = App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="sse-node"),
              agents=[Agent(name="a", model=model(), tools=[lookup])])
    try:
        with serve(build_app(app, agent="a")) as base:
            app.run_agent("a", job_id="chat-r", messages=["where is A-1?"])
            run_to_the_end(app, "chat-r")
            storage.client.delete(storage.keys("chat-r").live)  # as live_ttl after the job finished does
            # Only the durable events are left: each turn's text comes from the transcript (turn_committed).
            assert not any(p.type == "text_delta" for p in app.stream("chat-r", follow=False))
            run_node(base + "/chat", "chat-r", run_messages(app, "chat-r"))
    finally:
        storage.close()


@pytest.mark.parametrize("abandoned", ["I think the answer is probably something like " * 6, TEXT + " And more."],
                         ids=["something-else", "more-than-the-answer"])
def test_a_retried_stream_that_says_something_else_still_assembles_to_the_transcript(abandoned: str) -> None:
    # The second case: the retry's whole answer is a prefix of what the broken attempt said, which the client
    # must not keep once the turn committed.
    from phases.model import ModelRequest, ModelResponse
    from pipelines.engine.models import Usage

    started = threading.Event()

    class BreaksOnce:
        def complete(self, request: ModelRequest) -> ModelResponse:
            started.wait(10)  # the client is connected: what follows reaches it live
            assert request.on_delta is not None and request.on_restart is not None
            request.on_delta(abandoned)
            time.sleep(0.1)  # published (past the first batch's window) before the stream breaks
            request.on_restart()  # the provider's stream broke; the retry says something else
            request.on_delta(TEXT)
            return ModelResponse(message={"role": "assistant", "content": TEXT}, finish_reason="stop",
                                 usage=Usage(model_calls=2))

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=BreaksOnce(), stream_retries=2)])
    chat = build_app(app, agent="a")

    async def marking(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/stream"):
            threading.Timer(0.3, started.set).start()  # soon after the stream opened
        await chat(scope, receive, send)

    app.run_agent("a", job_id="chat-2", messages=["hi"])
    worker = threading.Thread(target=app.drain)
    worker.start()
    with serve(marking) as base:
        try:
            run_node(base + "/chat", "chat-2", [{"role": "assistant", "content": TEXT}])
        finally:
            started.set()
            worker.join(10)
        assert run_messages(app, "chat-2") == [{"role": "assistant", "content": TEXT}]
        run_node(base + "/chat", "chat-2", run_messages(app, "chat-2"))  # and replayed once finished
