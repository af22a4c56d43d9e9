"""Issue 14: versioned jobs - the version that last wrote a job, migrations, newer jobs left alone (memory, Redis)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from pipelines import Agent, App, Done, JobStatus, Next, PhaseContext
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"v{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def step_v1(ctx: PhaseContext[Any]) -> Any:
    n = ctx.state["n"] + 1
    return Next("step", state={"n": n}) if n < 2 else Done(result=n)


def step_v2(ctx: PhaseContext[Any]) -> Any:
    count = ctx.state["count"] + 1  # v2 renamed the field
    return Next("step", state={"count": count}) if count < 4 else Done(result=count)


migrated: list[Any] = []


def rename(state: Any) -> Any:
    migrated.append(state)
    return {"count": state["n"]}


def app_of(storage: Any, version: str, clock: VirtualClock, **extra: Any) -> App:
    step = step_v1 if version == "1" else step_v2
    pipe = Pipeline([Phase("step", step)], version=version, **extra)
    return App(storage=storage, scheduler=MemoryScheduler(clock=clock), pipelines={"p": pipe}, provenance=False)


def sched(app: App) -> MemoryScheduler:
    assert isinstance(app.scheduler, MemoryScheduler)
    return app.scheduler


def test_a_newer_worker_migrates_an_older_job_once_in_its_next_commit(storage: Any) -> None:
    migrated.clear()
    clock = VirtualClock(start=1_000_000.0)
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id="j", initial_state={"n": 0})
    assert sched(old).run_next()  # one v1 turn: state {"n": 1}
    rec = storage.get_job("j")
    assert rec.code_version == "1" and rec.checkpoint.state == {"n": 1}
    new = app_of(storage, "2", clock, migrations={"1": rename})
    assert new.advance("j") is AdvanceResult.ADVANCED
    rec = storage.get_job("j")
    assert rec.code_version == "2" and rec.checkpoint.state == {"count": 2}  # migrated, then the v2 turn ran
    sched(new).drain()
    sched(old).drop_all()
    view = new.get("j")
    assert view is not None and view.status is JobStatus.COMPLETE and view.result == 4
    assert migrated == [{"n": 1}]  # once, for all the turns that followed


def test_an_older_worker_leaves_a_newer_job_untouched_and_asks_again_later(
        storage: Any, caplog: pytest.LogCaptureFixture) -> None:
    clock = VirtualClock(start=1_000_000.0)
    new = app_of(storage, "2", clock, migrations={"1": rename})
    new.run_pipeline("p", job_id="j", initial_state={"count": 0})
    sched(new).drop_all()
    before = storage.get_job("j")
    old = app_of(storage, "1", clock)
    with caplog.at_level(logging.WARNING, logger="pipelines.versions"):
        assert old.advance("j") is AdvanceResult.DEFERRED
        assert old.advance("j") is AdvanceResult.DEFERRED
    after = storage.get_job("j")
    assert after.version == before.version and after.checkpoint.state == {"count": 0}  # not touched
    assert after.code_version == "2" and storage.lease_owner("j") is None
    assert "written by version 2, newer than this worker's 1" in caplog.text
    delays = [d - clock() for d in sorted(e.due for e in sched(old)._heap)]
    assert delays[0] > 0 and delays[1] > delays[0]  # requeued with backoff, not at once
    assert new.advance("j") is AdvanceResult.ADVANCED  # a worker of the job's version runs it


def test_a_failing_migration_fails_the_job_with_the_stored_state_kept(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id="j", initial_state={"n": 0})

    def broken(state: Any) -> Any:
        raise KeyError("count")

    bad = app_of(storage, "2", clock, migrations={"1": broken})
    assert bad.advance("j") is AdvanceResult.FAILED
    rec = storage.get_job("j")
    assert rec.status is JobStatus.ERROR and "migration from version '1' failed: KeyError" in (rec.error or "")
    assert rec.code_version == "1" and rec.checkpoint.state == {"n": 0}  # nothing half migrated
    fixed = app_of(storage, "2", clock, migrations={"1": rename})
    fixed.retry("j")
    sched(fixed).drain()
    assert storage.get_job("j").result == 4



def test_a_migration_whose_state_is_too_large_to_store_fails_the_job(storage: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Not due forever with every attempt's commit refused (the failure's too): the migration's own failure.
    import pipelines.engine.models as models

    clock = VirtualClock(start=1_000_000.0)
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id="big", initial_state={"n": 0})
    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 100_000)
    bloated = app_of(storage, "2", clock, migrations={"1": lambda state: {"count": 0, "pad": "x" * 200_000}})
    assert bloated.advance("big") is AdvanceResult.FAILED
    rec = storage.get_job("big")
    assert rec.status is JobStatus.ERROR and "ValueTooLargeError" in (rec.error or "")
    assert rec.code_version == "1" and rec.checkpoint.state == {"n": 0}

def test_versions_default_from_the_app_and_go_with_forks(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    app = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, version="3.1",
              pipelines={"p": [Phase("step", step_v1)]},
              agents=[Agent(name="bot", model=ScriptedModel(lambda m: "hi"), version="7")])
    app.run_pipeline("p", job_id="p1", initial_state={"n": 0})
    app.run_agent("bot", job_id="a1", messages=["hello"])
    app.drain()
    assert storage.get_job("p1").code_version == "3.1" and storage.get_job("a1").code_version == "7"
    app.fork("a1", at_turn=1, new_job_id="f")
    assert storage.get_job("f").code_version == "7"
    plain = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False, version="build-abc",
                pipelines={"p": [Phase("step", step_v1)]})
    plain.run_pipeline("p", job_id="p2", initial_state={"n": 0})
    assert storage.get_job("p2").code_version is None  # a non-numeric app version leaves jobs unversioned


@pytest.mark.parametrize("options, match", [
    ({"version": "v2"}, "dotted numbers"),
    ({"version": "2", "migrations": {"2": rename}}, "not older"),
    ({"version": "2", "migrations": {"1": "rename"}}, "function"),
    ({"migrations": {"1": rename}}, "need a version"),
    ({"version": "2", "migrations": [rename]}, "dict"),
])
def test_bad_versions_and_migrations_are_refused_at_definition(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        Pipeline([Phase("step", step_v1)], **options)
    with pytest.raises(InvalidInputError, match=match):
        Agent(name="bot", model=ScriptedModel(lambda m: "hi"), **options)


def test_version_order_is_numeric() -> None:
    from pipelines.engine.versions import version_key

    assert version_key("1.10") > version_key("1.9") and version_key("2") == version_key("2.0")


def test_the_cli_lists_what_runs_on_which_version(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from pipelines.cli import main

    clock = VirtualClock(start=1_000_000.0)
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id="a", initial_state={"n": 0})
    sched(old).drain()
    new = app_of(storage, "2", clock, migrations={"1": rename})
    new.run_pipeline("p", job_id="c", initial_state={"count": 0})
    monkeypatch.setattr("pipelines.cli.loading.load", lambda spec: new)
    out = io.StringIO()
    assert main(["jobs", "--app", "x:app", "--version"], out=out, err=io.StringIO()) == 0
    assert out.getvalue().splitlines() == ["p\t1\t1\tcomplete=1", "p\t2\t1\trunning=1"]


def _one_v1_turn(storage: Any, job_id: str, clock: VirtualClock) -> App:
    """A job of version 1 that ran one turn (its next one not asked for); the v1 App."""
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id=job_id, initial_state={"n": 0})
    sched(old).run_next()
    sched(old).drop_all()
    return old


def test_a_fork_retried_from_the_start_restarts_as_its_source_with_the_source_runs_version(storage: Any) -> None:
    # The fork's runs start as its source's (its initial state, v1's): a full retry makes it v1's job again,
    # so the next turn migrates it, as the source's own full retry would.
    clock = VirtualClock(start=1_000_000.0)
    _one_v1_turn(storage, "j", clock)
    new = app_of(storage, "2", clock, migrations={"1": rename})
    new.advance("j")  # migrated to v2
    sched(new).drop_all()
    new.fork("j", at_turn=2, new_job_id="f")
    new.cancel("f")
    new.retry("f", mode="full")
    assert storage.get_job("f").code_version == "1"
    sched(new).drain()
    fork = storage.get_job("f")
    assert fork.status is JobStatus.COMPLETE and fork.result == 4, fork.error


def test_a_run_started_by_a_message_in_the_last_turn_is_the_version_that_ran_it(storage: Any) -> None:
    # done_and_continued starts the next run in the last turn's commit: a full retry of that run goes back to
    # a start written by that commit's version, not the first run's.
    from pipelines.engine import transitions

    clock = VirtualClock(start=1_000_000.0)
    old = app_of(storage, "1", clock)
    old.run_pipeline("p", job_id="k", initial_state={"n": 0})
    rec = storage.get_job("k")
    assert rec.run_code_version == "1"
    new_rec = rec.model_copy(update={"code_version": "2"})  # v2 ran the last turn (migrated already)
    outcome = Done(result=1)
    commit = transitions.done_and_continued(new_rec, outcome, transitions.PhaseOutput(),
                                            [{"role": "user", "content": "more"}], owner="w", now=clock())
    assert commit.record.run_code_version == "2"


def test_a_full_retry_given_a_start_state_runs_it_as_the_retrying_codes_version(storage: Any) -> None:
    # The state was made by the code that retries (v2-shaped): no v1 -> v2 migration runs on it, and it is
    # the run's start from now on.
    clock = VirtualClock(start=1_000_000.0)
    _one_v1_turn(storage, "g", clock).cancel("g")
    migrated.clear()
    new = app_of(storage, "2", clock, migrations={"1": rename})
    new.run_pipeline("p", job_id="g", initial_state={"count": 0}, retry_mode="full")
    rec = storage.get_job("g")
    assert rec.code_version == "2" and rec.run_code_version == "2" and rec.initial_state == {"count": 0}
    sched(new).drain()
    assert storage.get_job("g").result == 4 and migrated == []


def test_a_worker_without_a_version_leaves_a_versioned_job_alone(storage: Any) -> None:
    # It is older than every versioned worker, as a job without a version is older than every versioned job:
    # its code would run on a state a newer version wrote (and commit it under that version's label).
    clock = VirtualClock(start=1_000_000.0)
    new = app_of(storage, "2", clock, migrations={"1": rename})
    new.run_pipeline("p", job_id="u", initial_state={"count": 0})
    sched(new).drop_all()
    before = storage.get_job("u")
    unversioned = App(storage=storage, scheduler=MemoryScheduler(clock=clock), provenance=False,
                      pipelines={"p": Pipeline([Phase("step", step_v1)])})
    assert unversioned.advance("u") is AdvanceResult.DEFERRED
    after = storage.get_job("u")
    assert after.version == before.version and after.checkpoint.state == {"count": 0} and after.error is None
    assert new.advance("u") is AdvanceResult.ADVANCED
