"""Two apps (two services) on one storage: each sweeps, wakes and keeps only the jobs of its own pipelines.

The docs allow two apps on one Redis prefix (their own queues) or one SQLite file. A job belongs to the app that
registers its pipeline: another app's sweep sent it to its own queue or ran it ("unknown pipeline"), its cron
advance reported it unreached, and its flow control woke it on its own queue.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, VirtualClock
from pipelines import AdvanceResult, Agent, App, JobStatus
from pipelines.engine import control
from pipelines.testing import ScriptedModel


@pytest.fixture
def storage(each_storage: Any) -> Any:
    return each_storage


def app_of(storage: Any, clock: VirtualClock, name: str, **options: Any) -> App:
    """An app with one agent, ``name``, on its own in-process queue (its own workers)."""
    return App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False,
               agents=[Agent(name=name, model=ScriptedModel(lambda m: "hi"))], **options)


def test_each_apps_sweep_and_cron_advance_take_only_its_own_overdue_jobs(
        storage: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "_skipped", {})
    clock = VirtualClock(start=1_000_000.0)
    app_of(storage, clock, "alpha").run_agent("alpha", job_id="a1", user="hi")
    app_of(storage, clock, "beta").run_agent("beta", job_id="b1", user="hi")  # B's workers are down
    clock.advance(100)
    a_worker = app_of(storage, clock, "alpha")  # a worker of A's: its queue holds nothing yet
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        assert a_worker.requeue_overdue(grace=10) == ["a1"]
        assert a_worker.scheduler.pending() == 1  # type: ignore[attr-defined]
        a_cron = app_of(storage, clock, "alpha")
        # Reported (overdue past the grace: its app's workers are down), never run nor leased here.
        assert sorted(a_cron.advance_due(grace=10)) == [("a1", AdvanceResult.COMPLETED),
                                                        ("b1", AdvanceResult.UNREACHED)]
    assert storage.get_job("b1").status is JobStatus.RUNNING and storage.get_job("b1").version == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("the due jobs of pipeline(s) 'beta'" in m for m in said), said
    b_worker = app_of(storage, clock, "beta")
    assert b_worker.requeue_overdue(grace=10) == ["b1"]
    b_worker.drain()
    assert storage.get_job("b1").status is JobStatus.COMPLETE


def test_a_slot_freed_by_one_app_wakes_no_job_of_another_app_on_its_own_queue(redis_url: str) -> None:
    # Two apps on one Redis prefix share a concurrency key's slots and line. The slot A's turn freed woke the job
    # first in line through A's own queue, B's job included: A's worker refused it ("unknown pipeline").
    from adapters.redis import RedisStorage
    from pipelines import tool
    from pipelines.testing import call, reply

    storage = RedisStorage.from_url(redis_url, prefix=f"fw{uuid.uuid4().hex[:8]}")
    b = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"k": 1},
            agents=[Agent(name="beta", model=ScriptedModel(lambda m: "b done"), stream=False)])
    knocked: list[AdvanceResult] = []

    @tool
    def knock() -> str:
        """B's job asks for the slot this turn of A's holds."""
        knocked.append(b.advance("b1"))
        return "ok"

    a = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"k": 1},
            agents=[Agent(name="alpha", tools=[knock], stream=False,
                          model=ScriptedModel(lambda m: reply(None, call("knock")) if len(m) == 1 else "a done"))])
    try:
        b.run_agent("beta", job_id="b1", user="hi", concurrency_key="k")
        a.run_agent("alpha", job_id="a1", user="go", concurrency_key="k")
        a.drain()  # raised InvalidPipelineError: unknown pipeline 'beta' (B's job, woken on A's queue)
        assert knocked == [AdvanceResult.DEFERRED] and a.get("a1").status is JobStatus.COMPLETE  # type: ignore[union-attr]
        b.drain()  # B's job runs on B's queue: its own retry
        assert b.get("b1").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    finally:
        storage.close()
