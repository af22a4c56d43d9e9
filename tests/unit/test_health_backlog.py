"""`pipelines health`'s backlog: a job waiting for a concurrency slot is not overdue (memory twin, virtual clock)."""

from __future__ import annotations

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.memory.clock import VirtualClock
from pipelines import Agent
from pipelines.app import App
from pipelines.health import Check, check
from pipelines.testing import ScriptedModel


def backlog(app: App, max_overdue: float) -> Check:
    (found,) = [c for c in check(app, max_overdue=max_overdue) if c.name == "backlog"]
    return found


def test_a_job_waiting_for_a_concurrency_slot_is_not_a_backlog_and_one_left_late_is() -> None:
    clock = VirtualClock()
    storage, scheduler = MemoryStorage(), MemoryScheduler(clock=clock)
    agent = Agent(name="support", model=ScriptedModel(lambda messages: "done"))
    app = App(storage=storage, scheduler=scheduler, agents=[agent], concurrency={"tenant-": 1}, lease_seconds=60)
    store = app.flow.store
    assert store is not None
    # Another worker's long turn holds the key's only slot.
    assert store.take_slot("tenant-acme", "elsewhere", limit=1, ttl=3600, now=clock()) == 0
    app.run_agent("support", job_id="waits", user="hi", concurrency_key="tenant-acme")
    for _ in range(30):  # each try is refused: nothing is committed, the job is only moved later in the due index
        clock.advance(1)
        app.advance("waits")
    rec = storage.get_job("waits")
    assert rec is not None and rec.checkpoint is not None and clock() - rec.checkpoint.due_at >= 30
    assert backlog(app, 10).ok

    # Left waiting past its time in the due index (no worker tried it again): that is a backlog.
    due_at = next(t for t in (clock() + s / 10 for s in range(40)) if storage.due_jobs(t, limit=1))
    clock.advance_to(due_at + 3)
    found = backlog(app, 10)
    assert found.ok and "oldest waits overdue by 3.0 s" in found.detail, found.detail
    assert not backlog(app, 2).ok


def test_a_job_whose_long_turn_is_in_flight_is_not_a_backlog() -> None:
    # A turn longer than --max-overdue (a slow tool call) keeps the due time it had when it began; while a
    # worker holds its lease it is being advanced, not waiting: a probe must not restart that worker.
    clock = VirtualClock()
    storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(["x"]))])
    app.run_agent("a", job_id="long", user="hi")
    app.run_agent("a", job_id="lost", user="hi")
    assert storage.acquire_lease("long", "worker-1", 3600) is not None
    clock.advance(30)
    found = backlog(app, 10)
    assert not found.ok and "oldest lost overdue by 30.0 s" in found.detail, found.detail  # the one nobody holds
    assert storage.acquire_lease("lost", "worker-2", 3600) is not None
    found = backlog(app, 10)
    assert found.ok and "in flight" in found.detail, found.detail


def test_a_job_waiting_for_a_slot_behind_a_turn_in_flight_is_judged_by_its_own_time_in_the_index() -> None:
    # The first due job no worker holds sits behind one in flight: its lateness is its own time in the due
    # index (moved later by each refused try), not its record's due time from before the line.
    clock = VirtualClock()
    storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="support", model=ScriptedModel(["x"]))],
              concurrency={"tenant-": 1}, lease_seconds=60)
    store = app.flow.store
    assert store is not None
    app.run_agent("support", job_id="long", user="hi")  # its long turn is in flight
    assert storage.acquire_lease("long", "worker-1", 3600) is not None
    clock.advance(1)
    assert store.take_slot("tenant-acme", "elsewhere", limit=1, ttl=3600, now=clock()) == 0
    app.run_agent("support", job_id="waits", user="hi", concurrency_key="tenant-acme")
    for _ in range(30):
        clock.advance(1)
        app.advance("waits")
    clock.advance_to(next(t for t in (clock() + s / 10 for s in range(40)) if "waits" in storage.due_jobs(t)) + 1)
    found = backlog(app, 10)
    assert found.ok and "oldest waits overdue by 1.0 s" in found.detail, found.detail


def test_an_unreadable_record_behind_a_turn_in_flight_is_reported_not_raised() -> None:
    clock = VirtualClock()
    storage, scheduler = MemoryStorage(clock=clock), MemoryScheduler(clock=clock)
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(["x"]))])
    app.run_agent("a", job_id="long", user="hi")
    app.run_agent("a", job_id="zbad", user="hi")
    assert storage.acquire_lease("long", "worker-1", 3600) is not None
    storage._jobs["zbad"].record = "{not json"  # type: ignore[attr-defined]  # damaged by hand
    clock.advance(30)
    found = backlog(app, 10)
    assert not found.ok and "oldest zbad overdue by 30.0 s" in found.detail, found.detail


def test_a_storage_error_during_the_backlog_search_is_a_failed_check_not_a_traceback() -> None:
    from pipelines.engine.errors import StorageUnavailableError

    class Flaky(MemoryStorage):
        def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
            raise StorageUnavailableError("the storage went away")

    clock = VirtualClock()
    app = App(storage=Flaky(clock=clock), scheduler=MemoryScheduler(clock=clock),
              agents=[Agent(name="a", model=ScriptedModel(["x"]))])
    found = backlog(app, 10)
    assert not found.ok and "the storage went away" in found.detail
