"""A phase's state is its own copy: what it changes in place reaches storage only through its commit.

A storage may keep the record it committed in memory and hand it to the next turn as it is (the memory
adapter's record, a Redis worker's warm load). So the engine gives each attempt a copy of the stored state
and keeps a copy of what a phase returns: an attempt that changed its state in place and then crashed, or a
caller that changes the dict it returned, changes no record a later attempt or reader sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import App, Done, Next, Phase
from pipelines.crash_harness import SimulatedCrash
from pipelines.engine.phase import PhaseContext


@pytest.fixture(params=["memory", "redis", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
    elif request.param == "redis":
        from adapters.redis import RedisStorage

        store = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"own{id(request)}")
        yield store
        store.client.close()
    else:
        from adapters.sqlite import SQLiteStorage

        lite = SQLiteStorage(str(tmp_path / "own.db"))
        yield lite
        lite.close()


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


def test_a_reader_changing_the_record_it_was_given_changes_nothing_stored(storage: Any) -> None:
    def only(ctx: PhaseContext[Any]) -> Next | Done:
        if ctx.state["n"] >= 2:
            return Done(result=ctx.state)
        return Next("only", state={"n": ctx.state["n"] + 1, "items": [*ctx.state["items"], ctx.state["n"]]})

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("only", only)]})
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
