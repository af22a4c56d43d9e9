"""The AI SDK stream cut after any chunk and resumed, read by the `ai` npm package itself (tests/node/chat_cuts.mjs).

Every chunk of the ``ai-sdk`` format carries an ``id:`` (``<part id>:<k>``), so a client cut off
after any chunk resumes with ``Last-Event-ID`` and assembles exactly the transcript: through the
package's own reader (``readUIMessageStream``) on a finished run, and through ``AbstractChat``
(``sendMessage``, a dropped connection, ``resumeStream()``) on a run that is going on.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.base import Storage
from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from adapters.sqlite import SQLiteStorage
from examples.chat.app import build_app
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App, tool
from pipelines.engine.models import Message, Usage
from pipelines.testing import ScriptedModel, call, reply
from tests import node_tools
from tests.integration.test_sse import NODE_DIR, lookup, serve

TEXT = "Order A-1 left the warehouse yesterday; it should arrive within two days."


class SlowModel(ScriptedModel):
    """The scripted answers, each piece of text a little after the last: the run goes on while it is read."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        if request.on_delta is None:
            return super().complete(request)
        on_delta = request.on_delta

        def slowly(piece: str) -> None:
            time.sleep(0.01)
            on_delta(piece)
        return super().complete(dataclasses.replace(request, on_delta=slowly))


def chat_app(model: ScriptedModel | None = None) -> App:
    model = model or ScriptedModel(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply(
        "Checking.", call("lookup", order="A-1")))
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model,
                                                                                     tools=[lookup])])


def node(*args: str) -> Any:
    if (reason := node_tools.skip_reason()) is not None:
        pytest.skip(reason)
    if not node_tools.installed():
        pytest.fail("tests/node has no node_modules: run `make node-deps` (npm ci in tests/node)")
    out = subprocess.run(["node", str(NODE_DIR / "chat_cuts.mjs"), *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr + out.stdout
    return json.loads(out.stdout)


def expected_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The UI message parts a run's committed messages make: per assistant message a step, its text, its tools."""
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    parts: list[dict[str, Any]] = []
    for m in (m for m in messages if m["role"] == "assistant"):
        parts.append({"type": "step-start"})
        if m.get("content"):
            parts.append({"type": "text", "text": m["content"], "state": "done"})
        for c in m.get("tool_calls") or []:
            part = {"type": f"tool-{c['function']['name']}", "toolCallId": c["id"], "input":
                    json.loads(c["function"]["arguments"]), "state": "input-available"}
            if c["id"] in results:
                part.update(state="output-available", output=results[c["id"]])
            parts.append(part)
    return parts


def run_messages(app: App, job_id: str) -> list[dict[str, Any]]:
    msgs = app.messages(job_id)
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    return msgs[last_user + 1:]


def test_a_finished_run_cut_after_any_chunk_and_resumed_by_last_event_id_assembles_the_transcript() -> None:
    app = chat_app()
    app.run_agent("a", job_id="done", messages=["where is A-1?"])
    app.drain()
    app.run_agent("a", job_id="done", user="and again?")  # a second run: the cursor's run is the one resumed
    app.drain()
    want = expected_parts(run_messages(app, "done"))
    assert [p["type"] for p in want].count("step-start") == 2
    with serve(build_app(app, agent="a")) as base:
        result = node("reader", base + "/chat", "done")
    assert result["events"] >= 13
    wrong = [(c["cut"], c["after"], c["errors"], c["parts"]) for c in result["cuts"]
             if c["status"] != 200 or c["errors"] or c["parts"] != want]
    assert wrong == [], f"{len(wrong)} of {result['events']} cut points assembled something else"


KINDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis)]


def storage_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if kind == "sqlite":
        sqlite = SQLiteStorage(str(tmp_path / "chat.db"))
        request.addfinalizer(sqlite.close)
        return sqlite
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        return RedisStorage.from_url(url, prefix=f"chatcuts-{request.node.originalname}")
    return MemoryStorage()


@pytest.mark.parametrize("kind", KINDS)
def test_a_live_run_dropped_after_any_chunk_and_resumed_by_abstract_chat_holds_the_transcript(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # Resumed ~200 ms after the drop (the client notices it late), when later turns have committed: Redis and
    # SQLite keep the run's every part until the next run starts, so the client's cursor is rebuilt there too.
    storage = storage_of(kind, request, tmp_path)
    model = SlowModel(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply(
        "Checking the order.", call("lookup", order="A-1")))
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, tools=[lookup])])
    with serve(build_app(app, agent="a")) as base:
        results = node("chat", base + "/chat", "live", "where is A-1?")
    assert len(results) >= 13 and not results[-1]["dropped"] and all(r["dropped"] for r in results[:-1])
    wrong = []
    for r in results:
        want = [{"role": "user", "parts": [{"type": "text", "text": "where is A-1?"}]},
                {"role": "assistant", "parts": expected_parts(run_messages(app, f"live-{r['cut']}"))}]
        if r["errors"] != ([] if not r["dropped"] else r["errors"][:1]) or r["status"] != "ready" \
                or r["messages"] != want:
            wrong.append((r["cut"], r["after"], r["errors"], r["messages"]))
    assert all("network error" in r["errors"][0] for r in results if r["dropped"])
    assert wrong == [], f"{len(wrong)} of {len(results)} cut points ended wrong: {wrong[:3]}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_dropped_and_resumed_after_a_message_sent_during_its_last_turn_started_the_next(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # The message ends the run and starts the next in one commit (done_and_continued): the live stream keeps the
    # run before the one in flight, so the chat still resumes the first run's message where it dropped.
    sent: set[str] = set()
    holder: dict[str, App] = {}

    def answer(msgs: list[Message]) -> Any:
        if msgs[-1]["role"] == "user" and msgs[-1].get("content") == "one more":
            return "Anything else?"
        if msgs[-1]["role"] == "tool":
            app = holder["app"]
            job = next(j for j in (f"dc-{k}" for k in range(1, 100)) if j not in sent
                       and app.storage.get_job(j) is not None and app.messages(j)[-1]["role"] == "tool")
            sent.add(job)
            app.send(job, ["one more"])  # another tab, while this final answer is being written
            return TEXT
        return reply("Checking the order.", call("lookup", order="A-1"))

    app = holder["app"] = App(storage=storage_of(kind, request, tmp_path), scheduler=MemoryScheduler(),
                              agents=[Agent(name="a", model=SlowModel(answer), tools=[lookup])])
    with serve(build_app(app, agent="a")) as base:
        results = node("chat", base + "/chat", "dc", "where is A-1?")
    wrong = []
    for r in results:
        msgs = app.messages(f"dc-{r['cut']}")
        first_run = msgs[1:next(i for i, m in enumerate(msgs) if m.get("content") == "one more")]
        want = [{"role": "user", "parts": [{"type": "text", "text": "where is A-1?"}]},
                {"role": "assistant", "parts": expected_parts(first_run)}]
        if r["status"] != "ready" or r["messages"] != want:
            wrong.append((r["cut"], r["after"], [m["role"] for m in r["messages"]]))
    assert len(results) >= 13 and wrong == [], f"{len(wrong)} of {len(results)} cut points ended wrong: {wrong[:4]}"


# --- a call waiting for approval --------------------------------------------------------------------
@tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


def refunding(msgs: list[Message]) -> Any:
    last = msgs[-1]
    if last["role"] == "tool":
        return f"Result: {last['content']}"
    return reply("I will refund order A-1.", call("refund", order="A-1"))


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_a_call_waiting_for_approval_is_answered_through_abstract_chat_and_the_run_goes_on_in_the_same_message(
        verdict: str) -> None:
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(refunding), tools=[refund])])
    with serve(build_app(app, agent="a")) as base:
        got = node("approve", base + "/chat", f"r-{verdict}", "refund A-1 please", verdict, "not this one")
        replayed = node("reader", base + "/chat", f"r-{verdict}")  # the finished run, cut and resumed anywhere
    assert got["errors"] == []
    call_id = app.messages(f"r-{verdict}")[1]["tool_calls"][0]["id"]
    user = {"role": "user", "parts": [{"type": "text", "text": "refund A-1 please"}]}
    said = [{"type": "step-start"}, {"type": "text", "text": "I will refund order A-1.", "state": "done"}]
    asked = {"type": "tool-refund", "toolCallId": call_id, "input": {"order": "A-1"}}
    assert got["asked"] == [user, {"role": "assistant", "parts": [
        *said, {**asked, "state": "approval-requested", "approval": {"id": call_id}}]}]
    approved = verdict == "approve"
    answer = {"id": call_id, "approved": approved, "reason": "not this one"}
    assert got["responded"][1]["parts"][-1] == {**asked, "state": "approval-responded", "approval": answer}
    # The run went on in the same message: the call's outcome, then the next turn; nothing twice.
    result = app.messages(f"r-{verdict}")[2]["content"]
    tool_part = ({**asked, "state": "output-available", "output": "refunded A-1", "approval": answer} if approved
                 else {**asked, "state": "output-denied", "approval": answer})
    assert got["after"] == [user, {"role": "assistant", "parts": [
        *said, tool_part, {"type": "step-start"}, {"type": "text", "text": f"Result: {result}", "state": "done"}]}]
    # A replay knows the call was asked about (not what was answered: the SDK's answer stays on its side).
    tool_part["approval"] = {"id": call_id}
    want = [*said, tool_part, {"type": "step-start"}, {"type": "text", "text": f"Result: {result}", "state": "done"}]
    assert [c["cut"] for c in replayed["cuts"] if c["parts"] != want or c["errors"]] == []
    assert app.get(f"r-{verdict}").status.value == "complete"
    assert ("not this one" in result) is not approved  # a rejection's reason reached the model


def test_calls_waiting_for_approval_answered_one_at_a_time_each_end_their_send() -> None:
    # A decision that left the job waiting on the other call kept the send's stream open for ever.
    def paying(msgs: list[Message]) -> Any:
        if msgs[-1]["role"] == "tool":
            return "Both refunded."
        return reply("Refunding both.", call("refund", order="A-1"), call("refund", order="A-2"))

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(paying), tools=[refund])])
    with serve(build_app(app, agent="a")) as base:
        got = node("approve-each", base + "/chat", "two", "refund both")
    assert got["errors"] == []
    assert [s["status"] for s in got["steps"]] == ["ready", "ready"]
    first = [p for p in got["steps"][0]["parts"] if p["type"] == "tool-refund"]
    assert [p["state"] for p in first] == ["approval-responded", "approval-requested"]  # still waits on A-2
    assert app.get("two").status.value == "complete"
    assert got["after"][-1]["parts"][-1] == {"type": "text", "text": "Both refunded.", "state": "done"}
    outputs = [p.get("output") for p in got["after"][-1]["parts"] if p["type"] == "tool-refund"]
    assert outputs == ["refunded A-1", "refunded A-2"]


def test_use_chats_resume_of_a_chat_with_no_run_yet_is_nothing_to_resume() -> None:
    # The stream route answered 404 (the job is unknown): the AI SDK's reconnect takes 204 as "nothing to resume"
    # and anything else as an error, so useChat({resume: true}) on a new chat ended in an error.
    app = chat_app()
    with serve(build_app(app, agent="a")) as base:
        got = node("resume-new", base + "/chat", "brand-new")
    assert got == {"status": "ready", "messages": 0, "errors": []}
    assert app.get("brand-new") is None


def test_the_chat_examples_post_refuses_what_it_cannot_take_before_anything_starts() -> None:
    import httpx

    app = chat_app()
    deep: str = '{"id": "d", "text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    cases: list[tuple[dict[str, Any], int, str]] = [
        # Another site's page: a form cannot send JSON; an Origin other than this server is refused.
        ({"content": '{"id": "x1", "text": "hi"}', "headers": {"content-type": "text/plain"}}, 415, "JSON body"),
        ({"json": {"id": "x2", "text": "hi"}, "headers": {"origin": "https://evil.example"}}, 403, "cross-site"),
        ({"json": {"id": "x3", "messages": 5}}, 400, "needs the user's"),
        ({"json": {"id": "x4", "messages": [{"role": "user", "parts": 5}]}}, 400, "needs the user's"),
        ({"json": {"id": "x5", "messages": [{"role": "user", "parts": [{"type": "text", "text": {"a": 1}}]}]}},
         400, "needs the user's"),
        ({"json": {"id": "x6", "messages": [{"role": "assistant", "parts": 7}]}}, 400, "needs the user's"),
        ({"content": deep, "headers": {"content-type": "application/json"}}, 400, "must be JSON"),
        # Refused before the run starts: a client that retries the POST would send its message twice.
        ({"json": {"id": "x7", "text": "hi"}, "params": {"format": "bogus"}}, 400, "format must be"),
        ({"json": {"id": "x8", "text": "hi"}, "params": {"cursor": "garbage"}}, 400, "streams the run it starts"),
    ]
    with serve(build_app(app, agent="a")) as base:
        for kwargs, status, text in cases:
            response = httpx.post(base + "/chat", timeout=30, **kwargs)
            assert (response.status_code, text in response.text) == (status, True), (kwargs, response.text)
        same_site = httpx.post(base + "/chat", json={"id": "ok", "text": "hi", "stream": False}, timeout=30,
                               headers={"origin": base})
        assert same_site.status_code == 202
    assert [r.job_id for r in app.storage.list_jobs(limit=100)] == ["ok"]  # nothing else was started


# --- a retried attempt that says something else ----------------------------------------------------
class SaysSomethingElse:
    """A provider stream that breaks once, after some text; the retry says something else."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        assert request.on_delta is not None and request.on_restart is not None
        for word in ("I think ", "the answer ", "is probably "):
            request.on_delta(word)
            time.sleep(0.02)
        request.on_restart()
        for i in range(0, len(TEXT), 10):
            request.on_delta(TEXT[i:i + 10])
            time.sleep(0.02)
        return ModelResponse(message={"role": "assistant", "content": TEXT}, finish_reason="stop",
                             usage=Usage(model_calls=2))


def test_use_chats_send_path_shows_only_the_attempt_that_committed() -> None:
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=SaysSomethingElse(), stream_retries=2)])  # type: ignore[arg-type]
    with serve(build_app(app, agent="a")) as base:
        sent = node("send", base + "/chat", "retried", "hi")
        replayed = node("reader", base + "/chat", "retried")  # the resume path, cut anywhere, streams it live
    committed = app.messages("retried")[-1]["content"]
    assert committed.startswith("Order A-1") and "probably" not in committed
    assert sent["errors"] == [] and sent["status"] == "ready"
    assert sent["messages"] == [{"role": "user", "parts": [{"type": "text", "text": "hi"}]},
                                {"role": "assistant", "parts": [{"type": "step-start"},
                                                                {"type": "text", "text": committed, "state": "done"}]}]
    want = [{"type": "step-start"}, {"type": "text", "text": committed, "state": "done"}]
    assert [c["cut"] for c in replayed["cuts"] if c["parts"] != want or c["errors"]] == []


def test_use_chats_resume_after_a_retried_attempt_replaces_the_message_it_holds() -> None:
    """useChat's resume (DefaultChatTransport as it comes: no cursor, the answer replays the whole message)
    after the send path dropped and a retried attempt said something else: one assistant message, the
    attempt that committed, under the run's one messageId (a new id would add a second message)."""
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=SaysSomethingElse(), stream_retries=2)])  # type: ignore[arg-type]
    with serve(build_app(app, agent="a")) as base:
        results = node("replay", base + "/chat", "again", "hi", "800")
    assert len(results) >= 3 and all(r["dropped"] for r in results[:-1]) and not results[-1]["dropped"]
    wrong = []
    for r in results:
        committed = app.messages(f"again-{r['cut']}")[-1]["content"]
        assert committed == TEXT
        want = [{"role": "user", "parts": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "parts": [{"type": "step-start"},
                                                {"type": "text", "text": committed, "state": "done"}]}]
        if r["status"] != "ready" or r["messages"] != want:
            wrong.append((r["cut"], r["errors"], r["messages"]))
    assert wrong == [], f"{len(wrong)} of {len(results)} cut points ended wrong: {wrong[:3]}"


@pytest.mark.parametrize("kind", KINDS)
def test_a_finished_run_read_before_its_live_parts_went_and_resumed_after_assembles_the_transcript(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # After live_ttl a finished job's stream holds only its events: a turn_committed then sends the turn's text
    # whole, so its chunks are numbered otherwise than when the text had come live. A client cut after the
    # text-end (`<turn_committed>:0`) was sent the text again, and readUIMessageStream failed ("text-delta for
    # missing text part"). Memory keeps every part: there the stream is as it was.
    now = [time.time()]
    storage: Storage
    if kind == "sqlite":
        storage = SQLiteStorage(str(tmp_path / "ttl.db"), clock=lambda: now[0], live_ttl=60)
        request.addfinalizer(storage.close)
    elif kind == "redis":
        storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="ttl-cuts", live_ttl=120)
    else:
        storage = MemoryStorage()
    model = ScriptedModel(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply(
        "Checking.", call("lookup", order="A-1")))
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, tools=[lookup])])
    app.run_agent("a", job_id="ttl", messages=["where is A-1?"])
    app.drain()
    assert any(p.type == "text_delta" for p in app.stream("ttl", follow=False))
    with serve(build_app(app, agent="a")) as base:
        held = tmp_path / "held.txt"
        held.write_text(httpx.get(f"{base}/chat/ttl/stream", timeout=30).text)
        if isinstance(storage, SQLiteStorage):
            now[0] += 61
            storage.reap_dead_processes()  # where SQLite drops a finished job's live parts
        elif isinstance(storage, RedisStorage):
            storage.client.delete(storage.keys("ttl").live)  # as when live_ttl has run out
        assert any(p.type == "text_delta" for p in app.stream("ttl", follow=False)) == (kind == "memory")
        result = node("reader-held", base + "/chat", "ttl", str(held))
    want = expected_parts(run_messages(app, "ttl"))
    wrong = [(c["cut"], c["after"], c["errors"], c["parts"]) for c in result["cuts"]
             if c["status"] != 200 or c["errors"] or c["parts"] != want]
    assert result["events"] >= 13 and wrong == [], f"{len(wrong)} of {result['events']} cut points: {wrong[:2]}"
