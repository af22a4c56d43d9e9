"""The agent loop through litellm's real HTTP path, against the loopback fake server (issue 3)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from pipelines import Agent, JobStatus, tool
from tests.fake_openai import FakeOpenAI, call, rate_limited, text_reply, tool_reply


class Crash(BaseException):
    """The worker dies (nothing in the library catches a BaseException)."""


def agent(fake: FakeOpenAI, tools: list[Any]) -> Agent:
    return Agent(model="openai/fake-model", tools=tools, max_turns=5,
                 model_params={"api_base": fake.url, "api_key": "sk-test"})


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_crash_inside_a_turn_does_not_call_the_model_again(fake_openai: FakeOpenAI, backend: str,
                                                            request: pytest.FixtureRequest) -> None:
    storage: Any = MemoryStorage() if backend == "memory" else RedisStorage.from_url(
        request.getfixturevalue("redis_url"))
    scheduler = MemoryScheduler()
    effects: list[int] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add; the worker dies right after the first call's effect."""
        effects.append(a)
        return a + b

    @tool
    def die_once() -> str:
        """Kills the worker once, after add has finished in the same turn."""
        if len(effects) == 1 and not getattr(die_once, "done", False):
            die_once.done = True  # type: ignore[attr-defined]
            raise Crash()
        return "ok"

    fake_openai.script(tool_reply(call("add", {"a": 2, "b": 3}, id="c1")),
                       tool_reply(call("die_once", {}, id="c2")),
                       text_reply("5"))
    a = agent(fake_openai, [add, die_once])
    a.run(job_id="h", messages=["2+3?"], storage=storage, scheduler=scheduler)
    scheduler.run_next()  # turn 1: add
    with pytest.raises(Crash):
        scheduler.run_next()  # turn 2 dies inside die_once
    scheduler.schedule_advance("h", pipeline="agent")  # the sweep finds it due again
    scheduler.drain()
    job = storage.get_job("h")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == "5"
    assert len(fake_openai.requests) == 3  # one request per turn, the crashed turn included
    assert effects == [2]
    assert [m["role"] for m in storage.messages("h")] == ["user", "assistant", "tool", "assistant", "tool",
                                                          "assistant"]


def test_a_429_with_retry_after_is_retried_and_counted_once(fake_openai: FakeOpenAI) -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    fake_openai.script(rate_limited(0.2), text_reply("hello"))
    agent(fake_openai, []).run(job_id="r", messages=["hi"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("r")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == "hello"
    assert len(fake_openai.requests) == 2 and job.usage.model_calls == 1
