"""``ScriptedModel.from_transcript``: a stored conversation replayed offline as a regression test (issue 14)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory


def production_model(messages: list[dict[str, Any]]) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k < 2:
        return reply(f"adding {k}", call("add", a=k, b=10), reasoning_content=f"think {k}")
    return "done"


def conversation(model: Any, add_tool: Any) -> tuple[App, list[dict[str, Any]]]:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="bot", model=model, tools=[add_tool], system="be brief")])
    app.run_agent("bot", job_id="c", messages=["add things"])
    app.drain()
    assert app.get("c").status is JobStatus.COMPLETE
    return app, app.messages("c")


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool(name="add")
def add_broken(a: int, b: int) -> int:
    """Add (a regression: off by one)."""
    return a + b + 1


def test_a_replayed_conversation_reproduces_the_stored_transcript() -> None:
    _, stored = conversation(ScriptedModel(production_model), add)
    replay = ScriptedModel.from_transcript(stored)
    _, again = conversation(replay, add)
    assert again == stored  # same answers, same call ids, same tool results, provider fields kept
    assert len(replay.calls) == 3 and stored[2]["reasoning_content"] == "think 0"


def test_a_replay_shows_a_tool_regression_as_a_different_tool_result() -> None:
    _, stored = conversation(ScriptedModel(production_model), add)
    _, again = conversation(ScriptedModel.from_transcript(stored), add_broken)
    changed = [(a["content"], b["content"]) for a, b in zip(stored, again, strict=True) if a != b]
    assert changed == [("10", "11"), ("11", "12")]


def test_from_transcript_refuses_what_it_cannot_replay() -> None:
    with pytest.raises(InvalidInputError, match="no assistant message"):
        ScriptedModel.from_transcript([{"role": "user", "content": "hi"}])
    with pytest.raises(InvalidInputError, match="must be a list"):
        ScriptedModel.from_transcript("hi")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="dict with a 'role'"):
        ScriptedModel.from_transcript([{"content": "no role"}])
