"""A turn leaves no reference cycles behind: what it built is freed when it ends, not by the garbage collector.

Garbage in cycles is what makes CPython's collector run: each collection walks the young objects,
and every few the whole heap (a worker with litellm imported holds ~170,000 objects). A turn's
context closed over by a callback it holds kept the turn's every object (record, model answer,
stream buffers) alive until a collection: about 60 objects a turn, and the memory W1 ran ~20 %
slower for it. Each test here runs turns with the collector off, then counts what a collection finds.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest
from pipelines import Agent, tool
from pipelines.app import App
from pipelines.engine.errors import TransientModelError
from pipelines.testing import ScriptedModel, call, reply


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@tool(needs_approval=True)
def approve_me(a: int) -> dict[str, int]:
    """A call a person approves first."""
    return {"a": a}


@tool
async def add_async(a: int, b: int) -> dict[str, int]:
    """Add two numbers, as a coroutine."""
    return {"sum": a + b}


def _answers(turns: int) -> Callable[[list[dict[str, Any]]], Any]:
    def fn(messages: list[dict[str, Any]]) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k >= turns - 1:
            return "done"
        return reply("adding " * 20, call("add" if k % 2 else "add_async", a=k, b=1))

    return fn


@pytest.fixture
def collector_off() -> Iterator[list[Any]]:
    """The collector off, finds kept: yields the list a collection's finds land in (``gc.garbage``)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _ours(found: list[Any]) -> list[str]:
    """The objects of this library's own types among ``found`` (other threads may leave garbage of theirs)."""
    names = [f"{type(o).__module__}.{type(o).__qualname__}" for o in found]
    return sorted(n for n in names if n.split(".")[0] in ("pipelines", "phases", "adapters", "tenacity"))


@pytest.mark.parametrize("stream", [True, False])
def test_agent_turns_on_the_memory_adapters_leave_no_reference_cycles(stream: bool,
                                                                      collector_off: list[Any]) -> None:
    model = ScriptedModel(_answers(6))
    agent = Agent(name="adder", model=model, tools=[add, add_async], system="add", max_turns=8, stream=stream)
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    for j in range(3):
        agent.run(job_id=f"cycles-{j}", messages=["add"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert [storage.get_job(f"cycles-{j}").status.value for j in range(3)] == ["complete"] * 3  # type: ignore[union-attr]
    model.calls.clear()  # the requests recorded: dropped as a test would drop the model
    gc.collect()
    assert _ours(collector_off) == []
    # Not in a cycle either: everything a turn made was freed when it ended (no PhaseContext left alive).
    alive = [o for o in gc.get_objects() if type(o).__name__ == "PhaseContext"]
    assert [c.job_id for c in alive if c.job_id.startswith("cycles-")] == []


class _FlakyModel:
    """Answers from ``script`` but fails each job's first call with a transient error (the turn retries later)."""

    def __init__(self, script: ScriptedModel) -> None:
        self.script = script
        self.failed: set[str] = set()

    def complete(self, request: ModelRequest) -> Any:
        if request.job_id not in self.failed:
            self.failed.add(request.job_id)
            raise TransientModelError("rate limited", retry_after=0.0)
        return self.script.complete(request)


def test_turns_that_wait_for_approval_or_retry_later_leave_no_reference_cycles(collector_off: list[Any]) -> None:
    # Both end by a control signal (WaitForInput, RetryLater) that the runner catches and keeps as the
    # outcome: with its traceback, whose frames hold that outcome, it was a cycle of the whole turn.
    model = _FlakyModel(ScriptedModel(_answers(3)))
    agent = Agent(name="flaky", model=model, tools=[add, add_async], max_turns=5)  # type: ignore[arg-type]
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    app = App.for_adapters(storage, scheduler)
    app.add_agent(agent, replace=True)

    def asks(messages: list[dict[str, Any]]) -> Any:
        asked = any(m["role"] == "assistant" for m in messages)
        return "ok" if asked else reply(None, {**call("approve_me", a=1), "id": "ask-1"})

    app.add_agent(Agent(name="asks", model=ScriptedModel(asks), tools=[approve_me]), replace=True)
    for j in range(3):
        app.run_agent("flaky", job_id=f"cycles-r{j}", messages=["add"])
        app.run_agent("asks", job_id=f"cycles-a{j}", messages=["add"])
    scheduler.drain()
    assert {app.get(f"cycles-a{j}").status.value for j in range(3)} == {"waiting"}
    for j in range(3):
        app.approve(f"cycles-a{j}", "ask-1")
    scheduler.drain()
    assert [app.get(f"cycles-{k}{j}").status.value for k in "ra" for j in range(3)] == ["complete"] * 6
    gc.collect()
    assert _ours(collector_off) == []


def test_scripted_model_records_requests_without_the_turn_s_callbacks() -> None:
    model = ScriptedModel(["hello there, streamed"])
    pieces: list[str] = []
    request = ModelRequest(messages=[{"role": "user", "content": "hi"}], on_delta=pieces.append,
                           on_restart=pieces.clear)
    model.complete(request)
    assert "".join(pieces) == "hello there, streamed"  # the caller's callback was used ...
    kept = model.calls[0]
    assert kept.on_delta is None and kept.on_restart is None  # ... and not kept with the request
    assert kept.messages == request.messages
    plain = ModelRequest(messages=[{"role": "user", "content": "hi"}])
    other = ScriptedModel(["x"])
    other.complete(plain)
    assert other.calls == [plain] and other.calls[0] is plain  # a request without callbacks is kept as it came


def test_litellm_model_calls_leave_no_reference_cycles(collector_off: list[Any]) -> None:
    model = LiteLLMModel("openai/x", params={"api_key": "sk-test"})
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})}}]}
    answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "x",
              "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
              "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    for _ in range(3):
        response = model.complete(ModelRequest(messages=[{"role": "user", "content": "add"}],
                                               params={"mock_response": answer}))
        assert response.message["tool_calls"][0]["function"]["name"] == "add"
    gc.collect()
    # tenacity's retry controller, made per call, was a cycle of its own (its state holds its bound methods).
    assert _ours(collector_off) == []
