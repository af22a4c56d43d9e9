"""A poison turn (its work kills the worker running it) fails its job after ``max_interrupted_turns`` take-overs.

Without a count the turn loops for ever: its lease runs out, the sweep hands it to another worker, which runs
it and dies too. Here a worker's death is a phase that raises :class:`Crash` with the worker's lease left as
it was (a killed process lets nothing go): it runs out on the virtual clock, and the next advance takes it over.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import App, JobStatus
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Checkpoint, Commit, JobRecord
from pipelines.engine.phase import Done, Next, Phase, PhaseContext, Pipeline
from pipelines.engine.runner import DEFAULT_MAX_INTERRUPTED_TURNS, AdvanceResult
from tests.unit.helpers import Crash

LEASE = 10.0


class DyingStorage(MemoryStorage):
    """A worker that dies keeps its lease: ``release_lease`` does nothing while ``dying`` is set."""

    dying = False

    def release_lease(self, job_id: str, owner: str) -> None:
        if not self.dying:
            super().release_lease(job_id, owner)


class Poison:
    """A phase that kills its worker the first ``kills`` times it runs (per phase name), then goes on."""

    def __init__(self, storage: DyingStorage, kills: int) -> None:
        self.storage, self.kills = storage, kills
        self.runs: dict[str, int] = {}

    def __call__(self, ctx: PhaseContext[Any]) -> Next | Done:
        n = self.runs[ctx.phase] = self.runs.get(ctx.phase, 0) + 1
        if n <= self.kills:
            self.storage.dying = True
            raise Crash(f"{ctx.phase} killed its worker ({n})")
        return Next("b", ctx.state) if ctx.phase == "a" else Done(result="ok")


def app_of(kills: int, **options: Any) -> tuple[App, DyingStorage, VirtualClock, Poison]:
    clock = VirtualClock(start=1_000_000.0)
    storage = DyingStorage(clock=clock)
    poison = Poison(storage, kills)
    app = App(storage=storage, scheduler=MemoryScheduler(clock=clock), lease_seconds=LEASE,
              pipelines={"p": [Phase("a", poison), Phase("b", poison)]}, **options)
    return app, storage, clock, poison


def advance(app: App, storage: DyingStorage, clock: VirtualClock, job_id: str = "j") -> AdvanceResult | None:
    """One worker's advance of the job: ``None`` when the worker died in it (its lease then runs out)."""
    storage.dying = False
    try:
        return app.advance(job_id)
    except Crash:
        clock.advance(LEASE + 1)  # nobody renews a dead worker's lease
        return None


def test_a_turn_that_kills_every_worker_fails_its_job_after_the_limit_instead_of_looping(
        caplog: pytest.LogCaptureFixture) -> None:
    app, storage, clock, poison = app_of(kills=1000)
    app.run_pipeline("p", job_id="j", initial_state={})
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        results = [advance(app, storage, clock) for _ in range(DEFAULT_MAX_INTERRUPTED_TURNS + 1)]
    assert results == [None] * DEFAULT_MAX_INTERRUPTED_TURNS + [AdvanceResult.FAILED]
    assert poison.runs == {"a": DEFAULT_MAX_INTERRUPTED_TURNS}  # not run a sixth time
    rec = app.get("j")
    assert rec is not None and rec.status is JobStatus.ERROR and rec.error is not None
    assert rec.error.startswith("job 'j': its turn was interrupted 5 times in a row without committing")
    assert "failed so it does not take down more workers" in rec.error
    assert [e.type for e in app.events("j")][-1] == "job_failed"
    assert storage.lease_owner("j") is None  # the failure let the lease go
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for n in range(1, DEFAULT_MAX_INTERRUPTED_TURNS):  # each take-over of a lapsed lease is said, with its count
        assert any(m.startswith(f"job j: its turn lost its lease without committing {n} time(s) in a row")
                   for m in warned), (n, warned)
    assert advance(app, storage, clock) is AdvanceResult.NOT_RUNNING  # and nothing runs it again

    # A retry starts the count again from 0: the turn runs (and kills) five more times before failing again.
    app.retry("j")
    assert storage.get_job("j").interrupted == 0  # type: ignore[union-attr]
    assert advance(app, storage, clock) is None
    assert poison.runs == {"a": DEFAULT_MAX_INTERRUPTED_TURNS + 1}
    assert storage.get_job("j").interrupted == 0  # type: ignore[union-attr]  # its lease ran out, nobody took it yet
    assert advance(app, storage, clock) is None
    assert storage.get_job("j").interrupted == 1  # type: ignore[union-attr]


def test_a_retry_of_the_failed_job_runs_its_turn_again() -> None:
    app, storage, clock, _poison = app_of(kills=DEFAULT_MAX_INTERRUPTED_TURNS)  # the sixth run would pass
    app.run_pipeline("p", job_id="j", initial_state={})
    while advance(app, storage, clock) is not AdvanceResult.FAILED:
        pass
    app.retry("j")
    assert advance(app, storage, clock) is AdvanceResult.ADVANCED
    assert advance(app, storage, clock) is None  # phase b kills its worker: counted from 0 again
    assert app.get("j").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_a_commit_starts_the_count_again_so_interruptions_apart_never_fail_the_job() -> None:
    # Each phase kills four workers, then commits: eight interruptions in all, never five in a row.
    app, storage, clock, _poison = app_of(kills=DEFAULT_MAX_INTERRUPTED_TURNS - 1)
    app.run_pipeline("p", job_id="j", initial_state={})
    results = [advance(app, storage, clock) for _ in range(2 * DEFAULT_MAX_INTERRUPTED_TURNS)]
    assert results == [None] * 4 + [AdvanceResult.ADVANCED] + [None] * 4 + [AdvanceResult.COMPLETED]
    rec = app.get("j")
    assert rec is not None and rec.status is JobStatus.COMPLETE and storage.get_job("j").interrupted == 0  # type: ignore[union-attr]


def test_the_limit_is_the_apps_option_and_none_never_fails_the_job() -> None:
    app, storage, clock, _poison = app_of(kills=1000, max_interrupted_turns=2)
    app.run_pipeline("p", job_id="j", initial_state={})
    assert [advance(app, storage, clock) for _ in range(3)] == [None, None, AdvanceResult.FAILED]
    assert "interrupted 2 times in a row" in (app.get("j").error or "")  # type: ignore[union-attr]

    app, storage, clock, _poison = app_of(kills=1000, max_interrupted_turns=None)
    app.run_pipeline("p", job_id="j", initial_state={})
    assert [advance(app, storage, clock) for _ in range(12)] == [None] * 12
    assert storage.get_job("j").status is JobStatus.RUNNING and storage.get_job("j").interrupted == 11  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "5"])
def test_a_limit_that_is_not_a_positive_int_is_refused(bad: Any) -> None:
    clock = VirtualClock()
    with pytest.raises(InvalidInputError, match="max_interrupted_turns must be an int >= 1 or None"):
        App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), max_interrupted_turns=bad)


def test_memory_counts_a_lease_taken_over_after_it_ran_out_never_one_let_go_and_a_commit_resets_it() -> None:
    clock = VirtualClock(start=1_000_000.0)
    storage = MemoryStorage(clock=clock)
    rec = JobRecord(job_id="j", status=JobStatus.RUNNING, version=1,
                    checkpoint=Checkpoint[Any](next_phase="a", state={}))
    storage.create_job(rec)
    assert storage.acquire_lease("j", "w1", 5).interrupted == 0  # type: ignore[union-attr]
    storage.release_lease("j", "w1")
    assert storage.acquire_lease("j", "w2", 5).interrupted == 0  # type: ignore[union-attr]  # let go: not lost
    clock.advance(6)
    assert storage.get_job("j").interrupted == 0  # type: ignore[union-attr]  # ran out, nobody took it over yet
    assert storage.acquire_lease("j", "w3", 5).interrupted == 1  # type: ignore[union-attr]
    assert storage.acquire_lease("j", "w3", 5).interrupted == 1  # type: ignore[union-attr]  # its own, live
    clock.advance(6)
    taken = storage.acquire_lease("j", "w4", 5)
    assert taken is not None and taken.interrupted == 2 and storage.get_job("j").interrupted == 2  # type: ignore[union-attr]
    new = taken.model_copy(update={"version": 2, "interrupted": 0})
    storage.commit(Commit(job_id="j", expected_version=1, owner="w4", token="t", record=new, release_lease=False))
    assert storage.get_job("j").interrupted == 0  # type: ignore[union-attr]
    clock.advance(6)
    assert storage.acquire_lease("j", "w5", 5).interrupted == 1  # type: ignore[union-attr]  # counted anew


def test_an_older_worker_leaves_a_newer_versions_job_alone_even_past_the_limit() -> None:
    # A record written by a newer version is never written by an older worker (its commit would drop what the
    # newer one stored): the job waits for a worker of its version, which fails it.
    clock = VirtualClock(start=1_000_000.0)
    storage = DyingStorage(clock=clock)
    poison = Poison(storage, kills=1000)

    def app_of_version(version: str) -> App:
        return App(storage=storage, scheduler=MemoryScheduler(clock=clock), lease_seconds=LEASE,
                   pipelines={"p": Pipeline([Phase("a", poison), Phase("b", poison)], version=version)})

    new, old = app_of_version("2"), app_of_version("1")
    new.run_pipeline("p", job_id="j", initial_state={})
    assert [advance(new, storage, clock) for _ in range(DEFAULT_MAX_INTERRUPTED_TURNS)] == [None] * 5
    assert advance(old, storage, clock) is AdvanceResult.DEFERRED
    assert storage.get_job("j").status is JobStatus.RUNNING  # type: ignore[union-attr]
    assert advance(new, storage, clock) is AdvanceResult.FAILED
