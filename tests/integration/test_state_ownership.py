"""A phase's state is its own copy: what it changes in place reaches storage only through its commit.

A storage may keep the record it committed in memory and hand it to the next turn as it is (the memory
adapter's record, a Redis worker's warm load). So the engine gives each attempt a copy of the stored state
and keeps a copy of what a phase returns: an attempt that changed its state in place and then crashed, or a
caller that changes the dict it returned, changes no record a later attempt or reader sees.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from pipelines import App, Done, Next, Phase, ToolContext
from pipelines.crash_harness import SimulatedCrash
from pipelines.engine.phase import PhaseContext


@pytest.fixture
def storage(each_storage: Any) -> Any:
    return each_storage


def _crash_then_complete(app: App, storage: Any, job_id: str) -> None:
    """An attempt of ``job_id`` crashes; its lease runs out; the next attempt, by the same storage, completes it."""
    with pytest.raises(SimulatedCrash):
        app.advance(job_id)
    owner = storage.lease_owner(job_id)
    if owner is not None:
        storage.release_lease(job_id, owner)  # as if its lease ran out
    assert app.advance(job_id).value == "completed"


def test_an_attempt_that_changed_its_state_in_place_and_crashed_leaves_the_committed_state(storage: Any) -> None:
    shared = {"n": 0, "seen": []}  # returned as the state: the caller keeps it, and changes it later
    crashes = [True]

    def first(ctx: PhaseContext[Any]) -> Next:
        return Next("second", state=shared)

    def second(ctx: PhaseContext[Any]) -> Done:
        ctx.state["n"] += 1
        ctx.state["seen"].append(len(ctx.state["seen"]))
        if crashes.pop() if crashes else False:
            raise SimulatedCrash("the worker dies after changing its state in place")
        return Done(result=ctx.state)

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("first", first), Phase("second", second)]})
    app.run_pipeline("p", job_id="own-1", initial_state={})
    assert app.advance("own-1").value == "advanced"
    shared["n"] = 99  # the caller's dict, changed after the phase returned it
    # The same storage object (a warm load on Redis, the record object in memory) runs the attempt again.
    _crash_then_complete(app, storage, "own-1")
    job = storage.get_job("own-1")
    assert job is not None and job.result == {"n": 1, "seen": [0]}
    assert [m.state for m in job.history][1] == {"n": 0, "seen": []}  # turn 1's checkpoint as committed


def _counting(ctx: PhaseContext[Any]) -> Next | Done:
    """Three turns: each adds the turn's number to the state's items."""
    if ctx.state["n"] >= 2:
        return Done(result=ctx.state)
    return Next("only", state={"n": ctx.state["n"] + 1, "items": [*ctx.state["items"], ctx.state["n"]]})


def test_a_reader_changing_the_record_it_was_given_changes_nothing_stored(storage: Any) -> None:
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("only", _counting)]})
    app.run_pipeline("p", job_id="own-2", initial_state={"n": 0, "items": []})
    assert app.advance("own-2").value == "advanced"
    read = storage.get_job("own-2")
    assert read is not None and read.checkpoint is not None
    read.checkpoint.state["items"].append("changed by a reader")
    read.checkpoint.state["n"] = 100
    scheduler.drain()
    job = storage.get_job("own-2")
    assert job is not None and job.result == {"n": 2, "items": [0, 1]}


def test_a_phase_changing_its_options_in_place_changes_no_stored_record(storage: Any) -> None:
    def only(ctx: PhaseContext[Any]) -> Next | Done:
        ctx.options["tags"].append("changed in place")  # a nested option: ctx.options is a copy of its own
        return Done(result=ctx.state) if ctx.state["n"] >= 1 else Next("only", state={"n": ctx.state["n"] + 1})

    from pipelines.engine.phase import Pipeline
    from pipelines.engine.start import start_job

    scheduler = MemoryScheduler()
    pipeline = Pipeline(phases=[Phase("only", only)])
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": pipeline})
    start_job(job_id="own-3", pipeline=pipeline, name="p", storage=storage, scheduler=scheduler,
              initial_state={"n": 0}, options={"tags": ["t"]})
    assert app.advance("own-3").value == "advanced"  # the same storage object runs both turns
    assert app.advance("own-3").value == "completed"
    job = storage.get_job("own-3")
    assert job is not None and job.result == {"n": 1}
    assert job.options["tags"] == ["t"]


def test_an_input_a_phase_changed_in_place_before_it_crashed_reaches_the_next_attempt_as_given(
        storage: Any) -> None:
    # What a person supplied (an approval, a recorded tool result) is replayed by ctx.step under its key.
    from pipelines.engine import transitions
    from pipelines.engine.events import make_event
    from pipelines.engine.models import Checkpoint, JobRecord, JobStatus

    seen: list[Any] = []

    def only(ctx: PhaseContext[Any]) -> Done:
        given = ctx.step("approval:c1", lambda: {"notes": ["never run: the input is there"]})
        seen.append([*given["notes"]])
        given["notes"].append("changed in place")
        if len(seen) == 1:
            raise SimulatedCrash("the worker dies after changing what the person gave")
        return Done(result=given)

    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": [Phase("only", only)]})
    cp = Checkpoint[Any](next_phase="only", state={}, version=1, due_at=0.0)
    storage.create_job(JobRecord(job_id="own-4", pipeline="p", status=JobStatus.RUNNING, checkpoint=cp, version=1))
    # The person's input arrives by a commit (as app.approve's): a storage may keep that record as it is.
    record = storage.get_job("own-4")
    assert record is not None
    storage.commit(transitions.supply_inputs(record, {"approval:c1": {"notes": ["as given"]}}, resume=True,
                                             now=1.0, why="approved", event=make_event("approved", 1.0)))
    _crash_then_complete(app, storage, "own-4")
    assert seen == [["as given"], ["as given"]]  # the second attempt got the input, not the first's change
    job = storage.get_job("own-4")
    assert job is not None and job.result == {"notes": ["as given", "changed in place"]}


def _two_phases(seen: list[Any]) -> dict[str, list[Phase]]:
    def first(ctx: PhaseContext[Any]) -> Next:
        return Next("second", state={"items": [1]})

    def second(ctx: PhaseContext[Any]) -> Done:
        seen.append(ctx.state)
        return Done(result=ctx.state)

    return {"p": [Phase("first", first), Phase("second", second)]}


def test_a_retry_from_the_start_keeps_its_own_copy_of_the_initial_state(storage: Any) -> None:
    from pipelines import Fail

    seen: list[Any] = []

    def only(ctx: PhaseContext[Any]) -> Done | Fail:
        seen.append(ctx.state)
        return Fail("the first run fails") if ctx.state.get("fail") else Done(result=ctx.state)

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("only", only)]})
    app.run_pipeline("p", job_id="own-5", initial_state={"fail": True})
    scheduler.drain()
    given = {"fail": False, "items": [1]}
    app.run_pipeline("p", job_id="own-5", initial_state=given, retry_mode="full")  # a commit, not a create
    given["items"].append("changed by the caller afterwards")
    given["bad"] = {1, 2}  # a set: no storage may ever hold one
    job = storage.get_job("own-5")
    assert job is not None and job.checkpoint is not None and job.checkpoint.state == {"fail": False, "items": [1]}
    scheduler.drain()
    assert seen[-1] == {"fail": False, "items": [1]}
    job = storage.get_job("own-5")
    assert job is not None and job.status.value == "complete" and job.result == {"fail": False, "items": [1]}


def test_the_record_a_control_call_returns_is_the_callers_own(storage: Any) -> None:
    seen: list[Any] = []
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines=_two_phases(seen))
    app.run_pipeline("p", job_id="own-6", initial_state={})
    assert app.advance("own-6").value == "advanced"
    app.pause("own-6")
    view = app.resume("own-6")  # a commit: the memory adapter keeps the committed record as it is
    assert view.state == {"items": [1]}
    view.state["items"].append("changed through the view")
    view.record.options["x"] = {1, 2}  # a field the next commit would not check again (the same object)
    scheduler.drain()
    assert seen == [{"items": [1]}]
    job = storage.get_job("own-6")
    assert job is not None and job.result == {"items": [1]} and job.options == {}
    assert [j.job_id for j in storage.list_jobs()] == ["own-6"]


def test_an_on_commit_callback_changing_the_checkpoint_it_was_given_changes_nothing_stored(storage: Any) -> None:
    seen: list[Any] = []
    kept: list[Any] = []

    def first(ctx: PhaseContext[Any]) -> Next:
        ctx.on_commit(lambda cp: kept.append(cp.state))  # an in-process cache, which its owner changes later
        return Next("second", state={"items": [1]})

    def second(ctx: PhaseContext[Any]) -> Done:
        seen.append(ctx.state)
        return Done(result=ctx.state)

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler,
              pipelines={"p": [Phase("first", first), Phase("second", second)]})
    app.run_pipeline("p", job_id="own-7", initial_state={})
    assert app.advance("own-7").value == "advanced"
    assert kept == [{"items": [1]}]
    kept[0]["items"].append("changed in the cache")
    assert app.advance("own-7").value == "completed"  # the same storage object: a warm load on Redis
    assert seen == [{"items": [1]}]
    job = storage.get_job("own-7")
    assert job is not None and job.result == {"items": [1]}


def test_a_reader_changing_a_turn_mark_changes_no_later_read_or_fork(storage: Any) -> None:
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("only", _counting)]})
    app.run_pipeline("p", job_id="own-8", initial_state={"n": 0, "items": []})
    scheduler.drain()
    read = storage.get_job("own-8")
    assert read is not None and read.history[1].state == {"n": 1, "items": [0]}
    read.history[1].state["items"].append("changed by a reader")
    again = storage.get_job("own-8")
    assert again is not None and again.history[1].state == {"n": 1, "items": [0]}
    app.fork("own-8", at_turn=1, new_job_id="own-8-fork", run=True)
    scheduler.drain()
    fork = storage.get_job("own-8-fork")
    assert fork is not None and fork.result == {"n": 2, "items": [0, 1]}


def test_a_caller_changing_the_context_it_passed_changes_nothing_a_tool_is_told(storage: Any) -> None:
    from pipelines import Agent, tool
    from pipelines.testing import ScriptedModel, call, reply

    told: list[Any] = []

    @tool
    def who(tc: ToolContext) -> str:
        """Who asks."""
        told.append(tc.context)
        return "ok"

    model = ScriptedModel([reply(None, call("who")), "first run done", reply(None, call("who")), "second done"])
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="bot", model=model, tools=[who], stream=False)])
    app.run_agent("bot", job_id="own-9", messages=["hi"], context={"user": "alice"})
    scheduler.drain()
    context = {"user": "bob", "roles": ["reader"]}
    app.run_agent("bot", job_id="own-9", messages=["again"], context=context)  # continues: a commit
    context["roles"].append("admin")
    context["seen"] = {1, 2}
    scheduler.drain()
    assert told[-1] == {"user": "bob", "roles": ["reader"]}
    job = storage.get_job("own-9")
    assert job is not None and job.options["context"] == {"user": "bob", "roles": ["reader"]}


@pytest.mark.parametrize("how", ["fail", "retry", "wait"])
def test_a_state_storage_refuses_put_in_place_before_a_failure_ends_the_job_in_error(storage: Any,
                                                                                     how: str) -> None:
    # Not due forever, every sweep running into the same refusal (I9): the failure is built on the stored state.
    from pipelines import Fail
    from pipelines.engine.phase import RetryLater, WaitForInput

    def only(ctx: PhaseContext[Any]) -> Fail:
        ctx.state["point"] = (1, 2)  # a tuple: JSON would give back a list
        if how == "retry":
            raise RetryLater(5)
        if how == "wait":
            raise WaitForInput("ask")
        return Fail("gave up")

    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": [Phase("only", only)]})
    app.run_pipeline("p", job_id="own-10", initial_state={"n": 1})
    assert app.advance("own-10").value == "failed"
    job = storage.get_job("own-10")
    assert job is not None and job.status.value == "error" and job.checkpoint is not None
    assert "could not be committed" in (job.error or "") and "checkpoint.state" in (job.error or "")
    assert job.checkpoint.state == {"n": 1}  # a resume starts from what was stored


def test_a_state_nested_as_deep_as_a_value_may_be_is_stored_with_its_turn_mark(storage: Any) -> None:
    # The same rule on every adapter: the mark's state gets a value's whole allowance, one level more is refused.
    from pipelines.engine.models import MAX_VALUE_DEPTH

    def nested(depth: int) -> Any:
        value: Any = 0
        for _ in range(depth):
            value = [value]
        return value

    def only(ctx: PhaseContext[Any]) -> Next | Done:
        if ctx.state["n"] >= 1:
            return Done(result="ok")
        return Next("only", state={"n": 1, "deep": nested(ctx.state["depth"])})

    for depth, result in ((MAX_VALUE_DEPTH - 1, "completed"), (MAX_VALUE_DEPTH, "failed")):
        job_id = f"own-11-{depth}"
        scheduler = MemoryScheduler()
        app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("only", only)]})
        app.run_pipeline("p", job_id=job_id, initial_state={"n": 0, "depth": depth})
        scheduler.drain()
        job = storage.get_job(job_id)
        assert job is not None and job.status.value == ("complete" if result == "completed" else "error"), job.error
        if result == "completed":
            assert job.history[1].state["deep"] == nested(depth)
        else:
            assert "deeper than" in (job.error or "")


def test_a_model_changing_the_messages_it_was_sent_changes_no_later_turn_or_stored_message(storage: Any) -> None:
    # A custom model adding a provider's cache marker in place: the agent turn sends it a copy of its own.
    import copy

    from phases.model import ModelRequest, ModelResponse, ReadOnlyMessages
    from pipelines import Agent, tool
    from pipelines.testing import ScriptedModel, call, reply

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    class MarkingModel:
        def __init__(self) -> None:
            self.inner = ScriptedModel([reply(None, call("add", a=1, b=2)), reply(None, call("add", a=2, b=3)),
                                        "done"])
            self.sent: list[list[dict[str, Any]]] = []

        def complete(self, request: ModelRequest) -> ModelResponse:
            self.sent.append(copy.deepcopy(request.messages))
            request.messages[-1]["cache_control"] = {"type": "ephemeral"}
            return self.inner.complete(request)

    assert not isinstance(MarkingModel(), ReadOnlyMessages)
    model = MarkingModel()
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="bot", model=model, tools=[add], system="sys", stream=False)])
    app.run_agent("bot", job_id="own-12", messages=["hi"])
    scheduler.drain()  # one App: every turn after the first runs on the worker's transcript cache
    assert [[m for m in sent if "cache_control" in m] for sent in model.sent] == [[], [], []]
    stored = storage.messages("own-12")
    assert len(stored) == 7 and not any("cache_control" in m for m in stored)  # system, user, 2 x 2, done


def test_the_library_s_own_models_say_they_change_no_message_they_are_sent() -> None:
    from phases.litellm_model import LiteLLMModel
    from phases.model import ReadOnlyMessages
    from pipelines.testing import ScriptedModel

    assert issubclass(ScriptedModel, ReadOnlyMessages) and issubclass(LiteLLMModel, ReadOnlyMessages)

