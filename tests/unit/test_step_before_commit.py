"""Which journal writes the agent turn marks as its last before the commit (``StepBeforeCommit``).

A turn's one tool call, or a final answer (no tool calls), and only when nothing with effects outside the
job runs between it and the commit: no lifecycle callback, structured answer or title. Several calls are
journaled as each ends; an answer with calls gates them, so it waits for its reply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel

from adapters.base import Feature
from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, JobStatus, tool
from pipelines.engine.models import Event, JSONValue
from pipelines.testing import ScriptedModel, call, reply


class LastStepStorage(MemoryStorage):
    """A memory storage that declares the feature and notes which steps came through it (journaled as usual)."""

    features: ClassVar = MemoryStorage.features | {Feature.STEP_BEFORE_COMMIT}

    def __init__(self) -> None:
        super().__init__()
        self.last_steps: list[str] = []
        self.steps: list[str] = []

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        self.steps.append(key)
        super().record_step(job_id, version=version, owner=owner, key=key, value=value)

    def record_step_before_commit(self, job_id: str, *, version: int, owner: str | None, key: str,
                                  value: JSONValue, parts: Sequence[Event] = (),
                                  on_refused: Callable[[], None] | None = None) -> None:
        self.last_steps.append(key)
        MemoryStorage.record_step(self, job_id, version=version, owner=owner, key=key, value=value)  # not noted
        self.publish(job_id, parts)


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def _run(agent: Agent) -> LastStepStorage:
    storage, scheduler = LastStepStorage(), MemoryScheduler()
    agent.run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.COMPLETE, job
    return storage


def test_a_turns_one_tool_call_and_a_final_answer_are_its_last_write_before_the_commit() -> None:
    model = ScriptedModel([reply(None, call("add", a=1, b=2)), reply(None, call("add", a=3, b=4)), "done"])
    storage = _run(Agent(model=model, tools=[add]))
    # The answers with calls wait for their reply (it gates the calls); the calls and the final answer do not.
    assert storage.last_steps == ["tool:call_0_0", "tool:call_1_0", "model"]
    assert storage.steps == ["model", "model"]
    assert [m["content"] for m in storage.messages("j") if m["role"] == "tool"] == ["3", "7"]
    # The final answer's streamed text went out with its journal write, as every answer's does.
    assert "".join(str(e.data.get("text", "")) for e in storage.read_live("j") if e.turn == 3) == "done"


def test_several_calls_a_callback_or_a_structured_answer_keep_every_write_synchronous() -> None:
    two = reply(None, call("add", a=1, b=2), call("add", a=3, b=4))
    storage = _run(Agent(model=ScriptedModel([two, "done"]), tools=[add]))
    assert storage.last_steps == ["model"] and {"tool:call_0_0", "tool:call_0_1"} <= set(storage.steps)

    seen: list[Any] = []
    one = ScriptedModel([reply(None, call("add", a=1, b=2)), "done"])
    storage = _run(Agent(model=one, tools=[add], on_turn_end=seen.append))
    assert storage.last_steps == [] and "tool:call_0_0" in storage.steps and len(seen) == 2
    assert storage.steps.count("model") == 2

    class Answer(BaseModel):
        total: int

    structured = ScriptedModel([reply(None, call("add", a=2, b=3)), "five", '{"total": 5}'])
    storage = _run(Agent(model=structured, tools=[add], output_schema=Answer))
    assert storage.last_steps == [] and "tool:call_0_0" in storage.steps and "model" in storage.steps
