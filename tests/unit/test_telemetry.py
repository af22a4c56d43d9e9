"""OpenTelemetry: one trace per job across turns, GenAI spans for model and tool calls, metrics."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest, ModelResponse, provider_of
from pipelines import Agent, App, Done, Phase, RateLimit, tool
from pipelines.engine import telemetry
from pipelines.engine.errors import PermanentModelError
from pipelines.engine.phase import WaitForInput
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()


class _Breaking(SpanProcessor):
    """A span processor that raises, as a broken exporter plug-in may, in ``on_start`` or ``on_end`` when told to."""

    mode = ""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.mode == "start":
            raise RuntimeError("exporter plug-in broke")

    def on_end(self, span: Any) -> None:
        if self.mode == "end":
            raise RuntimeError("exporter plug-in broke")


_BREAKING = _Breaking()


@pytest.fixture(scope="module", autouse=True)
def _providers() -> Iterator[None]:
    # The global providers can be set once per process: reuse an SDK tracer provider another test set.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(_BREAKING)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))
    telemetry.reset()
    yield
    telemetry.reset()


@pytest.fixture(autouse=True)
def _clear() -> None:
    _EXPORTER.clear()


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def run_agent_job(job_id: str) -> App:
    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, call("lookup", order="A-1"), call("lookup", order="A-2")), "Both shipped."])
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="support", model=model, tools=[lookup])])
    app.run_agent("support", job_id=job_id, messages=["where are A-1 and A-2?"]).wait(timeout=5)
    return app


def test_every_turn_model_call_and_tool_call_is_a_span_of_the_jobs_one_trace() -> None:
    app = run_agent_job("t1")
    spans = _EXPORTER.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    run = by_name["run support"][0]
    assert app.get("t1").record.trace and "traceparent" in app.get("t1").record.trace
    assert len(by_name["turn support"]) == 2 and len(by_name["chat scripted"]) == 2
    assert len(by_name["execute_tool lookup"]) == 2
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}  # one trace per job
    turns = {s.context.span_id for s in by_name["turn support"]}
    assert all(s.parent.span_id in turns for s in by_name["chat scripted"] + by_name["execute_tool lookup"])
    chat = by_name["chat scripted"][0].attributes
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.response.model"] == "scripted"
    assert "gen_ai.request.model" not in chat and "gen_ai.provider.name" not in chat  # a ScriptedModel names neither
    assert chat["gen_ai.usage.input_tokens"] > 0 and chat["gen_ai.response.finish_reasons"] == ("tool_calls",)
    tool_attrs = by_name["execute_tool lookup"][0].attributes
    assert tool_attrs["gen_ai.tool.name"] == "lookup" and tool_attrs["gen_ai.tool.call.id"]
    assert by_name["turn support"][0].attributes["phaserunner.queue_lag_s"] >= 0


def test_two_jobs_are_two_traces_and_the_metrics_count_turns_and_tokens() -> None:
    run_agent_job("m1")
    run_agent_job("m2")
    runs = [s for s in _EXPORTER.get_finished_spans() if s.name == "run support"]
    assert len({s.context.trace_id for s in runs}) == 2
    data = _READER.get_metrics_data()
    points: dict[str, float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points[m.name] = sum(getattr(p, "value", 0) or getattr(p, "count", 0) for p in m.data.data_points)
    assert points["phaserunner.turns"] >= 4 and points["gen_ai.client.token.usage"] >= 8
    assert "gen_ai.client.operation.duration" in points and "phaserunner.turn.duration" in points


@pytest.mark.parametrize("mode", ["start", "end"])
def test_a_span_processor_that_raises_changes_nothing_a_job_does(mode: str, caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_REPORTED", set(), raising=False)  # what earlier tests logged is forgotten
    _BREAKING.mode = mode  # broken from before the jobs start to after they end: every span of theirs meets it
    try:
        agent = run_agent_job(f"broken-{mode}")  # two turns, two model calls, two tool calls
        storage, scheduler, _ = memory()
        app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("x", lambda ctx: Done(result=1))]})
        app.run_pipeline("p", job_id=f"broken-p-{mode}", initial_state={})
        scheduler.drain()
    finally:
        _BREAKING.mode = ""
    assert agent.get(f"broken-{mode}").record.status.value == "complete"
    assert agent.get(f"broken-{mode}").record.error is None
    assert app.get(f"broken-p-{mode}").record.status.value == "complete"
    logged = [r for r in caplog.records if r.name == telemetry.__name__]
    assert len(logged) == 1 and "logged once" in logged[0].getMessage(), logged  # once, not per span or turn


class _Named(ScriptedModel):
    model = "scripted"  # a name a RateLimit can match


def test_a_model_call_the_rate_limit_defers_makes_no_model_span() -> None:
    storage, scheduler, _ = memory()
    model = _Named(["one", "two"])
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=model)],
              rate_limits=[RateLimit(model="scripted", rpm=1)])
    app.run_agent("a", job_id="r1", messages=["hi"])
    app.run_agent("a", job_id="r2", messages=["hi"])
    scheduler.run_next()
    scheduler.run_next()  # one request a minute: this turn is deferred before its model is called
    assert len(model.calls) == 1
    spans = _EXPORTER.get_finished_spans()
    chats = [s for s in spans if s.name.startswith("chat")]
    assert len(chats) == 1 and chats[0].status.status_code is StatusCode.UNSET, chats  # the call made, only
    deferred = [s for s in spans if s.attributes.get("phaserunner.result") == "deferred"]
    assert len(deferred) == 1 and deferred[0].status.status_code is StatusCode.UNSET


class _Refused(LiteLLMModel):
    """A litellm model its provider refuses, as a bad request is refused (no network)."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise PermanentModelError(f"bad request to model {self.model}: nope")


def test_a_failed_model_calls_span_names_the_model_requested_and_its_provider() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="b", model=_Refused("openai/gpt-4o"))])
    app.run_agent("b", job_id="refused", messages=["hi"])
    scheduler.drain()
    assert app.get("refused").record.status.value == "error"
    (chat,) = [s for s in _EXPORTER.get_finished_spans() if s.name.startswith("chat")]
    assert chat.name == "chat openai/gpt-4o" and chat.status.status_code is StatusCode.ERROR
    assert chat.attributes["gen_ai.request.model"] == "openai/gpt-4o"
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["error.type"] == "pipelines.engine.errors.PermanentModelError"
    (turn,) = [s for s in _EXPORTER.get_finished_spans() if s.name == "turn b"]
    assert turn.status.status_code is StatusCode.ERROR and turn.attributes["error.type"] == "_OTHER"  # Fail, no raise


def _spans_of(job_id: str, tools: list[Any], *script: Any) -> list[Any]:
    """The execute_tool spans of an agent job run to its end (alone: the spans before it are dropped)."""
    _EXPORTER.clear()
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(list(script)),
                                                                  tools=tools)])
    app.run_agent("a", job_id=job_id, messages=["hi"])
    scheduler.drain()
    return [s for s in _EXPORTER.get_finished_spans() if s.name.startswith("execute_tool")]


def test_a_tool_that_raises_or_times_out_has_a_failed_span_with_its_error_type_and_never_its_arguments() -> None:
    @tool
    def find(order: str) -> str:
        """Look an order up."""
        raise KeyError(order)

    @tool(timeout=0.05)
    async def stuck() -> str:
        """Awaits an event nobody sets."""
        await asyncio.Event().wait()
        return "never"

    (raised,) = _spans_of("tool-raised", [find], reply(None, call("find", order="SECRET-ORDER")), "sorry")
    (late,) = _spans_of("tool-late", [stuck], reply(None, call("stuck")), "sorry")
    assert raised.status.status_code is StatusCode.ERROR and raised.attributes["error.type"] == "KeyError"
    assert late.status.status_code is StatusCode.ERROR and late.attributes["error.type"] == "timeout"
    shown = repr([dict(raised.attributes), raised.status.description, [dict(e.attributes) for e in raised.events]])
    assert "SECRET-ORDER" not in shown  # the call's arguments (here in the exception's message) stay out


def test_a_tool_that_asks_for_input_has_no_failed_span() -> None:
    @tool
    def approve() -> str:
        """Asks a person."""
        raise WaitForInput("a person decides")

    (asked,) = _spans_of("tool-asks", [approve], reply(None, call("approve")), "done")
    assert asked.status.status_code is StatusCode.UNSET and "error.type" not in asked.attributes


def test_a_phase_that_raises_fails_its_turns_span_with_the_exceptions_type() -> None:
    def boom(ctx: Any) -> Any:
        raise RuntimeError("phase blew up")

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"boom": [Phase("x", boom)]})
    app.run_pipeline("boom", job_id="boom", initial_state={})
    scheduler.drain()
    (turn,) = [s for s in _EXPORTER.get_finished_spans() if s.name == "turn boom"]
    assert turn.status.status_code is StatusCode.ERROR and turn.attributes["error.type"] == "RuntimeError"
    assert turn.attributes["phaserunner.result"] == "failed"


class _Acme(ScriptedModel):
    model = "acme/large"  # a custom model: its provider is not guessed from the name


def test_the_answering_model_is_gen_ai_response_model_beside_the_model_requested() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=_Acme(["hi"]))])
    app.run_agent("a", job_id="acme", messages=["hi"])
    scheduler.drain()
    (chat,) = [s for s in _EXPORTER.get_finished_spans() if s.name.startswith("chat")]
    assert chat.name == "chat acme/large" and chat.attributes["gen_ai.request.model"] == "acme/large"
    assert chat.attributes["gen_ai.response.model"] == "scripted"  # what the answer says answered
    assert "gen_ai.provider.name" not in chat.attributes


@pytest.mark.parametrize(("model", "provider"), [
    (LiteLLMModel("openai/gpt-4o"), "openai"), (LiteLLMModel("bedrock/anthropic.claude-3"), "aws.bedrock"),
    (LiteLLMModel("vertex_ai/gemini-pro"), "gcp.vertex_ai"), (LiteLLMModel("ollama/llama3"), "ollama"),
    (LiteLLMModel("gpt-4o"), None), (_Acme(["hi"]), None)])
def test_the_provider_is_that_of_a_litellm_model_strings_prefix(model: object, provider: str | None) -> None:
    assert provider_of(model) == provider


def test_off_switch_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(telemetry.ENV, "0")
    telemetry.reset()
    try:
        app = run_agent_job("off")
        assert _EXPORTER.get_finished_spans() == () and app.get("off").record.trace is None
        assert not telemetry.enabled()
    finally:
        monkeypatch.delenv(telemetry.ENV)
        telemetry.reset()


# Run in a fresh process: the global providers can be set only once per process, and here they must start unset.
_LATE_PROVIDER = r'''
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest, ModelResponse
from pipelines.engine import telemetry
from pipelines.engine.errors import PermanentModelError
from pipelines.engine.phase import WaitForInput
from tests.unit.test_telemetry import run_agent_job

assert telemetry.enabled()  # the API is installed: only the providers are missing
first = run_agent_job("before")
assert first.get("before").record.trace == {}, first.get("before").record.trace  # nothing to carry
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
run_agent_job("after")  # no telemetry.reset(): providers set after the first turns are picked up as they are
names = sorted(s.name for s in exporter.get_finished_spans())
assert names.count("turn support") == 2 and names.count("chat scripted") == 2, names
assert names.count("execute_tool lookup") == 2, names
assert all(s.attributes.get("phaserunner.job_id", "after") == "after" for s in exporter.get_finished_spans())
turns = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
         if m.name == "phaserunner.turns"]
assert sum(p.value for p in turns[0].data.data_points) == 2, turns
print("ok")
'''


def test_no_provider_records_nothing_and_a_provider_set_later_is_used_from_its_next_turn() -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop(telemetry.ENV, None)
    out = subprocess.run([sys.executable, "-c", _LATE_PROVIDER], capture_output=True, text=True, timeout=60, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# Run in a fresh process: the API reads these variables when it first looks a provider (or propagators) up.
_MISCONFIGURED = r'''
import logging

from pipelines.engine import telemetry
from tests.unit.test_telemetry import run_agent_job

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger(telemetry.__name__).addHandler(handler)
for job_id in ("j1", "j2"):  # the second job logs nothing more
    app = run_agent_job(job_id)
    assert app.get(job_id).record.status.value == "complete", app.get(job_id).record
warnings = [r for r in records if r.levelno == logging.WARNING]
assert len(warnings) == 1 and not warnings[0].exc_info, [r.getMessage() for r in records]
print(warnings[0].getMessage())
'''


@pytest.mark.parametrize(("variable", "value", "named"), [
    ("OTEL_PROPAGATORS", "b3", "OTEL_PROPAGATORS"),  # the b3 propagator package is not installed
    ("OTEL_PYTHON_TRACER_PROVIDER", "no_such_provider", "OTEL_PYTHON_TRACER_PROVIDER"),
    ("OTEL_PYTHON_METER_PROVIDER", "no_such_provider", "OTEL_PYTHON_METER_PROVIDER"),
])
def test_an_otel_environment_the_api_cannot_set_up_turns_telemetry_off_with_one_warning_and_jobs_run(
        variable: str, value: str, named: str) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop(telemetry.ENV, None)
    env[variable] = value
    out = subprocess.run([sys.executable, "-c", _MISCONFIGURED], capture_output=True, text=True, timeout=60, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"({named}?)" in out.stdout and "is off in this process" in out.stdout, out.stdout


class _Leaky(ScriptedModel):
    """A model (not litellm's: nothing redacts its errors) whose error names its address with a key in it."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise ConnectionError("cannot reach https://user:sk-live-SECRET123456@llm.internal/v1?api_key=QUERYSECRET "
                              f"(Bearer TOKENSECRET, env {os.environ['ACME_API_KEY']}) " + "x" * 2000)


def test_a_failed_model_calls_exception_event_has_its_type_and_redacted_short_message_and_no_stack_trace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_API_KEY", "ENVSECRET-1234")
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="leaky", model=_Leaky(["unused"]))])
    app.run_agent("leaky", job_id="leaky", messages=["hi"])
    scheduler.drain()
    (chat,) = [s for s in _EXPORTER.get_finished_spans() if s.name.startswith("chat")]
    (event,) = [e for e in chat.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ConnectionError"
    message = str(event.attributes["exception.message"])
    assert message.startswith("cannot reach https://***@llm.internal/v1?api_key=***") and "Bearer ***" in message
    assert "SECRET" not in message and "sk-live" not in message
    assert len(message) == telemetry.MESSAGE_MAX and message.endswith("…")
    assert "exception.stacktrace" not in event.attributes


def test_an_address_with_a_password_and_no_user_is_masked_too() -> None:
    # redis://:hunter2@host (a password alone, as Redis URLs carry it) showed its password in a masked message.
    from pipelines.engine.masking import mask

    text = "cannot reach redis://:hunter2pw@cache:6379/0 nor https://bob:s3cret-pw@gw/v1 (http://host:8080/x@y)"
    assert mask(text) == "cannot reach redis://***@cache:6379/0 nor https://***@gw/v1 (http://host:8080/x@y)"


def test_keys_named_as_such_basic_credentials_and_aws_key_ids_are_masked() -> None:
    from pipelines.engine.masking import mask

    text = ('401 from gw: headers {"x-api-key": "gw-k3y-123456", "Authorization": "Basic dXNlcjpwYXNzd29yZA=="} '
            "body {'api_key': 'abcd-efgh-1234'} AKIAABCDEFGHIJKLMNOP; api-version 2024-10-21, max_tokens=512; "
            "Basic authentication failed")
    assert mask(text) == ('401 from gw: headers {"x-api-key": "***", "Authorization": "Basic ***"} '
                          "body {'api_key': '***'} AKIA***; api-version 2024-10-21, max_tokens=512; "
                          "Basic authentication failed")


def test_a_phases_or_tools_error_is_stored_and_told_with_its_credentials_masked() -> None:
    # A user's exception quoting a key reached the job's error (storage) and the transcript the model reads.
    from adapters.memory import MemoryScheduler, MemoryStorage
    from pipelines import Agent, App, Phase, tool
    from pipelines.testing import ScriptedModel, call, reply

    def phase(ctx: Any) -> Any:
        raise RuntimeError("upstream https://bob:hunter2secret@gw/v1 refused Bearer tok-123456789")

    @tool
    def fetch() -> str:
        """Fetch."""
        raise ValueError("POST https://api/v1?api_key=sk-live-abcdefghijkl failed")

    agent = Agent(name="a", tools=[fetch],
                  model=ScriptedModel(lambda m: reply(None, call("fetch")) if len(m) == 1 else "done"))
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), pipelines={"p": [Phase("x", phase)]},
              agents=[agent], provenance=False)
    app.run_pipeline("p", job_id="p1")
    app.run_agent("a", job_id="a1", user="go")
    app.drain()
    error = app.get("p1").error  # type: ignore[union-attr]
    assert error is not None and "hunter2secret" not in error and "tok-123456789" not in error
    assert "https://***@gw/v1" in error and "Bearer ***" in error
    told = next(m["content"] for m in app.messages("a1") if m["role"] == "tool")
    assert "sk-live" not in told and "api_key=***" in told
