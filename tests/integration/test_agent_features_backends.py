"""Issue 7's features behave the same on memory and on a real redis-server."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from phases.approvals import approve, pending_calls, reject
from pipelines import Agent, JobStatus, TurnPlan, tool
from pipelines.engine.control import cancel_job, pause_job, resume_job
from pipelines.testing import ScriptedModel, call, reply


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return MemoryStorage()
    return RedisStorage.from_url(request.getfixturevalue("redis_url"))


class Answer(BaseModel):
    total: int


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


effects: list[str] = []


@tool(needs_approval=True)
def wire(to: str) -> str:
    """Send money."""
    effects.append(to)
    return f"sent to {to}"


def test_structured_output(storage: Any) -> None:
    scheduler = MemoryScheduler()
    model = ScriptedModel([reply(None, call("add", a=2, b=3)), "five", '{"total": 5}'])
    agent = Agent(model=model, tools=[add], output_schema=Answer)
    agent.run(job_id="s", messages=["2+3"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert agent.result("s", storage=storage) == Answer(total=5)
    assert storage.get_job("s").stop_reason == "done"


def test_approve_and_reject(storage: Any) -> None:
    effects.clear()
    scheduler = MemoryScheduler()
    two = reply(None, {**call("wire", to="ann"), "id": "w1"}, {**call("wire", to="bob"), "id": "w2"})
    Agent(model=ScriptedModel([two, "done"]), tools=[wire]).run(job_id="a", messages=["pay"], storage=storage,
                                                                 scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("a").status is JobStatus.WAITING
    assert [c["call_id"] for c in pending_calls("a", storage=storage)] == ["w1", "w2"]
    approve("a", "w1", storage=storage, scheduler=scheduler)
    reject("a", "w2", reason="unknown payee", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert effects == ["ann"] and storage.get_job("a").status is JobStatus.COMPLETE
    contents = [m["content"] for m in storage.messages("a") if m["role"] == "tool"]
    assert contents[0] == "sent to ann" and "unknown payee" in contents[1]
    assert "approval_requested" in [e.type for e in storage.events("a")]


def test_pause_resume_cancel_at_the_turn_boundary(storage: Any) -> None:
    scheduler = MemoryScheduler()
    entered, release = threading.Event(), threading.Event()

    @tool
    def slow(n: int) -> int:
        """Blocks the first turn until released."""
        if n == 0:
            entered.set()
            release.wait(5)
        return n

    model = ScriptedModel(lambda msgs: reply(None, call("slow", n=len(msgs) // 2)) if len(msgs) < 6 else "end")
    Agent(model=model, tools=[slow]).run(job_id="p", messages=["go"], storage=storage, scheduler=scheduler)
    worker = threading.Thread(target=scheduler.run_next)
    worker.start()
    assert entered.wait(5)
    threading.Timer(0.2, release.set).start()
    pause_job("p", storage=storage, scheduler=scheduler, wait=5)
    worker.join(5)
    assert storage.get_job("p").status is JobStatus.PAUSED and len(storage.messages("p")) == 3  # turn 1 kept
    scheduler.drain()
    assert len(model.calls) == 1
    resume_job("p", storage=storage, scheduler=scheduler)
    scheduler.run_next()
    cancel_job("p", storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("p")
    assert job.status is JobStatus.CANCELLED and len(model.calls) == 2 and job.checkpoint is not None


def test_token_budget_and_prepare_turn(storage: Any) -> None:
    scheduler = MemoryScheduler()
    seen: list[int] = []

    def prepare(plan: TurnPlan) -> None:
        seen.append(plan.turn)

    model = ScriptedModel(lambda msgs: reply("x" * 400, call("add", a=1, b=1)))
    Agent(model=model, tools=[add], max_turns=50, max_tokens=250, prepare_turn=prepare).run(
        job_id="b", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("b")
    assert job.stop_reason == "budget" and job.usage.total_tokens >= 250 and len(model.calls) < 50
    assert seen == list(range(len(model.calls)))
