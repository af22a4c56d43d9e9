"""A concurrency slot lives with the lease that holds it: renewed with it, released with it (issue 30, defect 10).

The memory twin runs on a virtual clock, so a "long" tool moves that clock
past the slot's first expiry (1.5 x lease) and lets the lease keeper make
one renewal pass (``renew_due``, what its daemon runs every half second).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.memory.flow import MemoryFlowStore
from pipelines import Agent, App, tool
from pipelines.engine import leases
from pipelines.engine._daemon import Daemon
from pipelines.engine.leases import LEASE_KEEPER, LeaseKeeper
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply

LEASE = 1.0  # the App's slot: 1.5 s of virtual time
PASSES = itertools.count(1)


def renewal_pass() -> None:
    """One pass of the lease keeper, as its daemon makes every half second (every held lease is due)."""
    LEASE_KEEPER.renew_due(time.monotonic() + LEASE * next(PASSES))  # later than the last pass's time


def build(clock: VirtualClock, long_tool: Any) -> App:
    long_agent = Agent(name="long", model=ScriptedModel([reply("working", call("long_tool")), reply("done")]),
                       tools=[long_tool], stream=False)
    quick_agent = Agent(name="quick", model=ScriptedModel(lambda m: "done"), stream=False)
    return App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
               agents=[long_agent, quick_agent], concurrency={"k": 1}, lease_seconds=LEASE)


def test_a_tool_longer_than_the_slot_keeps_a_second_job_of_its_key_out() -> None:
    clock = VirtualClock(1000.0)
    seen: list[AdvanceResult] = []

    @tool
    def long_tool() -> str:
        """Run for longer than the slot's first lease, then see whether another job of the key may run."""
        for _ in range(5):  # 2 s of virtual time, each step well inside the lease
            clock.advance(0.4)
            renewal_pass()
        seen.append(app.advance("b"))
        return "ok"

    app = build(clock, long_tool)
    app.run_agent("long", job_id="a", user="go", concurrency_key="k")
    app.run_agent("quick", job_id="b", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.ADVANCED
    assert seen == [AdvanceResult.DEFERRED]  # a's slot was renewed with its lease: b waited
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore) and store.slots("k", clock()) == []  # given back after a's turn
    app.drain()
    assert {app.get(j).status.value for j in "ab"} == {"complete"}  # type: ignore[union-attr]


def test_a_lost_lease_gives_its_slot_back_at_once() -> None:
    clock = VirtualClock(1000.0)
    held: list[list[str]] = []

    @tool
    def long_tool() -> str:
        """Outlive the lease (a stalled worker) but not the slot's first expiry."""
        clock.advance(LEASE + 0.2)
        renewal_pass()  # the lease is found lost
        held.append(store.slots("k", clock()))
        return "ok"

    app = build(clock, long_tool)
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore)
    app.run_agent("long", job_id="a", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.STALE  # fenced off: its lease ran out
    assert held == [[]]  # the slot went with the lease, though its own expiry was 0.3 s ahead


class Companion:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def renew(self) -> bool:
        self.calls.append("renew")
        return True

    def release(self) -> None:
        self.calls.append("release")


class Leases:
    """A storage's lease port, reduced to the answer of the next renewal."""

    def __init__(self) -> None:
        self.renewed = True

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        return self.renewed


def test_the_keeper_renews_a_companion_after_its_lease_and_releases_it_when_the_lease_is_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "start_daemon", lambda target, name: Daemon())  # passes by hand, no thread
    keeper, storage, now = LeaseKeeper(), Leases(), time.monotonic()
    key = keeper.hold(storage, "j", "owner", 10.0)  # type: ignore[arg-type]
    kept, detached = Companion(), Companion()
    keeper.attach(key, kept)
    keeper.attach(key, detached)
    keeper.detach(key, detached)
    keeper.renew_due(now + 1.0)  # not yet a third of the lease old: nothing renewed
    assert kept.calls == []
    keeper.renew_due(now + 10.0)
    assert kept.calls == ["renew"] and detached.calls == []
    storage.renewed = False  # another worker has the job now
    keeper.renew_due(now + 20.0)
    assert kept.calls == ["renew", "release"]
    late = Companion()
    keeper.attach(key, late)  # the lease is gone: what would come with it goes at once
    assert late.calls == ["release"]
    keeper.renew_due(now + 30.0)
    assert kept.calls == ["renew", "release"]  # nothing more: the lease is no longer kept


def test_a_worker_taking_over_a_stalled_workers_job_waits_for_its_slot() -> None:
    # The stalled worker may still be running its turn (its lease ran out, its process did not): the job counts
    # twice until that worker gives its own slot back or the slot runs out, and a limit of 1 holds.
    clock = VirtualClock(1000.0)
    seen: list[AdvanceResult] = []

    @tool
    def long_tool() -> str:
        """Stall past the lease (no renewal: the whole process is stopped), then watch a takeover."""
        clock.advance(LEASE + 0.2)
        seen.append(app.advance("a"))  # another worker takes the job over: its lease ran out
        return "ok"

    app = build(clock, long_tool)
    app.run_agent("long", job_id="a", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.STALE  # the stalled turn is fenced off at its commit
    assert seen == [AdvanceResult.DEFERRED]  # not a second turn of key k beside the one still running


def test_a_stalled_worker_gives_back_only_its_own_slot() -> None:
    clock = VirtualClock(1000.0)

    @tool
    def long_tool() -> str:
        """Unused."""
        return "ok"

    app = build(clock, long_tool)
    app.run_agent("quick", job_id="a", user="go", concurrency_key="k")
    record = app.storage.get_job("a")
    assert record is not None and app.flow is not None
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore)
    assert app.flow.enter_turn(record, clock(), owner="stalled") == 0.0
    assert app.flow.enter_turn(record, clock(), owner="new") > 0  # the stalled worker's slot still counts
    clock.advance(LEASE * 1.5 + 0.1)  # it ran out
    assert app.flow.enter_turn(record, clock(), owner="new") == 0.0
    app.flow.leave_turn(record, owner="stalled")  # the stalled worker wakes and gives back its slot
    assert store.slots("k", clock()) == ["a new"]  # not the new holder's


def test_the_keeper_looks_more_often_only_while_it_holds_a_short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    # hold() lowered the look interval for a short lease and nothing raised it again: after one run with a 1 s
    # lease, the process's keeper looked six times a second for the rest of its life.
    monkeypatch.setattr(leases, "start_daemon", lambda target, name: Daemon())
    keeper, storage, now = LeaseKeeper(), Leases(), time.monotonic()
    assert keeper._tick == 0.5
    short = keeper.hold(storage, "j", "owner", 1.2)  # type: ignore[arg-type]
    keeper.hold(storage, "k", "owner", 30.0)  # type: ignore[arg-type]
    assert keeper._tick == pytest.approx(0.2)  # renewed at a third of 1.2 s: looked at every 0.2 s
    keeper.renew_due(now)
    assert keeper._tick == pytest.approx(0.2)  # still held
    keeper.drop(short)
    keeper.renew_due(now)
    assert keeper._tick == 0.5
