"""Retention walks the finished index on past the jobs it keeps (children their parents wait for), on memory,
SQLite and a real redis-server (see :mod:`pipelines.app.retention`)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.memory import MemoryScheduler, VirtualClock
from phases import titles
from pipelines import Agent, App, JobStatus
from pipelines.app import retention
from pipelines.engine.children import child_job_id
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

CHILDREN = 8


@pytest.fixture
def storage(each_storage: Any) -> Any:
    return each_storage


def boss(messages: list[Message]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, *[{**call("researcher", input=f"x{i}"), "id": f"c{i}"} for i in range(CHILDREN)])
    return "boss done"


def family_with_a_slow_child(storage: Any) -> tuple[App, VirtualClock]:
    """A parent waiting for its children: all but the last finished (the oldest entries of the finished index,
    kept while it waits), then an unrelated job 'late' finished; all of them long past the app's retention."""
    clock = VirtualClock(start=1_000_000.0)
    researcher = Agent(name="researcher", model=ScriptedModel(lambda m: "child done"))
    app = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, retention=3600,
              agents=[Agent(name="boss", model=ScriptedModel(boss), tools=[researcher.as_tool(description="R.")]),
                      Agent(name="solo", model=ScriptedModel(lambda m: "hi"))])
    app.run_agent("boss", job_id="p", user="go")
    app.advance("p")
    for i in range(CHILDREN - 1):
        app.advance(child_job_id("p", f"c{i}"))
    clock.advance(1)
    app.run_agent("solo", job_id="late", user="hi")
    app.advance("late")
    assert app.get("late").status is JobStatus.COMPLETE and app.get("p").status is JobStatus.WAITING
    clock.advance(7200)
    return app, clock


def examined(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the finished jobs retention examines from now on (the records it reads, with their parents)."""
    seen: list[str] = []
    real = retention.FinishedWalk.take

    def spying(self: retention.FinishedWalk, *args: Any, **kwargs: Any) -> list[str]:
        ids = real(self, *args, **kwargs)
        seen.extend(ids)
        return ids

    monkeypatch.setattr(retention.FinishedWalk, "take", spying)
    return seen


def sweep(app: App) -> None:
    app.requeue_overdue(grace=10**9)  # the worker's sweep: nothing is overdue that long; then retention's share


def test_the_sweep_pages_on_past_the_children_it_keeps_and_does_not_read_them_again_each_time(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # It examined the oldest SWEEP_LIMIT entries every time: finished children whose parent still waits, kept,
    # so 'late' behind them was never deleted, and every sweep of every worker read the same jobs again.
    app, clock = family_with_a_slow_child(storage)
    monkeypatch.setattr(retention, "SWEEP_LIMIT", 5)
    seen = examined(monkeypatch)
    kids = [child_job_id("p", f"c{i}") for i in range(CHILDREN - 1)]
    sweep(app)  # the five oldest: children, kept
    assert seen == kids[:5] and app.get("late") is not None
    sweep(app)  # on from there: the last two children, then 'late', deleted
    assert seen == [*kids, "late"] and app.get("late") is None and all(app.get(k) is not None for k in kids)
    seen.clear()
    for _ in range(3):  # the walk is at the end: the kept children are not read again on every sweep
        sweep(app)
    assert seen == []
    clock.advance(retention.RESCAN_EVERY)
    sweep(app)  # a new lap, from the oldest
    assert seen == kids[:5]
    app.advance(child_job_id("p", f"c{CHILDREN - 1}"))  # the slow child ends: its parent wakes, reads them all
    app.drain()
    assert app.get("p").status is JobStatus.COMPLETE
    clock.advance(7200)
    for _ in range(4):
        sweep(app)
    assert app.get("p") is None and all(app.get(k) is None for k in [*kids, child_job_id("p", "c7")])


def test_an_on_demand_gc_covers_the_whole_index_within_its_limit_whatever_the_walk_did(storage: Any) -> None:
    app, _ = family_with_a_slow_child(storage)
    assert app.gc(limit=3) == [] and app.gc(limit=3) == []  # six of the seven kept children
    assert app.gc(limit=3) == ["late"]  # the seventh, 'late', then the first again (a new lap)
    app.advance(child_job_id("p", f"c{CHILDREN - 1}"))
    app.drain()
    app.scheduler.clock.advance(7200)  # type: ignore[attr-defined]
    removed = app.gc(older_than=60, limit=100)
    assert len(removed) == CHILDREN + 1 and app.storage.list_jobs() == []


def test_an_apps_retention_deletes_its_own_jobs_and_their_title_jobs_not_another_apps_on_the_same_storage(
        storage: Any) -> None:
    # Two services on one Redis (one SQLite file): A keeps its jobs an hour, B keeps its own for ever (no
    # retention). A's sweeps deleted every finished job in the storage, B's conversations with them.
    clock = VirtualClock(start=1_000_000.0)

    def titled(name: str) -> Agent:  # both apps name their title agent "namer": a family is judged by its top
        namer = Agent(name="namer", model=ScriptedModel(lambda m: "A title"))
        return Agent(name=name, model=ScriptedModel(lambda m: "hi"), title_agent=namer)

    mine = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, retention=3600,
               agents=[titled("a")])
    theirs = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, agents=[titled("b")])
    for app, agent, job in ((mine, "a", "ja"), (theirs, "b", "jb")):
        app.run_agent(agent, job_id=job, user="hi")
        app.drain()
        assert app.get(job).title == "A title"
        clock.advance(1)
        app.run_agent(agent, job_id=job, user="and then?")  # the conversation's next run ends after its title job's
        app.drain()
    title_jobs = {titles.title_job_id("ja"), titles.title_job_id("jb")}
    assert {r.job_id for r in storage.list_jobs()} == {"ja", "jb", *title_jobs}
    clock.advance(7200)
    # A process of A's that has run nothing yet (the CLI, a fresh worker).
    fresh = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, retention=3600,
                agents=[titled("a")])
    assert fresh.gc() == [titles.title_job_id("ja"), "ja"]  # the title job finished first: examined first
    assert {r.job_id for r in storage.list_jobs()} == {"jb", titles.title_job_id("jb")}
    sweep(fresh)
    assert fresh.gc() == [] and theirs.get("jb").status is JobStatus.COMPLETE
    assert fresh.gc(all_pipelines=True) == [titles.title_job_id("jb"), "jb"]
    assert storage.list_jobs() == []
