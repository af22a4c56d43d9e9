"""The job event log and its hooks (issue 7)."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

from phases.approvals import approve
from pipelines import Agent, tool
from pipelines.engine.events import on_event
from pipelines.engine.models import Event
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def test_an_agent_job_writes_an_ordered_event_log_with_turn_numbers() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, {**call("add", a=1, b=2), "id": "c1"}), "3"])
    Agent(model=model, tools=[add]).run(job_id="e", messages=["1+2?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    events = storage.events("e")
    assert [(e.type, e.turn) for e in events] == [
        ("job_started", None),
        ("turn_started", 1), ("model_response", 1), ("tool_call", 1), ("tool_result", 1), ("turn_committed", 1),
        ("turn_started", 2), ("model_response", 2), ("turn_committed", 2),
        ("job_finished", None),
    ]
    assert events[2].data["tool_calls"] == 1 and events[2].data["prompt_tokens"] > 0
    assert events[3].data == {"call_id": "c1", "tool": "add"}
    assert events[4].data == {"call_id": "c1", "tool": "add", "error": False}
    assert events[-1].data == {"reason": "done"}
    assert all(a.timestamp <= b.timestamp for a, b in itertools.pairwise(events))


def test_a_reader_resumes_from_its_cursor() -> None:
    storage, scheduler, _ = memory()
    Agent(model=ScriptedModel([reply(None, call("add", a=1, b=1)), "2"]), tools=[add]).run(
        job_id="c", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.run_next()
    first = storage.events("c")
    scheduler.drain()
    rest = storage.events("c", after=first[-1].id)
    assert [e.type for e in first + rest] == [e.type for e in storage.events("c")]
    assert rest[0].type == "turn_started" and rest[0].turn == 2


def test_failures_and_approvals_are_events() -> None:
    @tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Send money."""
        return "sent"

    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, {**call("wire", amount=5), "id": "w1"}), "sent it"])
    Agent(model=model, tools=[wire]).run(job_id="a", messages=["pay"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.events("a")[-1].type == "approval_requested"
    assert storage.events("a")[-1].data["calls"][0]["call_id"] == "w1"
    approve("a", "w1", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.events("a")[-1].type == "job_finished"

    class Boom:
        def complete(self, request: Any) -> Any:
            raise RuntimeError("model exploded")

    Agent(model=Boom()).run(job_id="f", messages=["x"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    last = storage.events("f")[-1]
    assert last.type == "job_failed" and "model exploded" in last.data["error"]


def test_hooks_and_stdlib_logging_see_committed_events(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, Event]] = []
    unsubscribe = on_event(lambda job_id, event: seen.append((job_id, event)))
    try:
        storage, scheduler, _ = memory()
        with caplog.at_level(logging.INFO, logger="pipelines.events"):
            Agent(model=ScriptedModel(["hi"])).run(job_id="h", messages=["x"], storage=storage, scheduler=scheduler)
            scheduler.drain()
    finally:
        unsubscribe()
    assert [e.type for _, e in seen] == ["job_started", "turn_started", "model_response", "turn_committed",
                                         "job_finished"]
    assert {j for j, _ in seen} == {"h"}
    assert any("h job_finished" in r.getMessage() for r in caplog.records)


def test_a_failing_hook_does_not_affect_the_job() -> None:
    def broken(job_id: str, event: Event) -> None:
        raise ValueError("hook bug")

    unsubscribe = on_event(broken)
    try:
        storage, scheduler, _ = memory()
        Agent(model=ScriptedModel(["hi"])).run(job_id="b", messages=["x"], storage=storage, scheduler=scheduler)
        scheduler.drain()
    finally:
        unsubscribe()
    assert storage.get_job("b").status == "complete"  # type: ignore[union-attr]


def test_turn_started_carries_the_time_the_turn_began_not_when_its_events_were_built() -> None:
    storage, scheduler, clock = memory()

    class Slow(ScriptedModel):
        def complete(self, request: Any) -> Any:
            clock.advance(7.0)  # the model takes 7 s (virtual)
            return super().complete(request)

    model = Slow([reply(None, {**call("add", a=1, b=2), "id": "c1"}), "3"])
    agent = Agent(model=model, tools=[add])
    agent.run(job_id="t", messages=["1+2?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    events = {(e.type, e.turn): e.timestamp for e in storage.events("t")}
    for turn in (1, 2):
        started, answered = events[("turn_started", turn)], events[("model_response", turn)]
        assert answered - started == pytest.approx(7.0)  # the turn began before the model's 7 s, not after
    assert events[("turn_started", 2)] >= events[("turn_committed", 1)]  # still in order across turns


@pytest.mark.parametrize("event", [
    Event(timestamp=1796315405.5010378, type="tool_result", turn=3, phase="turn",
          data={"call_id": "c", "tool": "add", "error": False, "n": [1, 2.5, None, {"k": "é"}]}),
    Event(timestamp=0.1, type="job_started"),
    Event(id="12", timestamp=1e16, type="x", turn=0, data={}),
    Event(timestamp=-2.0, type="y", phase="p", data={"big": 10**30, "s": "a \U0001f600 pair"}),
], ids=["full", "bare", "with-id", "odd-values"])
def test_an_event_line_is_the_text_pydantic_writes_for_it(event: Event) -> None:
    # dump_events builds an event's line itself on the hot path: it must be exactly the model's own dump.
    from pipelines.engine.models import dump_events

    assert dump_events([event]) == [event.model_dump_json(exclude={"id"}, exclude_defaults=True)]
    assert Event.model_validate_json(dump_events([event])[0]) == event.model_copy(update={"id": ""})
