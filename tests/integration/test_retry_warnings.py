"""Operators are told: every model retry is a warning naming the model, the error and the next wait.

Two places retry: ``LiteLLMModel`` inside one call (tenacity, within ``max_retry_seconds``), and the agent
turn, which runs the whole turn again later (``RetryLater``) once a call gives up. Both log to the
``pipelines`` logger, which a worker's output shows.
"""

from __future__ import annotations

import logging

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest
from pipelines import Agent, App
from pipelines.engine.errors import TransientModelError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel
from tests.fake_openai import FakeOpenAI, rate_limited, text_reply


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "pipelines" and r.levelno == logging.WARNING]


def test_each_retry_inside_a_model_call_is_a_warning_with_model_error_and_wait(
        fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    fake_openai.script(rate_limited(retry_after=1), text_reply("ok"))
    model = LiteLLMModel("openai/fake-model", params={"api_base": fake_openai.url, "api_key": "sk-test-SECRET"},
                         backoff_initial=0.01, backoff_max=0.05,
                         max_retry_seconds=300.0)  # the first call imports litellm: slow on a busy host
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        answer = model.complete(ModelRequest(messages=[{"role": "user", "content": "hi"}]))
    assert answer.message["content"] == "ok"
    [line] = warnings_of(caplog)
    assert "model openai/fake-model:" in line
    assert "rate limit" in line.lower()
    assert "retrying in 1.0s (attempt 2)" in line
    assert "sk-test-SECRET" not in line


def test_a_turn_run_again_later_is_a_warning_naming_job_model_error_and_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def answer(messages: list[Message]) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TransientModelError("model scripted is unavailable for now: 503", retry_after=7.0)
        return "done"

    agent = Agent(name="a", model=ScriptedModel(answer), stream=False)
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[agent])
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        job = app.run_agent("a", job_id="j1", messages=["hi"]).wait()
    assert job.status.value == "complete"
    lines = [w for w in warnings_of(caplog) if "runs again" in w]
    assert lines == ["job j1: model ScriptedModel failed: model scripted is unavailable for now: 503; "
                     "the turn runs again in 7.0s"]
