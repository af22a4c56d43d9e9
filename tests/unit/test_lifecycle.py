"""Pause, resume and cancel take effect at the next turn boundary (issue 7)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pipelines import Done, JobStatus, Next, Phase, PhaseContext, RetryLater, WaitForInput, run_pipeline
from pipelines.engine.control import cancel_job, pause_job, resume_job
from pipelines.engine.errors import JobConflictError, JobNotFoundError
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


@contextlib.contextmanager
def turn_in_flight(scheduler: Any, entered: threading.Event, release: threading.Event) -> Iterator[None]:
    """The block runs while the job's first turn is in flight; the turn then finishes (released) and commits."""
    worker = in_flight(scheduler, entered)
    try:
        yield
    finally:
        release.set()
        worker.join(5)


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


def test_a_pause_past_its_wait_stays_requested_and_lands_when_the_turn_commits() -> None:
    storage, scheduler, entered, release, ran = slow_job()
    with turn_in_flight(scheduler, entered, release):
        pending = pause_job("j", storage=storage, scheduler=scheduler, wait=0.1)
        assert pending.status is JobStatus.RUNNING and pending.control == "pause"
        assert storage.get_job("j").version == pending.version  # the turn in flight is not fenced off
        # Resumed before the pause landed: the error says a pause is asked, and when to resume.
        with pytest.raises(JobConflictError, match=r"running with a pause asked \(applied when its turn commits\); "
                                                   r"only a paused job can be resumed; resume it once it is paused"):
            resume_job("j", storage=storage, scheduler=scheduler)
    scheduler.drain()  # the next turn's message finds the request and applies it instead of running
    job = storage.get_job("j")
    assert ran == [0] and job.status is JobStatus.PAUSED and job.control is None
    assert [m["content"] for m in storage.messages("j")] == ["turn 0"]


def test_a_pause_asked_after_a_pending_cancel_does_not_replace_it() -> None:
    storage, scheduler, entered, release, ran = slow_job()
    with turn_in_flight(scheduler, entered, release):
        assert cancel_job("j", storage=storage, scheduler=scheduler, wait=0).control == "cancel"
        # A second operator pauses meanwhile: the job still ends cancelled, never paused (and resumable).
        assert pause_job("j", storage=storage, scheduler=scheduler, wait=0).control == "cancel"
    scheduler.drain()
    job = storage.get_job("j")
    assert job.status is JobStatus.CANCELLED and ran == [0]
    with pytest.raises(JobConflictError, match="only a paused job can be resumed"):
        resume_job("j", storage=storage, scheduler=scheduler)


def test_a_cancel_requested_during_continue_for_lands_at_the_next_boundary() -> None:
    from pipelines.app import App

    storage, scheduler, entered, release, ran = slow_job()
    app = App.for_adapters(storage, scheduler)
    app.continue_for = 60.0  # the worker would keep running the job's next turns itself
    with turn_in_flight(scheduler, entered, release):
        assert cancel_job("j", storage=storage, scheduler=scheduler, wait=0.05).control == "cancel"
    job = storage.get_job("j")
    assert ran == [0] and job.status is JobStatus.CANCELLED and job.control is None


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


def _ending_job(ending: Any) -> tuple[Any, Any, threading.Event, threading.Event]:
    """A job whose first turn blocks until released, then ends with ``ending()``; its next phase finishes it."""
    storage, scheduler, _ = memory()
    entered, release = threading.Event(), threading.Event()

    def step(ctx: PhaseContext[Any]) -> Any:
        if ctx.state == 0:
            entered.set()
            release.wait(5)
            return ending()
        return Done(result="ran")

    run_pipeline(job_id="j", phases=[Phase("step", step)], storage=storage, scheduler=scheduler, initial_state=0)
    return storage, scheduler, entered, release


def _raise(exc: BaseException) -> Any:
    raise exc


@pytest.mark.parametrize("kind", ["pause", "cancel"])
@pytest.mark.parametrize("ending", [lambda: Next("step", state=1, delay=3600),
                                    lambda: _raise(RetryLater(3600, "upstream busy"))], ids=["next", "retry_later"])
def test_a_request_pending_when_a_turn_ends_with_a_delay_lands_now_not_when_the_delay_ends(kind: str,
                                                                                          ending: Any) -> None:
    storage, scheduler, entered, release = _ending_job(ending)
    with turn_in_flight(scheduler, entered, release):
        control = pause_job if kind == "pause" else cancel_job
        assert control("j", storage=storage, scheduler=scheduler, wait=0).control == kind
    scheduler.run_due()  # what is due now; the hour's delay has not passed
    job = storage.get_job("j")
    assert job.status is (JobStatus.PAUSED if kind == "pause" else JobStatus.CANCELLED) and job.control is None


def test_a_cancel_pending_when_a_turn_ends_waiting_for_a_person_lands_at_once() -> None:
    storage, scheduler, entered, release = _ending_job(lambda: _raise(WaitForInput("needs a manager's OK")))
    with turn_in_flight(scheduler, entered, release):
        assert cancel_job("j", storage=storage, scheduler=scheduler, wait=0).control == "cancel"
    job = storage.get_job("j")
    assert job.status is JobStatus.CANCELLED and job.control is None


def test_a_resumed_job_keeps_the_delay_its_phase_asked_for() -> None:
    storage, scheduler, clock = memory()
    ran: list[str] = []

    def first(ctx: PhaseContext[Any]) -> Next:
        ran.append("first")
        return Next("second", delay=3600)

    def second(ctx: PhaseContext[Any]) -> Done:
        ran.append("second")
        return Done(result="reminder sent")

    run_pipeline(job_id="j", phases=[Phase("first", first), Phase("second", second)], storage=storage,
                 scheduler=scheduler)
    scheduler.run_due()
    pause_job("j", storage=storage, scheduler=scheduler)
    resume_job("j", storage=storage, scheduler=scheduler)
    scheduler.run_due()
    assert ran == ["first"]  # the reminder is not sent an hour early
    clock.advance(3600)
    scheduler.drain()
    assert ran == ["first", "second"] and storage.get_job("j").status is JobStatus.COMPLETE


def test_a_pause_that_gets_the_lease_after_a_pending_cancel_lands_the_cancel() -> None:
    storage, scheduler, entered, release, ran = slow_job()
    with turn_in_flight(scheduler, entered, release):
        threading.Timer(0.2, release.set).start()
        assert cancel_job("j", storage=storage, scheduler=scheduler, wait=0).control == "cancel"
        # This pause waits for the turn, then holds the lease first: the cancel it finds lands, not a pause.
        done = pause_job("j", storage=storage, scheduler=scheduler, wait=5)
    assert done.status is JobStatus.CANCELLED
    scheduler.drain()
    assert storage.get_job("j").status is JobStatus.CANCELLED and ran == [0]
