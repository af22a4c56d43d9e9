"""Pause, resume and cancel take effect at the next turn boundary (issue 7)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pipelines import Done, JobConflictError, JobNotFoundError, JobStatus, Next, Phase, PhaseContext, run_pipeline
from pipelines.control import cancel_job, pause_job, resume_job
from tests.unit.helpers import memory


def slow_job() -> tuple[Any, Any, threading.Event, threading.Event, list[int]]:
    storage, scheduler, _ = memory()
    entered, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        ran.append(ctx.state)
        if ctx.state == 0:
            entered.set()
            release.wait(5)
        ctx.append_messages([{"role": "assistant", "content": f"turn {ctx.state}"}])
        return Next("step", state=ctx.state + 1) if ctx.state < 2 else Done(result="done")

    run_pipeline(job_id="j", phases=[Phase("step", step)], storage=storage, scheduler=scheduler, initial_state=0)
    return storage, scheduler, entered, release, ran


def in_flight(scheduler: Any, entered: threading.Event) -> threading.Thread:
    worker = threading.Thread(target=scheduler.run_next)
    worker.start()
    assert entered.wait(5)
    return worker


def test_pause_waits_for_the_turn_in_flight_which_commits_and_nothing_more_runs() -> None:
    storage, scheduler, entered, release, ran = slow_job()
    worker = in_flight(scheduler, entered)
    threading.Timer(0.2, release.set).start()
    paused = pause_job("j", storage=storage, scheduler=scheduler, wait=5)
    worker.join(5)
    assert paused.status is JobStatus.PAUSED
    assert [m["content"] for m in storage.messages("j")] == ["turn 0"]  # the turn in flight was not lost
    scheduler.drain()  # the queued advance of turn 1 is a no-op while paused
    assert ran == [0] and storage.get_job("j").status is JobStatus.PAUSED
    resume_job("j", storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert ran == [0, 1, 2] and job.status is JobStatus.COMPLETE
    assert [e.type for e in storage.events("j")].count("job_paused") == 1
    assert "job_resumed" in [e.type for e in storage.events("j")]


def test_cancel_lets_the_turn_in_flight_commit_then_stops_for_good() -> None:
    storage, scheduler, entered, release, ran = slow_job()
    worker = in_flight(scheduler, entered)
    threading.Timer(0.2, release.set).start()
    cancelled = cancel_job("j", storage=storage, scheduler=scheduler, wait=5)
    worker.join(5)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.checkpoint is not None
    assert [m["content"] for m in storage.messages("j")] == ["turn 0"]
    scheduler.drain()
    scheduler.schedule_advance("j")  # a late duplicate message changes nothing either
    scheduler.drain()
    assert ran == [0] and storage.get_job("j").status is JobStatus.CANCELLED
    assert storage.logs("j")[-1].message == "job cancelled"


def test_a_turn_still_in_flight_after_the_wait_is_a_conflict_and_changes_nothing() -> None:
    storage, scheduler, entered, release, _ = slow_job()
    worker = in_flight(scheduler, entered)
    try:
        with pytest.raises(JobConflictError, match="turn in flight"):
            pause_job("j", storage=storage, scheduler=scheduler, wait=0.1)
        assert storage.get_job("j").status is JobStatus.RUNNING
    finally:
        release.set()
        worker.join(5)


def test_wrong_statuses_and_unknown_jobs_are_clear_errors() -> None:
    storage, scheduler, _, release, _ = slow_job()
    release.set()
    with pytest.raises(JobConflictError, match="only a paused job can be resumed"):
        resume_job("j", storage=storage, scheduler=scheduler)
    scheduler.drain()
    with pytest.raises(JobConflictError, match="only a running job can be paused"):
        pause_job("j", storage=storage, scheduler=scheduler)
    with pytest.raises(JobConflictError, match="already complete"):
        cancel_job("j", storage=storage, scheduler=scheduler)
    with pytest.raises(JobNotFoundError):
        pause_job("nope", storage=storage, scheduler=scheduler)
