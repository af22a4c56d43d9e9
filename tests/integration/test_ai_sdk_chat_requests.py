"""What ``POST /chat`` of examples/chat does with the requests ``useChat`` sends besides a new message.

Each scenario runs a real uvicorn server; the client is the `ai` npm package itself (tests/node/chat_cuts.mjs)
where ``useChat`` makes the request, and httpx where a crafted request is the point.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from examples.chat.app import build_app
from phases.compaction import MARKER_KEY, Compaction
from pipelines import Agent, App, tool
from pipelines.engine.errors import PermanentModelError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply
from tests.integration.test_ai_sdk_resume import KINDS, node, refund, refunding, storage_of
from tests.integration.test_sse import lookup, serve


@tool(needs_approval=True)
def wire_money(amount: int) -> str:
    """Wire money (the finance team approves)."""
    return f"wired {amount}"


def two_agents(storage: Any) -> App:
    """The chat agent the endpoint serves, and another agent (``treasury``) in the same App."""
    treasury = ScriptedModel([reply("Wiring.", call("wire_money", amount=10**6)), "done"])
    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(refunding), tools=[refund]),
                       Agent(name="treasury", model=treasury, tools=[wire_money])])


@pytest.mark.parametrize("kind", KINDS)
def test_an_approval_for_a_call_of_another_agents_job_is_refused_and_the_call_still_waits(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    app = two_agents(storage_of(kind, request, tmp_path))
    app.run_agent("treasury", job_id="pay", messages=["pay the vendor"])
    app.drain()
    call_id = app.get("pay").pending_calls[0]["call_id"]
    answered = {"type": "tool-wire_money", "toolCallId": call_id, "state": "approval-responded",
                "approval": {"id": call_id, "approved": True}}
    body: dict[str, Any] = {"id": "pay", "messages": [{"id": "m", "role": "assistant", "parts": [answered]}]}
    with serve(build_app(app, agent="a")) as base:
        sent = httpx.post(base + "/chat", json={**body, "stream": False}, timeout=30)
        streamed = httpx.post(base + "/chat", json=body, timeout=30)  # answered at once, not a stream left open
    assert (sent.status_code, streamed.status_code) == (409, 409)
    assert "a job of 'treasury', not 'a'" in sent.json()["error"]
    app.drain()
    view = app.get("pay")
    assert view.status.value == "waiting" and [c["call_id"] for c in view.pending_calls] == [call_id]
    assert [m for m in app.messages("pay") if m["role"] == "tool"] == []


def test_a_request_under_a_name_the_chat_was_not_given_is_refused_as_dns_rebinding() -> None:
    # A page of attacker.example whose name now resolves to 127.0.0.1: same-origin as far as the browser knows.
    app = two_agents(MemoryStorage())
    app.run_agent("a", job_id="mine", messages=["refund A-1 please"])
    app.drain()
    with serve(build_app(app, agent="a")) as base, serve(build_app(app, agent="a", hosts=["Chat.Example"])) as named:
        port, named_port = base.rsplit(":", 1)[1], named.rsplit(":", 1)[1]
        rebound = {"host": f"attacker.example:{port}", "origin": f"http://attacker.example:{port}"}
        posted = httpx.post(base + "/chat", json={"id": "new", "text": "hi", "stream": False}, headers=rebound,
                            timeout=30)
        read = httpx.get(base + "/chat/mine/stream", headers=rebound, timeout=30)
        page = httpx.get(base + "/", headers=rebound, timeout=30)
        local = httpx.get(f"http://localhost:{port}/chat/mine/stream", timeout=30)
        given = {"host": f"chat.example:{named_port}", "origin": f"http://chat.example:{named_port}"}
        taken = httpx.post(named + "/chat", json={"id": "new", "text": "hi", "stream": False}, headers=given,
                           timeout=30)
    assert (posted.status_code, read.status_code, page.status_code) == (403, 403, 403)
    assert "'attacker.example'" in posted.json()["error"]
    assert (local.status_code, taken.status_code) == (200, 202)  # loopback names, and the names it was given
    assert sorted(r.job_id for r in app.storage.list_jobs(limit=10)) == ["mine", "new"]  # "new" is the named one


@pytest.mark.parametrize("kind", KINDS)
def test_a_tab_that_answers_a_call_another_tab_decided_gets_that_calls_run_not_a_later_one(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # Tab 2 approved the call, the run ended, and the chat went on to a second call, approved too; tab 1 then
    # answered the first call. It was streamed the second run's rest: "No tool invocation found".
    app = two_agents(storage_of(kind, request, tmp_path))
    with serve(build_app(app, agent="a")) as base:
        got = node("stale-approve", base + "/chat", "tabs")
    assert got["errors"] == [] and (got["oneStatus"], got["twoStatus"]) == ("ready", "ready")
    msgs = app.messages("tabs")
    first, second = (m["tool_calls"][0]["id"] for m in msgs if m.get("tool_calls"))
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"] * 2  # nothing done twice
    assert msgs[2]["content"] == "refunded A-1" and app.get("tabs").status.value == "complete"
    asked = {"type": "tool-refund", "toolCallId": first, "input": {"order": "A-1"}}
    answer = {"id": first, "approved": True}
    assert got["one"] == [
        {"role": "user", "parts": [{"type": "text", "text": "refund A-1"}]},
        {"role": "assistant", "parts": [
            {"type": "step-start"}, {"type": "text", "text": "I will refund order A-1.", "state": "done"},
            {**asked, "state": "output-available", "output": "refunded A-1", "approval": answer},
            {"type": "step-start"}, {"type": "text", "text": msgs[3]["content"], "state": "done"}]}]
    assert got["two"][-1]["parts"][2]["toolCallId"] == second  # tab 2 holds the second run, as it was


def test_two_tabs_answering_one_call_at_the_same_moment_both_get_its_run_not_a_409() -> None:
    # Each POST's storage work runs on a thread of its own: both read the call as pending, one decided it, and
    # the other's approve raised "already approved (by another caller)" as a 409.
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(refunding), tools=[refund])])
    app.run_agent("a", job_id="both", messages=["refund A-1"])
    app.drain()
    call_id = app.get("both").pending_calls[0]["call_id"]  # type: ignore[union-attr]
    both_read = threading.Barrier(2)
    for name in ("approve", "reject"):
        real = getattr(app, name)

        def decided_together(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            both_read.wait(10)  # each POST has read the call as pending: now both decide it
            return _real(*args, **kwargs)
        setattr(app, name, decided_together)

    def answer(approved: bool) -> dict[str, Any]:
        part = {"type": "tool-refund", "toolCallId": call_id, "state": "approval-responded",
                "approval": {"id": call_id, "approved": approved}}
        return {"id": "both", "stream": False, "messages": [{"id": "m", "role": "assistant", "parts": [part]}]}

    got: list[httpx.Response] = []
    with serve(build_app(app, agent="a")) as base:
        tabs = [threading.Thread(target=lambda ok=ok: got.append(httpx.post(base + "/chat", json=answer(ok),
                                                                             timeout=30))) for ok in (True, False)]
        for tab in tabs:
            tab.start()
        for tab in tabs:
            tab.join()
    assert sorted(r.status_code for r in got) == [202, 202], [r.text for r in got]


def test_an_answer_to_a_call_the_stream_no_longer_holds_is_refused_not_answered_with_another_run() -> None:
    # Decided elsewhere and that run's parts gone (live_ttl, or runs since): the latest run is not its message.
    app = two_agents(MemoryStorage())
    app.run_agent("a", job_id="gone", messages=["refund A-1"])
    app.drain()
    app.approve("gone", app.get("gone").pending_calls[0]["call_id"])
    app.drain()
    answered = {"type": "tool-refund", "toolCallId": "call_of_a_run_gone", "state": "approval-responded",
                "approval": {"id": "call_of_a_run_gone", "approved": True}}
    with serve(build_app(app, agent="a")) as base:
        response = httpx.post(base + "/chat", json={"id": "gone", "messages": [
            {"id": "m", "role": "assistant", "parts": [answered]}]}, timeout=30)
    assert response.status_code == 409 and "decided already" in response.json()["error"]


def counting_app() -> App:
    """An agent whose every answer says how many it gave: a regenerated answer is told apart."""
    said: list[str] = []

    def answer(msgs: list[Message]) -> str:
        said.append(f"answer {len(said) + 1} to {msgs[-1]['content']}")
        return said[-1]
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(answer))])


def said(*texts: str) -> list[dict[str, Any]]:
    """The UI messages of a conversation that alternates user and assistant texts."""
    return [{"role": role, "parts": [{"type": "text", "text": t}] if role == "user" else
             [{"type": "step-start"}, {"type": "text", "text": t, "state": "done"}]}
            for role, t in zip(["user", "assistant"] * len(texts), texts, strict=False)]


def test_use_chats_regenerate_runs_the_latest_answer_again_and_the_server_holds_what_the_client_shows() -> None:
    # The POST took the regenerate as a new message: the server held "hello" twice and both answers.
    app = counting_app()
    with serve(build_app(app, agent="a")) as base:
        got = node("regenerate", base + "/chat", "regen", "hello")
    assert got["sent"] == said("hello", "answer 1 to hello")
    assert got["latest"] == {"status": "ready", "errors": [], "messages": said("hello", "answer 2 to hello")}
    assert [(m["role"], m["content"]) for m in app.messages("regen")] == [
        ("user", "hello"), ("assistant", "answer 2 to hello")]


def test_use_chats_regenerate_of_an_earlier_answer_is_refused_and_the_conversation_kept() -> None:
    app = counting_app()
    with serve(build_app(app, agent="a")) as base:
        got = node("regenerate", base + "/chat", "earlier", "hello", "and then?")
    assert got["latest"]["messages"] == said("hello", "answer 1 to hello", "and then?", "answer 3 to and then?")
    assert got["earlier"]["status"] == "error"
    assert "only the latest answer" in got["earlier"]["errors"][0]  # what the client shows
    assert [m["content"] for m in app.messages("earlier")] == [
        "hello", "answer 1 to hello", "and then?", "answer 3 to and then?"]


def said_by(app: App, job_id: str) -> list[str]:
    return [f"{m['role']}: {m['content']}" for m in app.messages(job_id)]


def test_use_chats_edit_of_a_sent_message_is_refused_and_the_client_cannot_go_on_from_the_edit() -> None:
    # The POST took sendMessage({text, messageId}) as a new message: the client showed the edit alone, the server
    # went on from "hello" and its answer. Then a Retry (regenerate()) or a new message answered "hello" while the
    # client showed "goodbye": each is refused until the client reloads the conversation.
    app = counting_app()
    with serve(build_app(app, agent="a")) as base:
        retry = node("edits", base + "/chat", "edit-retry", "edit-then-retry")
        send = node("edits", base + "/chat", "edit-send", "edit-then-send")
    for steps in (retry, send):
        assert steps[0]["texts"][0] == "user: hello" and steps[0]["status"] == "ready"
        assert steps[1]["status"] == "error" and "cannot be edited" in steps[1]["errors"][0]
        assert steps[2]["status"] == "error" and "reload the conversation" in steps[2]["errors"][0]
    assert said_by(app, "edit-retry") == ["user: hello", "assistant: answer 1 to hello"]
    assert said_by(app, "edit-send") == ["user: hello", "assistant: answer 2 to hello"]


def test_use_chats_edit_or_resend_of_a_message_the_server_never_got_is_a_new_message() -> None:
    # The edit's refusal took any sendMessage naming the last user message: a message lost to the network and
    # then edited, or sent again by sendMessage(), was refused, and never reached the conversation.
    app = counting_app()
    with serve(build_app(app, agent="a")) as base:
        edited = node("edits", base + "/chat", "lost-edit", "failed-then-edit")
        resent = node("edits", base + "/chat", "lost-resend", "failed-then-resend")
    assert edited[-1] == {"status": "ready", "errors": [], "texts": [
        "user: hello", "assistant: answer 1 to hello", "user: refund A-2", "assistant: answer 2 to refund A-2"]}
    assert said_by(app, "lost-edit") == edited[-1]["texts"]
    assert resent[-1] == {"status": "ready", "errors": [], "texts": ["user: hello", "assistant: answer 3 to hello"]}
    assert said_by(app, "lost-resend") == resent[-1]["texts"]


def slow_first_answer(msgs: list[Message]) -> Any:
    """A long first turn (the client stops it); an order is looked up, which takes a second turn."""
    last = msgs[-1]
    if last["role"] == "tool":
        return "It has shipped."
    if last.get("content") in ("hello", "where is A-1?"):
        time.sleep(1.5)
        return "Hello there." if last["content"] == "hello" else reply("Checking.", call("lookup", order="A-1"))
    return f"You said: {last.get('content')}"


@pytest.mark.parametrize(("kind", "first"), [
    ("memory", "hello"), ("sqlite", "hello"), pytest.param("redis", "hello", marks=pytest.mark.redis),
    ("memory", "where is A-1?")])
def test_a_message_sent_after_stop_while_the_run_goes_on_is_taken_and_answered(
        kind: str, first: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # stop() closes the connection only: the run goes on. The next message was refused (409, "exists
    # (running)") while the client showed it as sent. It joins the run: its next turn ("where is A-1?": the
    # turn after the tool call) or a run of its own ("hello": it came during the run's last turn).
    app = App(storage=storage_of(kind, request, tmp_path), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(slow_first_answer), tools=[lookup])])
    with serve(build_app(app, agent="a")) as base:
        got = node("stop-send", base + "/chat", "stopped", first, "300", "second question")
    assert got["errors"] == [] and (got["stopped"], got["status"]) == ("ready", "ready")
    # What the stopped answer showed depends on when it was stopped (nothing yet, on a loaded machine).
    assert got["messages"][0] == said(first)[0]
    assert got["messages"][-2:] == said("second question", "You said: second question")
    msgs = app.messages("stopped")
    assert [m["content"] for m in msgs if m["role"] == "user"] == [first, "second question"]
    assert msgs[-1]["content"] == "You said: second question" and app.get("stopped").status.value == "complete"


def test_a_message_sent_to_a_run_that_then_waits_for_approval_is_kept_and_the_post_says_so() -> None:
    # The run stops for a person before a turn takes the message: no answer to stream yet, and none lost.
    asked = threading.Event()

    def asks_first(msgs: list[Message]) -> Any:
        if msgs[-1]["role"] == "user" and msgs[-1]["content"] == "refund A-1":
            # The turn ends once the message came (it is in the inbox): no sleep to outlast a loaded machine.
            asked.set()
            deadline = time.monotonic() + 30
            while app.get("asks").record.inbox == 0 and time.monotonic() < deadline:  # type: ignore[union-attr]
                time.sleep(0.01)
            return reply("I will refund order A-1.", call("refund", order="A-1"))
        return f"You said: {msgs[-1]['content']}"

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(asks_first), tools=[refund])])
    app.run_agent("a", job_id="asks", messages=["refund A-1"])
    with serve(build_app(app, agent="a")) as base:
        threading.Thread(target=app.run_in_process, daemon=True).start()
        assert asked.wait(30)  # the first turn is in flight: it took the inbox (empty) and asks the model
        response = httpx.post(base + "/chat", json={"id": "asks", "text": "and A-2?"}, timeout=30)
    assert response.status_code == 409 and "waits in its inbox" in response.json()["error"]
    assert app.get("asks").status.value == "waiting" and app.get("asks").record.inbox == 1
    app.approve("asks", app.get("asks").pending_calls[0]["call_id"])
    app.drain()
    assert [m["content"] for m in app.messages("asks") if m["role"] == "user"] == ["refund A-1", "and A-2?"]


def test_use_chats_regenerate_of_a_run_that_took_a_message_sent_during_it_is_refused_and_the_message_kept() -> None:
    # A full retry cuts back to where the run started: "second question", which the run's next turn took
    # from its inbox, was cut away with its answer (the regenerate was checked by user message counts only).
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(slow_first_answer), tools=[lookup])])
    with serve(build_app(app, agent="a")) as base:
        got = node("stop-send", base + "/chat", "regen-sent", "where is A-1?", "300", "second question",
                   "regenerate")
    assert got["sent"]["errors"] == [] and got["sent"]["messages"][-2:] == said(
        "second question", "You said: second question")
    assert len(got["errors"]) == 1 and "took a message sent while it was being written" in got["errors"][0]
    msgs = app.messages("regen-sent")
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["where is A-1?", "second question"]
    assert msgs[-1]["content"] == "You said: second question"


@pytest.mark.parametrize("kind", KINDS)
def test_two_messages_of_the_same_text_sent_during_a_run_each_stream_the_turn_that_took_it(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # The second "yes" was sent after a turn took the first, before it committed: its POST looked for the
    # first "yes" at or after the transcript's length then, found the first one, and streamed its turn.
    turns: list[int] = []

    def slow_turns(msgs: list[Message]) -> Any:
        turns.append(len(turns) + 1)
        if len(turns) <= 2:
            time.sleep(1.2)
            return reply(f"turn {len(turns)}", call("lookup", order=f"A-{len(turns)}"))
        return f"turn {len(turns)}, the last"

    app = App(storage=storage_of(kind, request, tmp_path), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(slow_turns), tools=[lookup])])
    texts: dict[str, list[str]] = {}

    def post(name: str, delay: float) -> None:
        time.sleep(delay)
        response = httpx.post(base + "/chat", json={"id": "twice", "text": "yes"}, timeout=30)
        texts[name] = [json.loads(line[5:])["delta"] for line in response.text.splitlines()
                       if line.startswith("data:") and '"text-delta"' in line]

    with serve(build_app(app, agent="a")) as base:
        httpx.post(base + "/chat", json={"id": "twice", "text": "go", "stream": False}, timeout=30)
        posts = [threading.Thread(target=post, args=(name, delay)) for name, delay in (("first", 0.3), ("second", 1.7))]
        for t in posts:
            t.start()
        for t in posts:
            t.join()
    msgs = app.messages("twice")
    assert [(m["role"], m["content"]) for m in msgs if m["role"] != "tool"] == [
        ("user", "go"), ("assistant", "turn 1"), ("user", "yes"), ("assistant", "turn 2"), ("user", "yes"),
        ("assistant", "turn 3, the last")]
    assert texts == {"first": ["turn 2", "turn 3, the last"], "second": ["turn 3, the last"]}


def test_use_chats_regenerate_of_the_latest_answer_of_a_compacted_conversation_runs_it_again() -> None:
    # The compaction's summary is stored as a user message: the server seemed to hold one more than the client.
    answers: list[str] = []

    def long_answers(msgs: list[Message]) -> str:
        if str(msgs[-1].get("content", "")).startswith("Summar"):
            return "SUMMARY"
        answers.append(f"answer {len(answers) + 1} " + "z" * 300)
        return answers[-1]

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(long_answers), compaction=Compaction(max_tokens=120,
                                                                                            keep_recent=2))])
    with serve(build_app(app, agent="a")) as base:
        for q in ("q1", "q2", "q3"):
            httpx.post(base + "/chat", json={"id": "compacted", "text": q}, timeout=30)
        assert any(MARKER_KEY in m for m in app.messages("compacted"))
        held = [{"id": f"u-{q}", "role": "user", "parts": [{"type": "text", "text": q}]} for q in ("q1", "q2", "q3")]
        response = httpx.post(base + "/chat", json={"id": "compacted", "trigger": "regenerate-message",
                                                    "messages": held}, timeout=30)
    # (What the stream shows of a compacting turn's text hangs on its turn_committed span: not asserted here.)
    assert response.status_code == 200 and '"finish"' in response.text
    msgs = app.messages("compacted")
    assert msgs[-1]["content"] == answers[3] and [m["content"] for m in msgs if m["role"] == "user"
                                                  and MARKER_KEY not in m] == ["q1", "q2", "q3"]


def test_a_tab_answering_a_call_of_a_run_regenerate_undid_is_told_it_was_decided_not_refused_as_a_cursor() -> None:
    # The call's approval request is still in the stream, inside the run the full retry undid: it was the
    # stream's start, which the stream refuses (400, about cursors) instead of the documented 409.
    ids = itertools.count(1)

    def refunding_anew(msgs: list[Message]) -> Any:
        if msgs[-1]["role"] == "tool":
            return f"Result: {msgs[-1]['content']}"
        asked = call("refund", order="A-1")
        asked["id"] = f"call_of_run_{next(ids)}"
        return reply("I will refund order A-1.", asked)

    def answering(call_id: str) -> list[dict[str, Any]]:
        answer = {"type": "tool-refund", "toolCallId": call_id, "state": "approval-responded",
                  "input": {"order": "A-1"}, "approval": {"id": call_id, "approved": True}}
        return [asked_refund, {"id": "a", "role": "assistant", "parts": [answer]}]

    asked_refund = {"id": "u", "role": "user", "parts": [{"type": "text", "text": "refund A-1"}]}
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(refunding_anew), tools=[refund])])
    with serve(build_app(app, agent="a")) as base:
        httpx.post(base + "/chat", json={"id": "undone", "text": "refund A-1"}, timeout=30)
        first = app.get("undone").pending_calls[0]["call_id"]
        assert httpx.post(base + "/chat", json={"id": "undone", "messages": answering(first)}, timeout=30
                          ).status_code == 200
        assert httpx.post(base + "/chat", json={"id": "undone", "trigger": "regenerate-message",
                                                "messages": [asked_refund]}, timeout=30).status_code == 200
        stale = httpx.post(base + "/chat", json={"id": "undone", "messages": answering(first)}, timeout=30)
    assert stale.status_code == 409 and "decided already" in stale.json()["error"]
    assert [c["call_id"] for c in app.get("undone").pending_calls] == ["call_of_run_2"]


def test_a_message_taken_by_a_turn_that_fails_gets_a_409_saying_the_run_failed() -> None:
    def fails_on_second(msgs: list[Message]) -> Any:
        if msgs[-1]["role"] == "user" and msgs[-1]["content"] == "where is A-1?":
            time.sleep(1.0)
            return reply("Checking.", call("lookup", order="A-1"))
        if any(m["role"] == "user" and m.get("content") == "second" for m in msgs):
            raise PermanentModelError("context window exceeded")
        return "It shipped."

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(fails_on_second), tools=[lookup])])
    with serve(build_app(app, agent="a")) as base:
        httpx.post(base + "/chat", json={"id": "fails", "text": "where is A-1?", "stream": False}, timeout=30)
        time.sleep(0.3)
        response = httpx.post(base + "/chat", json={"id": "fails", "text": "second"}, timeout=30)
    error = response.json()["error"]
    assert response.status_code == 409 and "failed (model error: context window exceeded)" in error
    assert "approval" not in error and app.get("fails").record.inbox == 1


def test_a_posts_storage_work_runs_off_the_event_loop() -> None:
    # Starting or continuing a run reads and writes storage (a remote Redis, a long transcript): done on the
    # event loop, every other request and stream of the process waited behind it.
    import asyncio

    app = two_agents(MemoryStorage())
    on_loop: list[bool] = []
    real_get = app.get

    def noted(job_id: str) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real_get(job_id)

    app.get = noted  # type: ignore[method-assign]
    with serve(build_app(app, agent="a")) as base:
        posted = httpx.post(base + "/chat", json={"id": "c", "text": "refund A-1 please", "stream": False},
                            timeout=30)
    assert posted.status_code == 202 and on_loop and not any(on_loop)
