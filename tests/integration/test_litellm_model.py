"""LiteLLMModel through litellm's real HTTP path, against the loopback fake OpenAI server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.litellm_model import LiteLLMModel, _redact, _retry_after
from phases.model import ModelRequest
from pipelines import Agent, App
from pipelines.engine.errors import ModelError, PermanentModelError, TransientModelError
from pipelines.engine.models import Usage
from tests.fake_openai import (
    FakeOpenAI,
    Reply,
    bad_request,
    call,
    close_litellm_clients_of,
    context_window_exceeded,
    empty_choices,
    malformed_tool_reply,
    rate_limited,
    server_error,
    slow,
    streamed,
    text_reply,
    tool_reply,
    unauthorized,
    unavailable,
    unknown_tool_reply,
    w1_reply,
)

SENTINEL = "sk-test-SENTINEL"
ROOT = Path(__file__).resolve().parents[2]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    },
}


def model_for(fake: FakeOpenAI, **options: Any) -> LiteLLMModel:
    params = {"api_base": fake.url, "api_key": SENTINEL, **options.pop("params", {})}
    # Short backoff keeps the file fast; the policy is the same as in production.
    options = {"backoff_initial": 0.01, "backoff_max": 0.05, "max_retry_seconds": 5.0, **options}
    return LiteLLMModel("openai/fake-model", params=params, **options)


def ask(model: LiteLLMModel, text: str = "hello", **request: Any) -> Any:
    return model.complete(ModelRequest(messages=[{"role": "user", "content": text}], **request))


def assert_no_secret(exc: BaseException, *secrets: str) -> None:
    """Neither the message, the repr, the chain nor the printed traceback shows a secret."""
    shown = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    chained = exc.__cause__ or exc.__context__
    while chained is not None:
        shown += [str(chained), repr(chained)]
        chained = chained.__cause__ or chained.__context__
    for secret in secrets:
        for text in shown:
            assert secret not in text


# --- answers -----------------------------------------------------------------


def test_text_answer(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("hello there"))
    response = ask(model_for(fake_openai))
    assert response.message == {"role": "assistant", "content": "hello there"}
    assert response.finish_reason == "stop"
    assert response.model == "fake-model"
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
    # fake-model is on no price list: counted, not guessed.
    assert (response.usage.model_calls, response.usage.cost_usd, response.usage.unknown_cost_calls) == (1, 0.0, 1)
    assert json.loads(response.model_dump_json())["message"] == response.message
    body = fake_openai.requests[0]
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    # The provider's response around the message (the model-call view), never the request's address or key.
    assert response.raw is not None and response.raw["id"] == "chatcmpl-fake-1"
    assert response.raw["object"] == "chat.completion" and response.raw["model"] == "fake-model"
    assert response.raw["choices"] == [{"finish_reason": "stop", "index": 0}]
    assert SENTINEL not in json.dumps(response.raw) and fake_openai.url not in json.dumps(response.raw)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_content_filtered_answer_keeps_its_finish_reason(fake_openai: FakeOpenAI, stream: bool) -> None:
    # What the agent turn reads to stop the run saying so (stop_reason "content_filter"), not as a plain "done".
    reply = text_reply("I can't help with th", finish_reason="content_filter")
    fake_openai.script(streamed(reply) if stream else reply)
    model = model_for(fake_openai)
    pieces: list[str] = []
    response = model.complete(ModelRequest(messages=[{"role": "user", "content": "hello"}],
                                           on_delta=pieces.append if stream else None))
    assert response.finish_reason == "content_filter"
    assert response.message["content"] == "I can't help with th"
    assert len(pieces) > 1 if stream else not pieces


def test_a_provider_response_too_large_to_keep_is_kept_as_its_keys() -> None:
    from litellm import ModelResponse as LiteLLMResponse

    from phases.litellm_answer import RAW_LIMIT, raw_response

    big = LiteLLMResponse(id="r1", model="m", choices=[{"index": 0, "message": {"role": "assistant", "content": "x"},
                                                       "finish_reason": "stop"}])
    setattr(big, "provider_blob", "y" * (RAW_LIMIT + 10))  # a provider's own field, any size  # noqa: B010
    kept = raw_response(big)
    assert kept is not None and set(kept) == {"truncated", "keys"} and "provider_blob" in kept["keys"]
    assert raw_response(object()) is None  # not a provider response: nothing kept


def test_tool_call_answer_is_parsed_into_tool_calls(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(tool_reply(call("add", {"a": 1, "b": 2}), call("add", {"a": 3, "b": 4}, id="call_x")))
    response = ask(model_for(fake_openai), tools=[ADD_TOOL])
    assert fake_openai.requests[0]["tools"] == [ADD_TOOL]
    assert response.finish_reason == "tool_calls"
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in response.tool_calls] == [
        ("call_0", "add", {"a": 1, "b": 2}),
        ("call_x", "add", {"a": 3, "b": 4}),
    ]


def test_malformed_arguments_and_unknown_tools_come_back_as_returned(fake_openai: FakeOpenAI) -> None:
    # Judging tool calls is the agent turn's job; the model layer must not choke on them.
    fake_openai.script(malformed_tool_reply(), unknown_tool_reply("launch"))
    model = model_for(fake_openai)
    assert ask(model, tools=[ADD_TOOL]).tool_calls[0]["function"]["arguments"] == '{"a": 1, "b": '
    assert ask(model, tools=[ADD_TOOL]).tool_calls[0]["function"]["name"] == "launch"


def test_provider_extra_field_survives(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("42", reasoning_content="6 times 7"))
    response = ask(model_for(fake_openai))
    assert response.message["reasoning_content"] == "6 times 7"
    assert response.message["content"] == "42"


def test_request_params_merge_over_model_params(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("a"))
    model = model_for(fake_openai, params={"temperature": 0.1, "max_tokens": 50})
    ask(model, params={"temperature": 0.7})
    body = fake_openai.requests[0]
    assert (body["temperature"], body["max_tokens"]) == (0.7, 50)


def test_response_format_is_sent_only_without_tools(fake_openai: FakeOpenAI) -> None:
    if "response_format" not in ModelRequest.__dataclass_fields__:
        pytest.skip("ModelRequest has no response_format")

    class Answer(BaseModel):
        value: int

    fake_openai.script(text_reply('{"value": 3}'), tool_reply(call("add", {"a": 1, "b": 2})))
    model = model_for(fake_openai)
    ask(model, response_format=Answer)
    ask(model, response_format=Answer, tools=[ADD_TOOL])
    schema_sent = fake_openai.requests[0]["response_format"]
    assert schema_sent["type"] == "json_schema"
    assert "value" in json.dumps(schema_sent["json_schema"])
    assert "response_format" not in fake_openai.requests[1]


# --- retries -------------------------------------------------------------------


def test_rate_limit_waits_for_retry_after_then_succeeds(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(rate_limited(retry_after=1), text_reply("ok"))
    response = ask(model_for(fake_openai))
    assert response.message["content"] == "ok"
    assert len(fake_openai.requests) == 2
    waited = fake_openai.timestamps[1] - fake_openai.timestamps[0]
    assert 0.9 <= waited < 3.0


@pytest.mark.parametrize("status", [500, 502, 504, 529, 409])
def test_transient_status_is_retried(fake_openai: FakeOpenAI, status: int) -> None:
    fake_openai.script(server_error(status), text_reply("recovered"))
    assert ask(model_for(fake_openai)).message["content"] == "recovered"
    assert len(fake_openai.requests) == 2


def test_503_is_retried(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(unavailable(), unavailable(), text_reply("back"))
    assert ask(model_for(fake_openai)).message["content"] == "back"
    assert len(fake_openai.requests) == 3


def test_timeout_is_retried_then_reported_transient(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: slow(5))
    model = model_for(fake_openai, params={"timeout": 0.2}, max_retry_seconds=0.5)
    with pytest.raises(TransientModelError, match=r"(?i)time"):
        ask(model)


def test_retry_after_beyond_budget_raises_at_once(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(rate_limited(retry_after=30))
    with pytest.raises(TransientModelError) as caught:
        ask(model_for(fake_openai, max_retry_seconds=5))
    assert caught.value.retry_after == 30
    assert len(fake_openai.requests) == 1  # raised at once: no second attempt waited for


def test_exhausted_budget_raises_transient(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(lambda body: server_error(500))
    with pytest.raises(TransientModelError, match="retry budget") as caught:
        ask(model_for(fake_openai, max_retry_seconds=0.3, backoff_initial=0.05, backoff_max=0.1))
    # Within the 0.3 s budget at 0.05-0.1 s a wait: a few attempts, not the default budget's (counted, not timed:
    # litellm's first import in a process takes seconds).
    assert 2 <= len(fake_openai.requests) <= 8
    assert caught.value.retry_after is not None


def test_empty_choices_is_transient_and_not_retried_here(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(empty_choices())
    with pytest.raises(TransientModelError, match="empty response") as caught:
        ask(model_for(fake_openai))
    assert len(fake_openai.requests) == 1
    # Answered all the same: the call is paid for and counts for the job (its tokens as the provider said).
    usage = caught.value.usage
    assert isinstance(usage, Usage) and usage.model_calls == 1 and usage.prompt_tokens > 0


# As in production: the suite's warnings-as-errors would turn litellm's serializer warning on the odd content into
# another error before it gets to "Invalid response object".
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_an_answer_litellm_cannot_read_is_permanent_and_counted(fake_openai: FakeOpenAI) -> None:
    # A 200 whose body litellm fails to parse is its InternalServerError "Invalid response object": it was retried
    # as a 5xx for as long as the budget allowed (over a hundred paid calls a job), and none was counted.
    parts = Reply(message={"role": "assistant", "content": [{"type": "text", "text": "3"}]}, finish_reason="stop")
    fake_openai.script(*[parts] * 5)
    with pytest.raises(PermanentModelError, match="answered with a response litellm cannot read") as caught:
        ask(model_for(fake_openai))
    assert len(fake_openai.requests) == 1
    assert "(content: Input should be a valid string)" in str(caught.value)
    assert caught.value.usage == Usage(model_calls=1, unknown_cost_calls=1)
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=model_for(fake_openai), stream=False)])
    app.run_agent("a", job_id="j", messages=["hello"])
    app.drain()
    job = app.get("j")
    assert job.status.value == "error" and "cannot read" in (job.record.error or "")
    assert job.usage.model_calls == 1 and len(fake_openai.requests) == 2


# --- permanent failures ----------------------------------------------------------


def test_bad_request_is_permanent_without_retry(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(bad_request("Invalid value for 'messages'."))
    with pytest.raises(PermanentModelError, match="bad request to model openai/fake-model"):
        ask(model_for(fake_openai))
    assert len(fake_openai.requests) == 1


def test_unauthorized_is_permanent(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(unauthorized())
    with pytest.raises(PermanentModelError, match="authentication failed"):
        ask(model_for(fake_openai))
    assert len(fake_openai.requests) == 1


def test_a_missing_api_key_is_permanent_and_says_what_to_set(fake_openai: FakeOpenAI,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The OpenAI SDK refuses before sending; litellm calls it an InternalServerError, which would be retried.
    from phases.litellm_model import _litellm

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    litellm, calls = _litellm(), []
    real = litellm.completion
    monkeypatch.setattr(litellm, "completion", lambda **kw: calls.append(1) or real(**kw))
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url}, max_retry_seconds=5.0)
    with pytest.raises(PermanentModelError, match=r"no API key for model openai/fake-model: set the provider's key"):
        ask(model)
    assert fake_openai.requests == [] and calls == [1]  # asked once: not retried


def test_context_window_is_permanent_and_says_so(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(context_window_exceeded())
    with pytest.raises(PermanentModelError, match="context window exceeded for model openai/fake-model"):
        ask(model_for(fake_openai))
    assert len(fake_openai.requests) == 1


# --- secrets -----------------------------------------------------------------------


def test_secrets_never_appear_in_errors_or_repr(fake_openai: FakeOpenAI) -> None:
    header_token = "tok-HEADER-SENTINEL-123"
    # The server echoes the credentials back in its error text, as some providers do.
    fake_openai.script(
        bad_request(f"Incorrect API key provided: {SENTINEL}; header Bearer {header_token}"),
        unauthorized(),
        context_window_exceeded(),
        rate_limited(retry_after=60),
        lambda body: server_error(500),
    )
    model = model_for(fake_openai, params={"extra_headers": {"Authorization": f"Bearer {header_token}"},
                                           "temperature": 0}, max_retry_seconds=0.2)
    for _ in range(5):
        with pytest.raises(ModelError) as caught:
            ask(model)
        assert_no_secret(caught.value, SENTINEL, header_token)
    assert SENTINEL not in repr(model) and header_token not in repr(model)
    assert repr(model) == "LiteLLMModel(model='openai/fake-model', params=['api_base', 'temperature'])"
    assert model.safe_params() == {"api_base": fake_openai.url, "temperature": 0}


def test_a_gateway_token_in_the_address_is_masked_whatever_its_name(fake_openai: FakeOpenAI) -> None:
    # A provider's 400 echoes the address it was sent: ?access_token=, ?sig=, ?code= as well as ?key=.
    for name in ("access_token", "sig", "code", "token", "key"):
        fake_openai.script(bad_request(f"No route for POST /v1/?{name}=GW-{SENTINEL}"))
        model = LiteLLMModel("openai/fake-model", params={"api_base": f"{fake_openai.url}?{name}=GW-{SENTINEL}",
                                                          "api_key": "k" * 12})
        with pytest.raises(PermanentModelError) as caught:
            ask(model)
        assert_no_secret(caught.value, SENTINEL)
        assert model.safe_params()["api_base"] == f"{fake_openai.url}?[hidden]"


def test_query_parameters_that_are_no_credentials_stay_readable_in_errors() -> None:
    params = {"api_base": "https://gw/v1?api-version=2024-10-21&tier=2024&region=gpt-4o&access_token=GW-" + SENTINEL}
    text = ("api-version 2024-10-21 does not support this; POST https://gw/v1/chat?max_tokens=512&format=json&"
            f"author=alice&zipcode=12345&X-Amz-Signature=abc123&access_token=GW-{SENTINEL} (model gpt-4o, 2024)")
    masked = _redact(text, params)
    assert SENTINEL not in masked and "X-Amz-Signature=***" in masked
    for kept in ("api-version 2024-10-21", "max_tokens=512", "format=json", "author=alice", "zipcode=12345",
                 "model gpt-4o, 2024"):
        assert kept in masked, kept


def test_safe_params_hide_credential_shaped_values_and_an_addresss_user_part() -> None:
    model = LiteLLMModel("openai/x", params={"base_url": f"https://user:{SENTINEL}@gw/v1", "user": f"Bearer {SENTINEL}",
                                             "extra_body": {"x": "sk-abcdefgh12345678"}, "temperature": 0})
    assert model.safe_params() == {"base_url": "https://gw/v1", "user": "[hidden]", "extra_body": {"x": "[hidden]"},
                                   "temperature": 0}


def test_what_a_provider_echoes_in_its_own_fields_is_masked_in_the_kept_response() -> None:
    from phases.litellm_model import _litellm

    # litellm as the model imports it (its import-time warnings handled), not a bare import of its own
    answer = _litellm().ModelResponse(id="r1", model="m", choices=[
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}])
    setattr(answer, "debug", {"authorization": f"Bearer {SENTINEL}",  # noqa: B010 - a provider's own field
                              "upstream": f"https://api.example/v1?key={SENTINEL}"})
    params = {"api_key": SENTINEL}
    response = LiteLLMModel("openai/fake-model", params=params)._to_response(answer, params)
    assert response.raw is not None and "debug" in response.raw and SENTINEL not in json.dumps(response.raw)


def test_credential_shapes_are_masked_even_when_not_in_params() -> None:
    text = ("Bearer abc.def.ghi failed for https://bob:hunter2@proxy.local/v1?key=AIzaXYZ&x=1 "
            "with sk-proj-ABCDEFGH12345 and api_key=sk-test-SENTINEL")
    masked = _redact(text, {"api_key": SENTINEL, "max_tokens": 100})
    for secret in ("abc.def.ghi", "hunter2", "AIzaXYZ", "sk-proj-ABCDEFGH12345", SENTINEL):
        assert secret not in masked
    assert "x=1" in masked and "proxy.local" in masked


# --- import cost and the test-suite guard -------------------------------------


def test_importing_the_module_does_not_import_litellm() -> None:
    code = "import sys, phases.litellm_model; assert 'litellm' not in sys.modules, 'litellm imported eagerly'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_remote_calls_are_blocked_without_touching_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_litellm() -> Any:
        raise AssertionError("litellm must not even be reached")

    monkeypatch.setattr("phases.litellm_model._litellm", no_litellm)
    for params in ({"api_key": SENTINEL}, {"api_key": SENTINEL, "api_base": "https://api.openai.com/v1"}):
        model = LiteLLMModel("openai/gpt-4o-mini", params=params)
        with pytest.raises(PermanentModelError, match="blocked in the test suite") as caught:
            ask(model)
        assert_no_secret(caught.value, SENTINEL)


def test_mock_response_is_allowed_and_priced() -> None:
    model = LiteLLMModel("gpt-4o-mini", params={"mock_response": "mocked"})
    response = ask(model)
    assert response.message["content"] == "mocked"
    assert response.usage.cost_usd > 0 and response.usage.unknown_cost_calls == 0


# --- the fake server as a process (system tests use it this way) ----------------


def test_w1_responder_counts_turns_from_the_messages() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go turns=3"}]
    first = w1_reply({"messages": messages})
    assert first.message is not None
    assert first.message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 1}'}
    assert len(first.message["content"]) == 200
    messages += [first.message, {"role": "tool", "tool_call_id": "call_1", "content": '{"sum": 2}'}]
    second = w1_reply({"messages": messages})
    assert second.message is not None
    assert json.loads(second.message["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 1}
    messages += [second.message, {"role": "tool", "tool_call_id": "call_2", "content": '{"sum": 3}'}]
    assert w1_reply({"messages": messages}).message == {"role": "assistant", "content": "done"}


def test_fake_server_cli_serves_w1_to_litellm() -> None:
    url = ""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_openai", "--port", "0", "--mode", "w1"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        assert ready[0] == "READY", ready
        url = ready[1]
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as health:
            assert health.status == 200
        model = LiteLLMModel("openai/fake-model", params={"api_base": url, "api_key": "sk-any"})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "add things, turns=2"}]
        first = model.complete(ModelRequest(messages=messages, tools=[ADD_TOOL]))
        assert first.tool_calls[0]["id"] == "call_1"
        messages += [first.message, {"role": "tool", "tool_call_id": "call_1", "content": '{"sum": 2}'}]
        assert model.complete(ModelRequest(messages=messages, tools=[ADD_TOOL])).message["content"] == "done"
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        if url:  # the server ran in its own process: close the client litellm cached for it here
            close_litellm_clients_of(int(urllib.parse.urlsplit(url).port or 0))
    assert proc.returncode == 0


def test_warm_imports_litellm_and_runs_one_offline_completion(monkeypatch: pytest.MonkeyPatch) -> None:
    import litellm

    from phases import litellm_model

    calls: list[dict[str, Any]] = []
    real = litellm.completion

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(litellm, "completion", spy)
    litellm_model.warm()
    # One plain call, plus one streamed call the first time in a process (whether an earlier test did it
    # depends on the order): all offline, no request leaves the process.
    mocked = [c for c in calls if "client" not in c]
    assert len([c for c in mocked if not c.get("stream")]) == 1
    assert mocked and all(c["mock_response"] == "ok" for c in mocked)
    # Then a real call's HTTP path, a streamed call and a plain one (phases.litellm_warm), through a transport
    # that answers in process: a request built and read back, no socket opened.
    through = [c for c in calls if "client" in c]
    assert [bool(c.get("stream")) for c in through] == [True, False]
    assert all(isinstance(c["client"]._client._transport, httpx.MockTransport) for c in through)


def test_an_unreadable_retry_after_ms_leaves_the_plain_retry_after_its_say() -> None:
    class LimitedError(Exception):
        def __init__(self, headers: dict[str, str]) -> None:
            super().__init__("rate limited")
            self.litellm_response_headers = headers

    assert _retry_after(LimitedError({"Retry-After-Ms": "soon", "Retry-After": "7"})) == 7.0
    assert _retry_after(LimitedError({"retry-after-ms": "2500", "retry-after": "7"})) == 2.5  # the finer one first
    assert _retry_after(LimitedError({"retry-after-ms": "soon"})) is None


def test_a_bearer_token_is_masked_and_the_text_around_it_is_kept() -> None:
    text = f"gateway said 401 (Bearer GW-{SENTINEL}); retrying [Bearer a.b_c~d+e/f==] {{auth: Bearer x-1}}"
    masked = _redact(text, {})
    assert SENTINEL not in masked
    assert masked == "gateway said 401 (Bearer ***); retrying [Bearer ***] {auth: Bearer ***}", masked
