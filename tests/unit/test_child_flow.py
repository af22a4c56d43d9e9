"""Flow control over a family of child runs: a child runs under its parent's concurrency key and priority."""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.memory.flow import MemoryFlowStore
from phases.children import AgentToolInput
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App
from pipelines.engine.models import JobStatus
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply

KEY = "t-acme"


def boss_answer(messages: list[Any]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, *[{**call("researcher", input=f"q{i}"), "id": f"c{i}"} for i in range(3)])
    return "boss done"


class Watched(ScriptedModel):
    """A scripted model that calls ``on_call()`` at each call, before its script (outside its lock)."""

    def __init__(self, script: Any, on_call: Any) -> None:
        super().__init__(script)
        self.on_call = on_call

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.on_call is not None:
            self.on_call()
        return super().complete(request)


def family_app(clock: VirtualClock, *, map_run: Any = None, on_call: Any = None) -> App:
    researcher = Agent(name="researcher", model=Watched(lambda m: "child done", on_call), stream=False)
    chief = Agent(name="boss", model=Watched(boss_answer, on_call), stream=False,
                  tools=[researcher.as_tool(description="Research.", map_run=map_run)])
    return App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), agents=[chief],
               provenance=False, concurrency={"t-": 1})


def test_children_run_under_the_parents_key_one_turn_at_a_time_and_the_family_completes() -> None:
    clock = VirtualClock(1000.0)
    holders: list[list[str]] = []
    refused: list[AdvanceResult | None] = []
    app: App

    def on_call() -> None:
        # Inside a turn of the family: the key's one slot is this turn's, and another child is refused.
        store = app.flow.store
        assert isinstance(store, MemoryFlowStore)
        holders.append(store.slots(KEY, clock()))
        parent = app.storage.get_job("p")
        if parent is not None and parent.children and not refused:
            refused.append(None)  # once, even from inside the turn it may run
            refused[0] = app.advance(parent.children[-1])

    app = family_app(clock, on_call=on_call)
    app.run_agent("boss", job_id="p", user="go", concurrency_key=KEY, priority="background")
    app.drain()
    parent = app.get("p")
    assert parent is not None and parent.status is JobStatus.COMPLETE and parent.result == "boss done"
    # Every model call of the family (the parent's two, the three children's) held the key's only slot.
    assert len(holders) == 5 and all(len(h) == 1 for h in holders)
    assert refused == [AdvanceResult.DEFERRED]
    records = [app.storage.get_job(c) for c in app.storage.get_job("p").children]  # type: ignore[union-attr]
    assert len(records) == 3
    for record in records:
        assert record is not None and record.status is JobStatus.COMPLETE
        assert record.options["concurrency_key"] == KEY and record.options["priority"] == "background"


def test_a_childs_own_options_win_and_its_parent_is_woken_on_the_parents_queue() -> None:
    clock = VirtualClock(1000.0)

    def own(args: AgentToolInput) -> dict[str, Any]:
        return {"user": args.input, "priority": "interactive", "concurrency_key": None}

    app = family_app(clock, map_run=own)
    app.run_agent("boss", job_id="p", user="go", concurrency_key=KEY, priority="background")
    assert app.advance("p") is AdvanceResult.WAITING
    children = app.storage.get_job("p").children  # type: ignore[union-attr]
    for child in children:
        record = app.storage.get_job(child)
        assert record is not None
        assert "concurrency_key" not in record.options
        assert record.options.get("priority", "interactive") == "interactive"
    scheduler = app.scheduler
    assert isinstance(scheduler, MemoryScheduler)
    for child in children:  # each child's last commit wakes the parent
        assert app.advance(child) is AdvanceResult.COMPLETED
    woken = [priority for _, priority, job in scheduler.advances() if job == "p"]
    assert woken and set(woken) == {"background"}  # not the interactive queue of the child that woke it
    app.drain()
    assert app.get("p").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_fork_and_rerun_take_a_concurrency_key_function_like_run_agent() -> None:
    clock = VirtualClock(1000.0)
    agent = Agent(name="a", model=ScriptedModel(lambda m: "hi"), stream=False)
    app = App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), agents=[agent],
              provenance=False, concurrency={"t-": 1})
    app.run_agent("a", job_id="src", user="x", concurrency_key="t-1", priority="background")
    app.drain()
    app.rerun("src", from_turn=0, new_job_id="again", concurrency_key=lambda job_id, options: "t-" + job_id)
    app.fork("src", at_turn=0, new_job_id="forked", concurrency_key=lambda job_id, options: None)
    again, forked = app.storage.get_job("again"), app.storage.get_job("forked")
    assert again is not None and again.options["concurrency_key"] == "t-again"
    assert again.options["priority"] == "background"  # the source's, not overridden
    assert forked is not None and forked.options.get("concurrency_key") == "t-1"  # None: the source's stands
    app.drain()
    assert app.get("again").status is JobStatus.COMPLETE  # type: ignore[union-attr]
