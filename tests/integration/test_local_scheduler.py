"""LocalScheduler's worker threads on a real SQLite file: requests, delays, restarts, several schedulers, stop."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from adapters.local import LocalScheduler
from adapters.memory import MemoryStorage
from adapters.sqlite import SQLiteStorage
from pipelines import App, Done, JobStatus, Next, Phase, PhaseContext
from pipelines.engine.errors import ConfigurationError, InvalidInputError


class Counting:
    """A three-phase pipeline that records which thread ran each phase of each job, and when."""

    def __init__(self, delay: float = 0.0) -> None:
        self.runs: Counter[tuple[str, str]] = Counter()
        self.threads: set[str] = set()
        self.at: dict[tuple[str, str], float] = {}
        self.delay = delay
        self.lock = threading.Lock()

    def _note(self, ctx: PhaseContext[Any], phase: str) -> None:
        with self.lock:
            self.runs[(ctx.job_id, phase)] += 1
            self.threads.add(threading.current_thread().name)
            self.at[(ctx.job_id, phase)] = time.time()

    def phases(self) -> list[Phase]:
        def a(ctx: PhaseContext[Any]) -> Next:
            self._note(ctx, "a")
            return Next("b", state={"n": 1}, delay=self.delay)

        def b(ctx: PhaseContext[Any]) -> Next:
            self._note(ctx, "b")
            return Next("c", state={"n": ctx.state["n"] + 1})

        def c(ctx: PhaseContext[Any]) -> Done:
            self._note(ctx, "c")
            return Done(result=ctx.state["n"] + 1)

        return [Phase("a", a), Phase("b", b), Phase("c", c)]


def make_app(path: Path, counting: Counting, **options: Any) -> App:
    return App(storage=SQLiteStorage(str(path)), scheduler=LocalScheduler(**options),
               pipelines={"p": counting.phases()}, provenance=False)


def wait_for(app: App, ids: list[str], timeout: float = 60.0) -> None:
    """Poll storage (not drain: the worker threads must do the work) until every job finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = [app.get(i) for i in ids]
        if all(v is not None and v.finished for v in views):
            return
        time.sleep(0.02)
    raise AssertionError(f"not finished: {[(i, app.get(i).status) for i in ids]}")  # type: ignore[union-attr]


def test_worker_threads_run_every_turn_of_every_job_once(tmp_path: Path) -> None:
    counting = Counting()
    app = make_app(tmp_path / "a.db", counting, workers=3)
    ids = [f"j{n}" for n in range(12)]
    with app.scheduler:  # type: ignore[attr-defined]
        for job_id in ids:
            app.run_pipeline("p", job_id=job_id)
        wait_for(app, ids)
    assert counting.runs == {(j, p): 1 for j in ids for p in "abc"}
    assert all(app.get(j).result == 3 for j in ids)  # type: ignore[union-attr]
    assert counting.threads and all(t.startswith("pipelines-local-") for t in counting.threads)


def test_a_delayed_turn_runs_when_it_is_due_not_before(tmp_path: Path) -> None:
    counting = Counting(delay=0.6)
    app = make_app(tmp_path / "d.db", counting, workers=2)
    with app.scheduler:  # type: ignore[attr-defined]
        app.run_pipeline("p", job_id="late")
        wait_for(app, ["late"])
    assert counting.at[("late", "b")] >= counting.at[("late", "a")] + 0.6
    assert counting.runs[("late", "b")] == 1


def test_a_request_due_centuries_ahead_keeps_every_worker_thread_alive(tmp_path: Path) -> None:
    # A wait past what Condition.wait takes (~292 years) raised OverflowError in each idle thread: the process
    # then ran no job at all. Phases may not ask for so long (MAX_DELAY); the scheduler's own wait is bounded too.
    counting = Counting()
    app = make_app(tmp_path / "far.db", counting, workers=2)
    with app.scheduler:  # type: ignore[attr-defined]
        app.scheduler.schedule_advance("far-away", 1e10)  # type: ignore[attr-defined]
        time.sleep(0.2)  # each idle thread waits for it
        app.run_pipeline("p", job_id="now")
        wait_for(app, ["now"])
    assert counting.runs[("now", "c")] == 1


def test_a_new_process_picks_up_the_jobs_a_stopped_one_left(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    first = Counting()
    web = make_app(path, first, workers=0)  # a process that only starts runs (its requests die with it)
    ids = [f"r{n}" for n in range(6)]
    for job_id in ids:
        web.run_pipeline("p", job_id=job_id)
    assert web.scheduler.pending() == len(ids)  # type: ignore[attr-defined]
    second = Counting()
    worker = make_app(path, second, workers=2)
    with worker.scheduler:  # type: ignore[attr-defined]
        wait_for(worker, ids)
    assert first.runs == {} and second.runs == {(j, p): 1 for j in ids for p in "abc"}



def test_a_process_that_runs_none_of_its_requests_keeps_a_bounded_number(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # An App that only starts runs (a web process) while worker processes claim them from the file: its
    # requests are never taken here. They are hints, so past the limit the latest-due are let go, and the
    # workers still run every job.
    import adapters.local

    monkeypatch.setattr(adapters.local._Requests, "limit", 10)
    path = tmp_path / "b.db"
    web = make_app(path, Counting(), workers=0)
    ids = [f"b{n}" for n in range(25)]
    for job_id in ids:
        web.run_pipeline("p", job_id=job_id)
    assert web.scheduler.pending() <= 10  # type: ignore[attr-defined]
    second = Counting()
    worker = make_app(path, second, workers=2)
    with worker.scheduler:  # type: ignore[attr-defined]
        wait_for(worker, ids)
    assert second.runs == {(j, p): 1 for j in ids for p in "abc"}

def test_two_schedulers_on_one_file_share_the_work_and_run_each_turn_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    counting = Counting()
    apps = [make_app(path, counting, workers=2, poll=0.05, grace=0.0) for _ in range(2)]
    ids = [f"s{n}" for n in range(16)]
    with apps[0].scheduler, apps[1].scheduler:  # type: ignore[attr-defined]
        for n, job_id in enumerate(ids):
            apps[n % 2].run_pipeline("p", job_id=job_id)
        wait_for(apps[0], ids)
    assert counting.runs == {(j, p): 1 for j in ids for p in "abc"}


def test_stop_lets_the_turn_in_flight_commit(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(ctx: PhaseContext[Any]) -> Done:
        entered.set()
        release.wait(10)
        return Done(result="ok")

    app = App(storage=SQLiteStorage(str(tmp_path / "t.db")), scheduler=LocalScheduler(workers=1),
              pipelines={"slow": [Phase("slow", slow)]}, provenance=False)
    scheduler = app.scheduler
    assert isinstance(scheduler, LocalScheduler)
    scheduler.start()
    app.run_pipeline("slow", job_id="x")
    assert entered.wait(10)
    threading.Timer(0.2, release.set).start()
    scheduler.stop(timeout=10)
    assert not scheduler.running
    view = app.get("x")
    assert view is not None and view.status is JobStatus.COMPLETE


def test_on_memory_storage_it_runs_requests_without_claims(tmp_path: Path) -> None:
    counting = Counting()
    app = App(storage=MemoryStorage(), scheduler=LocalScheduler(workers=2), pipelines={"p": counting.phases()},
              provenance=False)
    with app.scheduler:  # type: ignore[attr-defined]
        app.run_pipeline("p", job_id="m")
        wait_for(app, ["m"])
    assert counting.runs == {("m", p): 1 for p in "abc"}


@pytest.mark.parametrize(("options", "match"), [
    ({"workers": -1}, "workers"), ({"workers": 1.5}, "workers"), ({"poll": 0}, "poll and hold"),
    ({"grace": float("inf")}, "grace"), ({"hold": -1}, "hold"), ({"sweep_interval": True}, "sweep_interval"),
])
def test_bad_settings_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        LocalScheduler(**options)


def test_bad_requests_are_refused_and_an_unattached_scheduler_says_so() -> None:
    scheduler = LocalScheduler(workers=1)
    for delay in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidInputError, match="delay"):
            scheduler.schedule_advance("j", delay)
    with pytest.raises(InvalidInputError, match="priority"):
        scheduler.schedule_advance("j", 0, priority="urgent")
    assert scheduler.pending() == 0
    with pytest.raises(ConfigurationError, match="attached App"):
        scheduler.start()
    scheduler.schedule_advance("j", 0)
    with pytest.raises(ConfigurationError, match="not attached"):
        scheduler.drain()


def test_a_storage_outage_is_said_once_not_at_every_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from pipelines.engine.errors import StorageUnavailableError

    app = make_app(tmp_path / "o.db", Counting(), workers=1)
    storage, scheduler = app.storage, app.scheduler
    real = storage.claim_due  # type: ignore[attr-defined]

    def full(*args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailableError("the SQLite file failed claiming due jobs: database or disk is full")

    monkeypatch.setattr(storage, "claim_due", full)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        for _ in range(20):  # ten seconds of looks
            scheduler._look(grace=0.0)  # type: ignore[attr-defined]
        monkeypatch.setattr(storage, "claim_due", real)
        scheduler._look(grace=0.0)  # type: ignore[attr-defined]
    said = [r.getMessage() for r in caplog.records if "claiming due work" in r.getMessage()]
    assert len(said) == 2 and "failed" in said[0] and "claiming due work again" in said[1]
    assert caplog.records[0].exc_info is not None  # the first one with its traceback


def test_a_scheduler_claims_no_job_its_app_cannot_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Two Apps on one file, each running its own pipelines: a job of one is never taken by the other's
    # scheduler, which could only refuse it ("unknown pipeline") and kept it from its owner until a sweep.
    import logging

    path = tmp_path / "two.db"
    other = App(storage=SQLiteStorage(str(path)), scheduler=LocalScheduler(workers=2, poll=0.05),
                pipelines={"q": Counting().phases()}, provenance=False)
    counting = Counting()
    owner = make_app(path, counting, workers=2, poll=0.05)
    web = make_app(path, Counting())  # a process that starts runs and runs none (its scheduler never starts)
    ids = [f"j{i}" for i in range(3)]
    with caplog.at_level(logging.ERROR), other.scheduler:
        for job_id in ids:
            web.run_pipeline("p", job_id=job_id)
        time.sleep(0.5)  # ten looks of the other App's scheduler
        with owner.scheduler:
            wait_for(owner, ids, timeout=60.0)
    assert all(counting.runs[(job_id, "c")] == 1 for job_id in ids)
    refused = [r.getMessage() for r in caplog.records if "unknown pipeline" in r.getMessage()
               or (r.exc_info and "unknown pipeline" in str(r.exc_info[1]))]
    assert refused == []


def test_run_wait_with_the_worker_threads_started_runs_no_turn_in_the_callers_thread(tmp_path: Path) -> None:
    # run.wait() drained the scheduler in the caller's thread (a web request's) beside the worker threads: any
    # job's turn ran there, and any job's error (another app's job on the file: "unknown pipeline") was raised
    # to the caller waiting for its own run.
    counting = Counting(delay=0.3)
    app = make_app(tmp_path / "w.db", counting, workers=1)
    with app.scheduler:  # type: ignore[attr-defined]
        app.scheduler.schedule_advance("not-a-job-of-this-app", 0)  # type: ignore[attr-defined]
        assert app.drain() == 0  # the worker threads run the requests
        view = app.run_pipeline("p", job_id="mine").wait(timeout=30)
    assert view.status is JobStatus.COMPLETE and view.result == 3
    assert counting.threads and all(t.startswith("pipelines-local-") for t in counting.threads)


def _one_version_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This phaserunner now writes a schema one version past the file's: the file needs `pipelines migrate`."""
    from adapters.sqlite import schema

    now = schema.SCHEMA_VERSION
    monkeypatch.setitem(schema.MIGRATIONS, now + 1, ["CREATE INDEX jobs_later ON jobs (status)"])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)


def test_start_refuses_a_file_that_needs_migrating_before_any_thread_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = SQLiteStorage(str(tmp_path / "old.db"))
    made.get_job("x")  # the file, at this version
    made.close()
    _one_version_ahead(monkeypatch)
    app = make_app(tmp_path / "old.db", Counting(), workers=2)
    with pytest.raises(ConfigurationError, match="pipelines migrate"):
        app.scheduler.start()  # type: ignore[attr-defined]
    assert not app.scheduler.running  # type: ignore[attr-defined]


def test_a_file_migrated_under_the_poller_stops_it_with_one_error_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(tmp_path / "m.db", Counting(), workers=1, poll=0.02, sweep_interval=0.02)
    scheduler: LocalScheduler = app.scheduler  # type: ignore[assignment]
    with scheduler:
        _one_version_ahead(monkeypatch)  # as a newer phaserunner's `pipelines migrate` leaves the file
        poller = next(t for t in scheduler._threads if t.name == "pipelines-local-poll")
        poller.join(5)
        assert not poller.is_alive()  # not a retry every poll, for ever
    said = [r for r in caplog.records if r.levelname in ("ERROR", "WARNING") and "local scheduler" in r.getMessage()]
    assert len(said) == 1 and "stopped claiming" in said[0].getMessage() and said[0].exc_info is None, said


def test_a_request_for_a_job_a_thread_runs_waits_for_it_even_when_its_lease_looks_run_out(tmp_path: Path) -> None:
    # The whole process stood still or the clock stepped forward: the turn's lease looks run out until the lease
    # keeper renews it. A request then (the sweep's requeue of the overdue job) must not start the turn again.
    class Clock:
        now = time.time()

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    started: list[str] = []
    go = threading.Event()

    def slow(ctx: PhaseContext[Any]) -> Done:
        started.append(threading.current_thread().name)
        go.wait(10)
        return Done(result=len(started))

    app = App(storage=SQLiteStorage(str(tmp_path / "s.db"), clock=clock),
              scheduler=LocalScheduler(workers=2, poll=0.05, sweep_interval=0), pipelines={"p": [Phase("a", slow)]},
              provenance=False, lease_seconds=60)
    scheduler: LocalScheduler = app.scheduler  # type: ignore[assignment]
    with scheduler:
        app.run_pipeline("p", job_id="j")
        deadline = time.monotonic() + 10
        while not started and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.now += 3600
        scheduler.requeue("j")
        time.sleep(0.5)  # ten polls: a free worker had every chance to take the request
        assert len(started) == 1
        go.set()
        wait_for(app, ["j"])
    got = app.storage.get_job("j")
    assert got is not None and got.status is JobStatus.COMPLETE and got.result == 1


def test_drain_still_runs_the_requests_when_no_worker_thread_takes_them(tmp_path: Path) -> None:
    # drain() gave up whenever any thread lived: with workers=0 (the poller alone) and after stop() left a thread
    # finishing a long turn, nothing ran the requests any more and run.wait() timed out.
    counting = Counting()
    app = make_app(tmp_path / "z.db", counting, workers=0)
    with app.scheduler:  # type: ignore[attr-defined]
        app.run_pipeline("p", job_id="zero")
        assert app.drain() == 3 and app.get("zero").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    release = threading.Event()

    def slow(ctx: PhaseContext[Any]) -> Done:
        release.wait(10)
        return Done(result="slow")

    slow_app = App(storage=SQLiteStorage(str(tmp_path / "s.db")), scheduler=LocalScheduler(workers=1),
                   pipelines={"p": counting.phases(), "slow": [Phase("a", slow)]}, provenance=False)
    scheduler = slow_app.scheduler
    scheduler.start()  # type: ignore[attr-defined]
    slow_app.run_pipeline("slow", job_id="long")
    time.sleep(0.3)  # the worker thread is in its turn
    scheduler.stop(timeout=0.1)  # type: ignore[attr-defined]  # it outlives the stop
    slow_app.run_pipeline("p", job_id="after")
    assert slow_app.drain() == 3 and slow_app.get("after").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    release.set()


def test_a_request_put_back_while_a_thread_runs_its_job_keeps_its_priority(tmp_path: Path) -> None:
    # Put back at the interactive rank, a background job's request jumped the line of every interactive one.
    scheduler = LocalScheduler(workers=1, poll=0.05)
    scheduler._running["pipelines-local-0"] = ("j", time.time())  # a worker thread runs j's turn now
    scheduler.schedule_advance("j", 0, priority="background")
    found: list[str | None] = []
    taker = threading.Thread(target=lambda: found.append(scheduler._next()))
    taker.start()
    time.sleep(0.2)  # it took the request, saw j running here and put it back, a few times
    scheduler._stop.set()
    with scheduler._requests.cond:
        scheduler._requests.cond.notify_all()
    taker.join(5)
    assert found == [None]
    assert [(priority, job) for _, priority, job in scheduler.advances()] == [("background", "j")]
