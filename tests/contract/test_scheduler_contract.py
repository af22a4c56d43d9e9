"""The Scheduler contract (adapters/base/), run against every scheduler (tests/contract/scheduler_fixtures.py).

Each test drives the scheduler through the public App and the port's own
methods; the harness only runs the scheduler's work, moves its clock and
loses its messages, the way a worker, time and a crash would.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from adapters.base import (
    FEATURE_PROTOCOLS,
    Backlog,
    BacklogProbe,
    Feature,
    HostedScheduler,
    InProcessScheduler,
    LateDelivery,
    NamedQueues,
    Scheduler,
    WorkerEntry,
)
from pipelines import JobStatus, worker
from pipelines.app import App
from pipelines.engine.capabilities import as_feature, features_of
from tests.contract.ports import covers
from tests.contract.scheduler_fixtures import HARNESSES, PARAMS, Harness, RQHarness

T = TypeVar("T")


@pytest.fixture(params=PARAMS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A scheduler in its harness, with an App and the counting two-turn pipeline ``"p"``."""
    yield from HARNESSES[request.param](request)


def start(h: Harness, job_id: str) -> int:
    """Start a job of ``"p"``; returns the version its first advance is for."""
    h.app.run_pipeline("p", job_id=job_id, initial_state={"n": 0})
    view = h.app.get(job_id)
    assert view is not None and view.status is JobStatus.RUNNING
    return view.record.version


def status(h: Harness, job_id: str) -> JobStatus:
    view = h.app.get(job_id)
    assert view is not None
    return view.status


def json_only(value: Any) -> bool:
    """True when ``value`` is built only of what JSON decodes to."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(json_only(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


@covers("Scheduler.precision", "Scheduler.now")
def test_precision_is_a_float_and_now_is_the_schedulers_epoch_clock(harness: Harness) -> None:
    s = harness.scheduler
    assert isinstance(s, Scheduler)
    assert isinstance(s.precision, float) and s.precision >= 0
    before = harness.scheduler.now()
    harness.wait_until(before + 0.01)
    after = s.now()
    assert isinstance(before, float) and isinstance(after, float)
    assert 1_000_000 <= before < after < 10_000_000_000  # seconds since the epoch, moving forward when time passes
    # The runner's due times come from this clock: a new job is due at the scheduler's now, not the wall clock's.
    start(harness, "clock")
    view = harness.app.get("clock")
    assert view is not None and view.record.checkpoint is not None
    assert before <= view.record.checkpoint.due_at <= harness.scheduler.now()


@covers("Scheduler.schedule_advance")
def test_schedule_advance_runs_the_job_which_completes_through_the_scheduler(harness: Harness) -> None:
    version = start(harness, "j1")
    assert harness.lose_messages() >= 1  # only our own request below can advance it
    harness.run_all()
    assert harness.deliveries == [] and status(harness, "j1") is JobStatus.RUNNING

    harness.scheduler.schedule_advance("j1", 0, pipeline="p", version=version)
    harness.run_all()

    assert harness.deliveries[0].job_id == "j1"
    # The first turn ran on our request; the runner scheduled the second through the same scheduler.
    assert harness.runs == {("j1", "a"): 1, ("j1", "b"): 1}
    view = harness.app.get("j1")
    assert view is not None and view.status is JobStatus.COMPLETE and view.result == {"n": 2}


@covers("Scheduler.schedule_advance", "Scheduler.now")
def test_a_delayed_advance_is_not_delivered_before_its_time(harness: Harness) -> None:
    version = start(harness, "late")
    harness.lose_messages()
    s = harness.scheduler
    delay = harness.delay
    t0 = s.now()
    s.schedule_advance("late", delay, pipeline="p", version=version)

    harness.run_due()  # at once: nothing is due
    harness.wait_until(t0 + delay - s.precision - harness.margin)
    harness.run_due()  # just before the earliest moment the contract allows
    assert harness.deliveries == [] and harness.runs == {}

    harness.wait_until(t0 + delay + harness.late)
    harness.run_due()
    assert harness.deliveries, "the delayed advance never came"
    assert harness.deliveries[0].at >= t0 + delay - s.precision
    assert harness.runs[("late", "a")] == 1


@covers("Scheduler.schedule_advance")
def test_duplicate_requests_for_a_turn_never_run_it_twice(harness: Harness) -> None:
    version = start(harness, "dup")
    s = harness.scheduler
    s.schedule_advance("dup", 0, pipeline="p", version=version)
    s.schedule_advance("dup", 0, pipeline="p", version=version)
    harness.run_all()
    assert status(harness, "dup") is JobStatus.COMPLETE
    assert harness.runs == {("dup", "a"): 1, ("dup", "b"): 1}
    done = harness.app.get("dup")
    assert done is not None

    # Late duplicates of both turns, after the job finished: delivered (at least once), and harmless.
    delivered = len(harness.deliveries)
    s.schedule_advance("dup", 0, pipeline="p", version=version)
    s.schedule_advance("dup", 0, pipeline="p", version=version + 1)
    harness.run_all()
    assert len(harness.deliveries) >= delivered + 2
    assert harness.runs == {("dup", "a"): 1, ("dup", "b"): 1}
    assert harness.app.get("dup") == done


@covers("Scheduler.requeue")
def test_requeue_resends_a_lost_advance_and_the_job_completes(harness: Harness) -> None:
    version = start(harness, "lost")
    assert harness.lose_messages() >= 1
    harness.run_all()
    assert harness.runs == {} and status(harness, "lost") is JobStatus.RUNNING  # nothing else would move it

    harness.scheduler.requeue("lost", pipeline="p", version=version)
    harness.run_all()
    assert harness.runs == {("lost", "a"): 1, ("lost", "b"): 1}
    assert status(harness, "lost") is JobStatus.COMPLETE


def test_only_json_crosses_the_queue(harness: Harness) -> None:
    start(harness, "wire:1.a_b")
    harness.run_all()
    assert status(harness, "wire:1.a_b") is JobStatus.COMPLETE
    raw = harness.wire()
    assert len(raw) == len(harness.deliveries) >= 2  # one message per turn
    for message in raw:
        payload = json.loads(message)  # raises on anything that is not JSON text
        assert json_only(payload) and "wire:1.a_b" in json.dumps(payload)
    if isinstance(harness, RQHarness):
        from pipelines.worker import ADVANCE_FUNC

        # The function is an import path, the arguments plain data: [func, instance, args, kwargs].
        assert [json.loads(m) for m in raw] == [[ADVANCE_FUNC, None, ["wire:1.a_b", v], {}] for v in (1, 2)]


@covers("Scheduler.schedule_advance")
def test_background_advances_run_and_interactive_ones_due_as_well_go_first(harness: Harness) -> None:
    batch, chat = start(harness, "batch"), start(harness, "chat")
    harness.lose_messages()
    s = harness.scheduler
    s.schedule_advance("batch", 0, pipeline="p", version=batch, priority="background")
    s.schedule_advance("chat", 0, pipeline="p", version=chat, priority="interactive")
    harness.run_all()
    assert harness.deliveries[0].job_id == "chat"
    assert status(harness, "batch") is JobStatus.COMPLETE and status(harness, "chat") is JobStatus.COMPLETE


@covers("Scheduler.schedule_advance")
def test_an_unknown_priority_is_refused_and_nothing_is_sent(harness: Harness) -> None:
    version = start(harness, "prio")
    harness.lose_messages()
    with pytest.raises(ValueError, match="priority"):
        harness.scheduler.schedule_advance("prio", 0, pipeline="p", version=version, priority="urgent")
    harness.run_all()
    assert harness.deliveries == []


# --- the optional scheduler ports: each runs where the scheduler declares its feature ------------
def feature(harness: Harness, which: Feature, protocol: type[T]) -> T:
    found = as_feature(harness.scheduler, which, protocol)
    if found is None:
        pytest.skip(f"{type(harness.scheduler).__name__} does not declare {which.value}")
    return found


@covers("InProcessScheduler.attach", "InProcessScheduler.drain")
def test_an_in_process_scheduler_runs_every_advance_through_what_is_attached(harness: Harness) -> None:
    s = feature(harness, Feature.IN_PROCESS, InProcessScheduler)  # type: ignore[type-abstract]
    start(harness, "att")
    seen: list[str] = []
    s.attach(seen.append)  # from now on advances go here, not to the App
    assert s.drain() == 1 and seen == ["att"]
    assert harness.runs == {} and status(harness, "att") is JobStatus.RUNNING
    assert s.drain() == 0  # nothing left

    def advance(job_id: str) -> object:
        seen.append(job_id)
        return harness.app.advance(job_id)

    s.attach(advance)
    view = harness.app.get("att")
    assert view is not None
    s.schedule_advance("att", 0, pipeline="p", version=view.record.version)
    assert s.drain() == 2  # the turn asked for, then the one the runner scheduled after it
    assert seen == ["att"] * 3 and status(harness, "att") is JobStatus.COMPLETE
    assert harness.runs == {("att", "a"): 1, ("att", "b"): 1}
    start(harness, "loop")
    with pytest.raises(RuntimeError, match="drain stopped after 1"):
        s.drain(max_advances=1)  # the first turn schedules a second: past the bound


ENTERED: list[str] = []  # job ids the worker entry a test host names ran for


def entered(job_id: str, version: int | None = None, app: str | None = None) -> str:
    """A worker entry (``WorkerEntry.advance``) that notes the job, then runs the library's own."""
    ENTERED.append(job_id)
    return worker.advance_job(job_id, version, app)


def entered_with_default(default_app: str | None, job_id: str, version: int | None = None,
                         app: str | None = None) -> str:
    """A worker entry (``WorkerEntry.advance_with_default``) that notes the job, then runs the library's own."""
    ENTERED.append(job_id)
    return worker.advance_with_default(default_app, job_id, version, app)


class Host:
    """A SchedulerHost that hands on its App's parts and notes which of them a scheduler took."""

    def __init__(self, app: App) -> None:
        self.app, self.taken = app, set[str]()

    @property
    def storage(self) -> Any:
        self.taken.add("storage")
        return self.app.storage

    @property
    def worker_entry(self) -> WorkerEntry:
        self.taken.add("worker_entry")
        return WorkerEntry(advance=f"{__name__}.entered", advance_with_default=f"{__name__}.entered_with_default")

    @property
    def advance(self) -> Callable[[str], object]:
        self.taken.add("advance")
        return self.app.advance

    @property
    def requeue_overdue(self) -> Callable[..., list[str]]:  # the sweep: what a local scheduler takes
        self.taken.add("requeue_overdue")
        return self.app.requeue_overdue

    @property
    def names(self) -> list[str]:
        self.taken.add("names")
        return self.app.names


@covers("HostedScheduler.bind")
def test_a_hosted_scheduler_runs_through_what_the_app_it_is_bound_to_names(harness: Harness) -> None:
    s = feature(harness, Feature.HOSTED, HostedScheduler)  # type: ignore[type-abstract]
    host = Host(harness.app)
    s.bind(host)
    assert host.taken, "bind took nothing from its host"
    ENTERED.clear()
    start(harness, "hosted")
    harness.run_all()
    assert status(harness, "hosted") is JobStatus.COMPLETE
    if "worker_entry" in host.taken:  # a queue scheduler: every message ran the entry its host named
        assert ENTERED == ["hosted", "hosted"]
    s.bind(harness.app)  # and back to the App's own
    ENTERED.clear()
    start(harness, "own")
    harness.run_all()
    assert status(harness, "own") is JobStatus.COMPLETE and ENTERED == []


@covers("Backlog.work_waiting")
def test_work_waiting_sees_due_work_of_the_priority_or_a_higher_one(harness: Harness) -> None:
    s = feature(harness, Feature.BACKLOG, Backlog)  # type: ignore[type-abstract]
    versions = {job_id: start(harness, job_id) for job_id in ("bg", "chat", "later")}
    harness.lose_messages()
    assert not s.work_waiting() and not s.work_waiting("interactive") and not s.work_waiting("background")
    sched = harness.scheduler
    sched.schedule_advance("later", harness.delay, pipeline="p", version=versions["later"])
    assert not s.work_waiting() and not s.work_waiting("background")  # not due yet
    sched.schedule_advance("bg", 0, pipeline="p", version=versions["bg"], priority="background")
    assert s.work_waiting("background")
    assert not s.work_waiting("interactive") and not s.work_waiting()  # lower work does not hold back higher
    sched.schedule_advance("chat", 0, pipeline="p", version=versions["chat"], priority="interactive")
    assert s.work_waiting("interactive") and s.work_waiting() and s.work_waiting("background")
    with pytest.raises(ValueError, match="priority"):
        s.work_waiting("urgent")
    harness.lose_messages()
    assert not s.work_waiting("background")


@covers("BacklogProbe.probe_work_waiting")
def test_a_probe_answers_work_waiting_as_it_was_when_asked(harness: Harness) -> None:
    s = feature(harness, Feature.BACKLOG_PROBE, BacklogProbe)  # type: ignore[type-abstract]
    version = start(harness, "bg")
    harness.lose_messages()
    empty = s.probe_work_waiting("background")
    assert empty() is False
    harness.scheduler.schedule_advance("bg", 0, pipeline="p", version=version, priority="background")
    first, second = s.probe_work_waiting("background"), s.probe_work_waiting("interactive")  # both in flight
    assert first() is True and second() is False
    assert s.probe_work_waiting()() is False and s.probe_work_waiting("background")() is True
    with pytest.raises(ValueError, match="priority"):
        s.probe_work_waiting("urgent")


@covers("NamedQueues.queue_for")
def test_queue_for_names_the_queue_an_advance_of_that_priority_waits_on(harness: Harness) -> None:
    s = feature(harness, Feature.NAMED_QUEUES, NamedQueues)  # type: ignore[type-abstract]
    chat, bg = s.queue_for("interactive"), s.queue_for("background")
    assert isinstance(chat, str) and chat and s.queue_for() == chat and bg != chat
    versions = {job_id: start(harness, job_id) for job_id in ("bg1", "bg2", "chat")}
    harness.lose_messages()
    assert harness.queued(chat) == 0 and harness.queued(bg) == 0
    for job_id in ("bg1", "bg2"):
        harness.scheduler.schedule_advance(job_id, 0, pipeline="p", version=versions[job_id], priority="background")
    harness.scheduler.schedule_advance("chat", 0, pipeline="p", version=versions["chat"])
    assert harness.queued(bg) == 2 and harness.queued(chat) == 1  # where the scheduler said they would wait
    with pytest.raises(ValueError, match="priority"):
        s.queue_for("urgent")


@covers("LateDelivery.lateness")
def test_a_delayed_advance_comes_within_the_lateness_its_scheduler_declares(harness: Harness) -> None:
    # What a deferred turn's place in the due index allows for (pipelines.engine.runner.turn's defer): the
    # declared lateness covers at least what the suite knows of the scheduler (its whole-second rounding).
    late = feature(harness, Feature.LATE_DELIVERY, LateDelivery)  # type: ignore[type-abstract]
    lateness = late.lateness()
    assert isinstance(lateness, float) and harness.late <= lateness <= 60
    version = start(harness, "late")
    harness.lose_messages()
    t0 = harness.scheduler.now()
    harness.scheduler.schedule_advance("late", harness.delay, pipeline="p", version=version)
    harness.wait_until(t0 + harness.delay + lateness)
    harness.run_due()
    assert harness.deliveries, "the delayed advance had not come by its time plus the declared lateness"


def test_a_scheduler_declares_exactly_the_features_it_implements(harness: Harness) -> None:
    # The optional tests above are skipped by the declaration alone (see the storage suite's twin).
    implemented = {f for f, proto in FEATURE_PROTOCOLS.items() if isinstance(harness.scheduler, proto)}
    assert features_of(harness.scheduler) == implemented
