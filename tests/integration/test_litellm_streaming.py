"""LiteLLMModel streaming through litellm's real HTTP path, against the loopback server (tests/fake_openai.py).

The model seam alone (deltas, the rebuilt answer, broken streams and their
retries, errors before a stream starts), then agents on the memory adapters:
the text a client assembles from the job's stream is the committed text.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App
from pipelines.engine.errors import PermanentModelError, TransientModelError
from pipelines.streams import turn_texts
from tests.apps.agent_app import add
from tests.fake_openai import (
    FakeOpenAI,
    Reply,
    broken_stream,
    call,
    error_chunk,
    rate_limited,
    streamed,
    text_reply,
    tool_reply,
    unauthorized,
    w1_reply,
)
from tests.streaming_helpers import committed_texts

SECRET = "sk-test-streaming-0123456789"
MESSAGES = [{"role": "user", "content": "add 1 and 2, then 3 and 4"}]
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                              "parameters": {"type": "object"}}}
LONG = "The parcel left the depot at dawn and reached the sorting centre by noon. " * 8


def model_for(fake: FakeOpenAI) -> LiteLLMModel:
    return LiteLLMModel("openai/fake-model", params={"api_base": fake.url, "api_key": SECRET},
                        backoff_initial=0.01, backoff_max=0.05)


class Recorder:
    """A request's on_delta and on_restart: what the model handed over, in order."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.restarts = 0

    def request(self, *, retries: int = 0, tools: bool = True) -> ModelRequest:
        return ModelRequest(messages=MESSAGES, tools=[ADD_TOOL] if tools else [], on_delta=self.deltas.append,
                            stream_retries=retries, on_restart=self.restart)

    def restart(self) -> None:
        self.restarts += 1
        self.deltas.clear()  # as DeltaSink.restart: the abandoned attempt's text is dropped


def two_calls() -> Reply:
    return tool_reply(call("add", {"a": 1, "b": 2}, id="c1"), call("add", {"a": 3, "b": 4}, id="c2"),
                      content="Adding both pairs now.", reasoning_content="two sums")


def test_a_streamed_answer_is_the_same_response_as_the_plain_one(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(two_calls(), streamed(two_calls(), chunk_chars=3))
    plain = model_for(fake_openai).complete(ModelRequest(messages=MESSAGES, tools=[ADD_TOOL]))
    rec = Recorder()
    live = model_for(fake_openai).complete(rec.request())
    assert "stream" not in fake_openai.requests[0]
    assert fake_openai.requests[1]["stream"] is True
    assert fake_openai.requests[1]["stream_options"] == {"include_usage": True}
    # Text, both tool calls (arguments sent in 3-character pieces), reasoning, finish reason and usage.
    assert live.message == plain.message
    assert live.tool_calls[1]["function"]["arguments"] == json.dumps({"a": 3, "b": 4})
    assert live.message["reasoning_content"] == "two sums"
    assert (live.finish_reason, live.usage) == (plain.finish_reason, plain.usage)
    assert live.usage.completion_tokens > 0
    assert len(rec.deltas) > 3 and "".join(rec.deltas) == "Adding both pairs now."
    # The provider's response around the message, for the model-call view: the same fields either way.
    assert plain.raw is not None and live.raw is not None
    assert plain.raw["id"] == "chatcmpl-fake-1" and live.raw["id"] == "chatcmpl-fake-2"
    assert plain.raw["choices"] == live.raw["choices"] == [{"finish_reason": "tool_calls", "index": 0}]
    assert plain.raw["usage"]["completion_tokens"] == plain.usage.completion_tokens
    assert "message" not in json.dumps(plain.raw["choices"]) and "Adding both" not in json.dumps(live.raw)


def test_deltas_reach_the_caller_before_the_stream_ends(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(streamed(text_reply("one two three four"), chunk_chars=4, chunk_delay=0.05))
    seen_while_streaming: list[int] = []
    rec = Recorder()

    def on_delta(text: str) -> None:
        rec.deltas.append(text)
        seen_while_streaming.append(len(fake_openai.sent_text))  # chunks the server had sent by then

    request = ModelRequest(messages=MESSAGES, on_delta=on_delta)
    model_for(fake_openai).complete(request)
    total = len(fake_openai.sent_text)
    assert total == 5 and seen_while_streaming[0] < total  # the first delta came before the last chunk left


@pytest.mark.parametrize("fault", [broken_stream, error_chunk], ids=["closed", "error-chunk"])
def test_a_broken_stream_is_retried_with_on_restart_and_its_usage_counted(fake_openai: FakeOpenAI,
                                                                           fault: Any) -> None:
    fake_openai.script(fault(text_reply("ABANDONED " * 10), after=4), text_reply("clean answer"))
    rec = Recorder()
    response = model_for(fake_openai).complete(rec.request(retries=2))
    fake_openai.script(text_reply("clean answer"))
    alone = model_for(fake_openai).complete(Recorder().request())
    assert response.message["content"] == "clean answer"
    assert "".join(rec.deltas) == "clean answer" and rec.restarts == 1
    assert len(fake_openai.requests) == 3
    # The dropped attempt is in the ledger: one more call, its prompt and partial answer counted.
    assert response.usage.model_calls == 2
    assert response.usage.prompt_tokens > alone.usage.prompt_tokens
    assert response.usage.completion_tokens >= alone.usage.completion_tokens


def test_a_stream_broken_past_its_retries_is_a_transient_error(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(broken_stream(text_reply("x" * 40)), error_chunk(text_reply("y" * 40)), text_reply("unused"))
    rec = Recorder()
    with pytest.raises(TransientModelError, match="broke 2 time") as err:
        model_for(fake_openai).complete(rec.request(retries=1))
    assert rec.restarts == 1 and len(fake_openai.requests) == 2
    assert SECRET not in str(err.value)


def test_stream_retries_zero_means_no_second_request(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(broken_stream(text_reply("x" * 40)), text_reply("unused"))
    rec = Recorder()
    with pytest.raises(TransientModelError):
        model_for(fake_openai).complete(rec.request(retries=0))
    assert rec.restarts == 0 and len(fake_openai.requests) == 1


def test_failures_before_the_stream_follow_the_plain_retry_policy(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(rate_limited(retry_after=0), text_reply("after the 429"), unauthorized())
    rec = Recorder()
    response = model_for(fake_openai).complete(rec.request())
    assert response.message["content"] == "after the 429" and rec.restarts == 0
    assert "".join(rec.deltas) == "after the 429"
    with pytest.raises(PermanentModelError, match="authentication failed") as err:
        model_for(fake_openai).complete(Recorder().request(retries=3))
    assert SECRET not in str(err.value) and len(fake_openai.requests) == 3


def test_a_failing_delta_sink_is_not_taken_for_a_broken_stream(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("some text"), text_reply("unused"))

    def on_delta(text: str) -> None:
        raise ConnectionError("live stream unavailable")

    with pytest.raises(ConnectionError):
        model_for(fake_openai).complete(ModelRequest(messages=MESSAGES, on_delta=on_delta, stream_retries=2))
    assert len(fake_openai.requests) == 1


def test_stream_false_in_params_keeps_the_plain_call(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("plain"))
    rec = Recorder()
    response = model_for(fake_openai).complete(
        ModelRequest(messages=MESSAGES, params={"stream": False}, on_delta=rec.deltas.append))
    assert isinstance(response, ModelResponse) and response.message["content"] == "plain"
    assert not fake_openai.requests[0].get("stream") and rec.deltas == []


# --- agents on the memory adapters ----------------------------------------------------------------------


def memory_app(fake: FakeOpenAI, **options: Any) -> App:
    agent = Agent(name="adder", model="openai/fake-model", tools=[add], system="You add numbers.", max_turns=10,
                  model_params={"api_base": fake.url, "api_key": SECRET}, **options)
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[agent])


def long_w1(body: dict[str, Any]) -> Reply:
    """W1, with 600 characters of text a turn (several flushes of the delta sink), streamed in small chunks."""
    reply = w1_reply(body)
    assert reply.message is not None
    if reply.message.get("tool_calls"):
        reply = Reply(message={**reply.message, "content": LONG}, finish_reason=reply.finish_reason)
    # 2 ms apart: the sink's batches follow the model's pace, not how fast the client reads a burst.
    return streamed(reply, chunk_chars=5, chunk_delay=0.002)


def test_an_agents_streamed_text_is_its_committed_text(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(long_w1)
    app = memory_app(fake_openai)
    app.run_agent("adder", job_id="live-1", messages=["turns=3: keep adding one"])
    app.drain(max_advances=50)
    record = app.get("live-1")
    assert record is not None and record.status.value == "complete"
    parts = list(app.stream("live-1", follow=False))
    assert turn_texts(parts) == committed_texts(app, "live-1") == {1: LONG, 2: LONG, 3: "done"}
    deltas_turn_1 = [p for p in parts if p.type == "text_delta" and p.turn == 1]
    assert len(deltas_turn_1) >= 3  # streamed in batches, not sent whole at the end
    assert all(r.get("stream") is True for r in fake_openai.requests)


def test_an_agent_with_stream_retries_commits_a_clean_transcript_and_counts_the_dropped_usage(
        fake_openai: FakeOpenAI) -> None:
    # 30 chunks of 8 characters: past the sink's 200-character flush, so the dropped text reached the stream.
    dropped = broken_stream(streamed(text_reply("DROPPED " * 40), chunk_chars=8), after=30)
    fake_openai.script(dropped, streamed(text_reply("done"), chunk_chars=2))
    app = memory_app(fake_openai, stream_retries=2)
    app.run_agent("adder", job_id="live-2", messages=["turns=1: just finish"])
    app.drain(max_advances=20)
    record = app.get("live-2")
    assert record is not None and record.status.value == "complete"
    assert app.messages("live-2")[-1] == {"role": "assistant", "content": "done"}
    assert "DROPPED" not in json.dumps(app.messages("live-2"))
    parts = list(app.stream("live-2", follow=False))
    assert turn_texts(parts) == {1: "done"}
    assert sum(p.type == "attempt_started" for p in parts) == 2
    assert any("DROPPED" in str(p.data.get("text")) for p in parts if p.type == "text_delta")
    assert record.usage.model_calls == 2 and len(fake_openai.requests) == 2


# --- what a failed call was paid for, and a provider's odd numbers ------------------------------------------------
def test_a_call_that_fails_after_broken_streams_carries_what_they_were_paid_for(fake_openai: FakeOpenAI) -> None:
    # Two attempts broke mid-stream (paid), then the provider refuses the key: the error says what the call cost.
    fake_openai.script(broken_stream(text_reply("x" * 40)), broken_stream(text_reply("y" * 40)), unauthorized())
    with pytest.raises(PermanentModelError, match="authentication failed") as err:
        model_for(fake_openai).complete(Recorder().request(retries=3))
    assert err.value.usage is not None and err.value.usage.model_calls == 2
    fake_openai.script(broken_stream(text_reply("x" * 40)), broken_stream(text_reply("y" * 40)))
    with pytest.raises(TransientModelError, match="broke 2 time") as past:
        model_for(fake_openai).complete(Recorder().request(retries=1))
    assert past.value.usage is not None and past.value.usage.model_calls == 2


def test_an_agent_counts_the_paid_attempts_of_a_model_call_that_failed(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(broken_stream(text_reply("x" * 400)), unauthorized())
    app = memory_app(fake_openai, stream_retries=2)
    app.run_agent("adder", job_id="paid", messages=["turns=1: just finish"])
    app.drain(max_advances=20)
    record = app.get("paid")
    assert record is not None and record.status.value == "error" and "authentication failed" in str(record.error)
    assert record.usage.model_calls == 1 and record.usage.prompt_tokens > 0  # the broken attempt's cost


def test_a_retry_after_of_zero_still_backs_off(fake_openai: FakeOpenAI) -> None:
    # "Retry-After: 0" taken at its word sent every attempt of the budget at once (~1,000 a minute).
    fake_openai.script(*[rate_limited(retry_after=0)] * 200)
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": SECRET},
                         backoff_initial=0.1, backoff_max=0.2, max_retry_seconds=1.0)
    with pytest.raises(TransientModelError):
        model.complete(Recorder().request())
    assert 3 <= len(fake_openai.requests) <= 12


def test_negative_token_counts_from_a_provider_count_as_zero(fake_openai: FakeOpenAI) -> None:
    from phases.litellm_answer import usage_of

    class Odd:
        prompt_tokens = -1_000_000_000
        completion_tokens = "many"

    class Response:  # not a litellm response: no price either
        usage = Odd()

    usage = usage_of(Response())
    assert usage.prompt_tokens == 0 and usage.completion_tokens == 0 and usage.model_calls == 1



def _chunk(choices: Any, **more: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model", "choices": choices,
            **more}


def _choice(index: int, content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {"index": index, "delta": delta, "finish_reason": finish}


def test_with_several_choices_the_live_text_is_the_first_choices(fake_openai: FakeOpenAI) -> None:
    pieces = ["Hel", "lo ", "there."]
    chunks = [_chunk([_choice(0, "")])]
    chunks += [c for p in pieces for c in (_chunk([_choice(0, p)]), _chunk([_choice(1, "ZZ")]))]
    chunks += [_chunk([_choice(0, None, "stop")]), _chunk([_choice(1, None, "stop")])]
    fake_openai.script(Reply(message={"role": "assistant", "content": ""}, raw_chunks=chunks))
    rec = Recorder()
    response = model_for(fake_openai).complete(rec.request())
    assert response.message["content"] == "Hello there." and "".join(rec.deltas) == "Hello there."


def test_a_lone_surrogate_in_a_providers_text_becomes_a_replacement_character(fake_openai: FakeOpenAI) -> None:
    chunks = [_chunk([_choice(0, "")]), _chunk([_choice(0, "ok \ud83d here")]), _chunk([_choice(0, None, "stop")])]
    fake_openai.script(Reply(message={"role": "assistant", "content": ""}, raw_chunks=chunks))
    rec = Recorder()
    response = model_for(fake_openai).complete(rec.request())
    assert response.message["content"] == "ok \ufffd here" and "".join(rec.deltas) == "ok \ufffd here"


def test_a_chunk_of_a_shape_no_provider_sends_is_a_model_error_not_a_crash(fake_openai: FakeOpenAI) -> None:
    chunks = [_chunk([_choice(0, "")]), _chunk({"0": _choice(0, "x")})]
    fake_openai.script(*[Reply(message={"role": "assistant", "content": ""}, raw_chunks=chunks)] * 20)
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": SECRET},
                         backoff_initial=0.01, backoff_max=0.02, max_retry_seconds=0.2)
    with pytest.raises(TransientModelError, match="unavailable for now"):
        model.complete(Recorder().request())


def test_a_stream_that_holds_no_answer_is_a_failed_attempt_not_an_empty_answer(fake_openai: FakeOpenAI) -> None:
    # A gateway's 200 with only [DONE] (or only a usage chunk): committed as an empty answer, the job ended with none.
    usage_only = [_chunk([], usage={"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3})]
    for chunks in ([], usage_only):
        fake_openai.script(*[Reply(message={"role": "assistant", "content": ""}, raw_chunks=chunks)] * 50)
        model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": SECRET},
                             backoff_initial=0.01, backoff_max=0.02, max_retry_seconds=0.2)
        with pytest.raises(TransientModelError, match="held no answer"):
            model.complete(Recorder().request())


def _call_chunks(call_id: Any, name: str | None = "add") -> list[dict[str, Any]]:
    """A streamed answer of one tool call whose id is ``call_id`` (its arguments in a second piece)."""
    first = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": '{"a":'}}
    rest = {"index": 0, "function": {"arguments": '1,"b":2}'}}
    return [_chunk([_choice(0, "")]), _chunk([{"index": 0, "delta": {"tool_calls": [first]}, "finish_reason": None}]),
            _chunk([{"index": 0, "delta": {"tool_calls": [rest]}, "finish_reason": None}]),
            _chunk([_choice(0, None, "tool_calls")]),
            _chunk([], usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8})]


@pytest.mark.parametrize("sdk_path", [True, False], ids=["merged", "litellm-wrapper"])
@pytest.mark.parametrize("call_id", ["", None], ids=["empty-id", "null-id"])
def test_a_streamed_tool_call_without_an_id_is_kept(fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
                                                    call_id: Any, sdk_path: bool) -> None:
    # litellm's stream_chunk_builder leaves out a call with no id: the answer asked for a tool and held none.
    import phases.litellm_stream

    if not sdk_path:
        monkeypatch.setattr(phases.litellm_stream, "_sdk_source", lambda stream, params: None)
    fake_openai.script(Reply(message={"role": "assistant"}, raw_chunks=_call_chunks(call_id)),
                       Reply(message={"role": "assistant"}, raw_chunks=_call_chunks("c9", name=None)))
    response = model_for(fake_openai).complete(Recorder().request())
    assert response.finish_reason == "tool_calls"
    # As a plain answer's call without an id: the agent turn gives it one (phases.tool_calls).
    assert response.tool_calls == [{"type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]
    nameless = model_for(fake_openai).complete(Recorder().request())  # kept too, for a "names no tool" error
    assert nameless.tool_calls == [{"id": "c9", "type": "function",
                                    "function": {"name": "", "arguments": '{"a":1,"b":2}'}}]


@pytest.mark.parametrize("call_id", ["", None], ids=["empty-id", "null-id"])
def test_an_agents_streamed_call_without_an_id_runs_under_a_fresh_one(fake_openai: FakeOpenAI, call_id: Any) -> None:
    fake_openai.script(Reply(message={"role": "assistant"}, raw_chunks=_call_chunks(call_id)), text_reply("three"))
    app = memory_app(fake_openai)
    app.run_agent("adder", job_id="noid", messages=["1+2?"])
    app.drain(max_advances=20)
    assert app.get("noid").status.value == "complete"  # type: ignore[union-attr]
    calls = [m for m in app.messages("noid") if m.get("tool_calls")]
    assert [c["id"] for c in calls[0]["tool_calls"]] == ["call_0_0"]
    assert next(m for m in app.messages("noid") if m["role"] == "tool") == {
        "role": "tool", "tool_call_id": "call_0_0", "content": json.dumps({"sum": 3})}
    assert all(m.get("tool_calls") != [] for m in fake_openai.requests[-1]["messages"])
