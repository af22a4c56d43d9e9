"""ScriptedModel's usage estimate: the prompt size of each request, however it is computed."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from phases.model import ModelRequest
from pipelines import Agent, App, tool
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory


def expected(messages: list[dict[str, Any]]) -> int:
    """The estimate as documented: a token per ~4 characters of content, plus one."""
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 + 1


@pytest.mark.parametrize("seed", range(50))
def test_each_request_is_sized_whole_whatever_it_shares_with_the_last_one(seed: int) -> None:
    rng = random.Random(seed)
    model = ScriptedModel(lambda messages: "ok")
    history: dict[str, list[dict[str, Any]]] = {"a": [], "b": [], "": []}
    for step in range(40):
        job = rng.choice(list(history))
        msgs = history[job]
        kind = rng.random()
        if kind < 0.5:  # the agent's way: the same objects, more appended
            msgs = [*msgs, *({"role": "user", "content": rng.choice(["x" * rng.randint(0, 30), None, 7, [1.0]])}
                             for _ in range(rng.randint(0, 3)))]
        elif kind < 0.65:  # equal but distinct objects, one of them changed in value type (1 == 1.0)
            msgs = copy.deepcopy(msgs)
            if msgs:
                msgs[0] = {**msgs[0], "content": [1] if msgs[0].get("content") == [1.0] else msgs[0]["content"]}
        elif kind < 0.8:  # shorter (another view: a compaction, a summary request)
            msgs = msgs[:rng.randint(0, len(msgs))]
        elif msgs and job == "":  # edited in place: only a request without a job id may do that
            msgs[-1]["content"] = "edited " * rng.randint(1, 5)
        history[job] = msgs
        out = model.complete(ModelRequest(messages=list(msgs), job_id=job, turn=step))
        assert out.usage.prompt_tokens == expected(msgs), (seed, step, kind)


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def test_an_agent_runs_usage_is_the_estimate_of_every_request_it_sent() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel(lambda m: reply("x" * 50, call("add", a=len(m), b=1)) if len(m) < 12 else "done")
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=model, tools=[add], system="s")])
    app.run_agent("a", job_id="u", messages=["go"])
    scheduler.drain()
    sent = [e.data["prompt_tokens"] for e in app.events("u") if e.type == "model_response"]
    assert sent == [expected(r.messages) for r in model.calls] and len(sent) == 6
