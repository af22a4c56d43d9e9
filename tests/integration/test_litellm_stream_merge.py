"""The streamed call reads the OpenAI SDK's chunks itself and hands litellm merged runs (issue 31, item 5).

Every answer is read both ways against the loopback server: merged (the default for an ``openai/``
model) and through litellm's wrapper chunk by chunk (the merged path turned off). The response
(message, tool calls, finish reason, usage) and the text handed to ``on_delta`` are the same.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

from phases import litellm_stream
from phases.litellm_model import LiteLLMModel
from phases.litellm_stream import _Merger
from phases.model import ModelRequest, ModelResponse
from pipelines.engine.errors import TransientModelError
from tests.fake_openai import FakeOpenAI, Reply, call, streamed, text_reply, tool_reply

MESSAGES = [{"role": "user", "content": "go"}]
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}}}
LONG = "The parcel left the depot at dawn and reached the sorting centre by noon. " * 6

SHAPES: dict[str, Reply] = {
    "text": streamed(text_reply(LONG), chunk_chars=3),
    "text and two tool calls, reasoning": streamed(tool_reply(
        call("add", {"a": 1, "b": 2, "note": "x" * 50}, id="c1"), call("add", {"a": 3, "b": 4}, id="c2"),
        content="Adding both pairs now.", reasoning_content="two sums"), chunk_chars=2),
    "tool call only": streamed(tool_reply(call("add", {"values": list(range(40))}, id="c9")), chunk_chars=5),
    "cut at the length limit": streamed(text_reply("a long answer that was cut", finish_reason="length")),
    "empty text": text_reply(""),
    "unicode": streamed(text_reply("héllo wörld — ✓ 東京 " * 10), chunk_chars=1),
}


def model_for(fake: FakeOpenAI) -> LiteLLMModel:
    return LiteLLMModel("openai/fake-model", params={"api_base": fake.url, "api_key": "sk-test-merge-0123456789"},
                        backoff_initial=0.01, backoff_max=0.05)


def read(fake: FakeOpenAI, reply: Reply, *, retries: int = 0) -> tuple[ModelResponse, list[str]]:
    fake.script(reply)
    deltas: list[str] = []
    request = ModelRequest(messages=MESSAGES, tools=[ADD_TOOL], on_delta=deltas.append, stream_retries=retries)
    return model_for(fake).complete(request), deltas


@pytest.fixture
def merged_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of chunks litellm's wrapper was handed by each merged read."""
    seen: list[int] = []
    real = _Merger.finish

    def spy(self: _Merger) -> list[Any]:
        chunks = real(self)
        seen.append(len(chunks))
        return chunks

    monkeypatch.setattr(_Merger, "finish", spy)
    return seen


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_merged_read_gives_the_answer_and_deltas_of_litellms_own(fake_openai: FakeOpenAI, shape: str,
                                                                      merged_runs: list[int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    merged, merged_deltas = read(fake_openai, SHAPES[shape])
    assert len(merged_runs) == 1, "the merged path was not taken"
    with monkeypatch.context() as m:
        m.setattr(litellm_stream, "_sdk_source", lambda stream, params: None)
        chunk_by_chunk, deltas = read(fake_openai, SHAPES[shape])
    assert len(merged_runs) == 1
    assert merged.message == chunk_by_chunk.message
    assert (merged.finish_reason, merged.usage, merged.model) == (
        chunk_by_chunk.finish_reason, chunk_by_chunk.usage, chunk_by_chunk.model)
    assert merged_deltas == deltas and "".join(deltas) == (merged.message.get("content") or "")
    assert merged.usage.completion_tokens > 0


def test_a_long_answer_reaches_litellm_as_a_few_chunks(fake_openai: FakeOpenAI, merged_runs: list[int]) -> None:
    response, deltas = read(fake_openai, SHAPES["text and two tool calls, reasoning"])
    assert len(deltas) == len("Adding both pairs now.") // 2  # every piece handed over as it came
    # the role chunk (it carries reasoning_content), the text, each call with its arguments, the finish, the usage
    assert merged_runs == [6]
    assert json.loads(response.tool_calls[0]["function"]["arguments"]) == {"a": 1, "b": 2, "note": "x" * 50}
    assert response.message["reasoning_content"] == "two sums"


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "chunk-by-chunk"])
def test_a_model_repeating_itself_still_breaks_the_stream(fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
                                                          merged: bool) -> None:
    import litellm

    monkeypatch.setattr(litellm, "REPEATED_STREAMING_CHUNK_LIMIT", 5)
    if not merged:
        monkeypatch.setattr(litellm_stream, "_sdk_source", lambda stream, params: None)
    with pytest.raises(TransientModelError, match="repeating the same chunk") as err:
        read(fake_openai, streamed(text_reply("Hi. " + "abc" * 60), chunk_chars=3))
    assert "sk-test-merge" not in str(err.value)


def test_the_merged_read_stops_reading_a_looping_model(fake_openai: FakeOpenAI,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    monkeypatch.setattr(litellm, "REPEATED_STREAMING_CHUNK_LIMIT", 5)
    seen: list[str] = []
    fake_openai.script(streamed(text_reply("abc" * 60), chunk_chars=3))
    request = ModelRequest(messages=MESSAGES, on_delta=seen.append)
    with pytest.raises(TransientModelError):
        model_for(fake_openai).complete(request)
    assert seen == ["abc"] * 6  # litellm raises at the 6th identical chunk: nothing past it is read


# --- the merger alone, on the SDK's own chunk objects ------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, *, finish: str | None = None, usage: dict[str, int] | None = None,
          **extra: Any) -> ChatCompletionChunk:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    body = {"id": "r1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices, **extra}
    if usage is not None:
        body["usage"] = usage
    return ChatCompletionChunk.model_validate(body)


def contents(chunks: list[Any]) -> list[Any]:
    out: list[Any] = []
    for c in chunks:
        d = c.choices[0].delta if c.choices else None
        if d is None:
            out.append("usage")
        elif d.tool_calls:
            out.append([(t.index, t.id, t.function.name, t.function.arguments) for t in d.tool_calls])
        else:
            out.append(d.content if c.choices[0].finish_reason is None else f"finish:{c.choices[0].finish_reason}")
    return out


def merge(chunks: list[ChatCompletionChunk], limit: int = 100) -> tuple[list[Any], list[str]]:
    merger = _Merger(limit)
    texts = [t for t in (merger.add(c) for c in chunks) if t]
    return contents(merger.finish()), texts


def test_text_runs_merge_and_finish_and_usage_stay_apart() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    got, texts = merge([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                        chunk({"content": "lo"}), chunk({}, finish="stop"), chunk(usage=usage)])
    assert got == ["Hello", "finish:stop", "usage"]
    assert texts == ["Hel", "lo"]


def test_argument_pieces_merge_into_their_own_call_only() -> None:
    def tc(index: int, args: str, id: str | None = None, name: str | None = None) -> ChatCompletionChunk:
        fn: dict[str, Any] = {"arguments": args} if name is None else {"name": name, "arguments": args}
        new = {"id": id, "type": "function"} if id else {}
        return chunk({"tool_calls": [{"index": index, "function": fn, **new}]})

    got, _ = merge([tc(0, "", "c1", "add"), tc(0, '{"a"'), tc(0, ": 1}"), tc(1, "", "c2", "add"), tc(1, "{}")])
    assert got == [[(0, "c1", "add", '{"a": 1}')], [(1, "c2", "add", "{}")]]


def test_extra_fields_logprobs_and_other_roles_are_never_merged() -> None:
    reasoning = chunk({"content": "b", "reasoning_content": "why"})
    other_model = chunk({"content": "c"})
    other_model.model = "m2"
    got, texts = merge([chunk({"content": "a"}), reasoning, other_model, chunk({"content": "d", "role": "tool"})])
    assert got == ["a", "b", "c", "d"] and texts == ["a", "b", "c", "d"]


def test_identical_pieces_stay_apart_for_litellms_loop_guard() -> None:
    pieces = ["ab", "xyz", "abc", "abc", "abc", "d", "e"]
    got, texts = merge([chunk({"content": p}) for p in pieces])
    assert got == ["abxyz", "abc", "abc", "abc", "de"] and texts == pieces
    merger = _Merger(3)
    for _ in range(4):
        assert not merger.looping
        merger.add(chunk({"content": "abc"}))
    assert merger.looping


def test_with_a_litellm_callback_the_stream_is_read_chunk_by_chunk_and_logged_once(
        fake_openai: FakeOpenAI, merged_runs: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Merged, litellm's logging of the last chunk and of the whole answer raced into two logs of the answer."""
    import time

    import litellm

    logged: list[Any] = []

    def callback(kwargs: dict[str, Any], response: Any, start: Any, end: Any) -> None:
        logged.append(response)

    monkeypatch.setattr(litellm, "success_callback", [callback])
    response, _ = read(fake_openai, SHAPES["text and two tool calls, reasoning"])
    assert merged_runs == []
    deadline = time.monotonic() + 10
    while not any(isinstance(x, litellm.ModelResponse) for x in logged) and time.monotonic() < deadline:
        time.sleep(0.02)  # litellm logs on its thread pool
    time.sleep(0.3)  # a second log of the answer would come about now
    answers = [x for x in logged if isinstance(x, litellm.ModelResponse)]
    assert len(answers) == 1
    message = answers[0].choices[0].message
    assert message.content == response.message["content"]
    assert [c.function.arguments for c in message.tool_calls] == [c["function"]["arguments"]
                                                                  for c in response.tool_calls]
