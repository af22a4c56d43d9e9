"""Issue 14: an agent's model view migrated once, in the turn's commit, recorded in the transcript (memory, Redis)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from phases.compaction import MARKER_KEY, compacted_view, marker, view_marker
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, SimulatedCrash, call, reply


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"vm{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add."""
    return {"sum": a + b}


def answer(messages: list[dict[str, Any]]) -> Any:
    """Turn k (answers so far) adds k+1; the third says done. Deterministic per view."""
    k = sum(1 for m in messages if m["role"] == "assistant")
    return reply(f"turn {k}", call("add", a=k, b=1)) if k < 2 else "done"


upgrades: list[list[dict[str, Any]]] = []


def upgrade(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Version 2 re-pins the prompt and renames the tool results' "sum" to "total"."""
    upgrades.append(messages)
    out = [{"role": "system", "content": "You are v2."}]
    for m in messages[1:]:
        if m["role"] == "tool":
            m = {**m, "content": json.dumps({"total": json.loads(m["content"])["sum"]})}
        out.append(m)
    return out


def app_of(storage: Any, version: str, clock: VirtualClock, **extra: Any) -> tuple[App, ScriptedModel]:
    model = ScriptedModel(answer)
    bot = Agent(name="bot", model=model, tools=[add], system="You are v1.", version=version, stream=False, **extra)
    return App(storage=storage, scheduler=MemoryScheduler(clock=clock), agents=[bot], provenance=False), model


def sched(app: App) -> MemoryScheduler:
    assert isinstance(app.scheduler, MemoryScheduler)
    return app.scheduler


def old_job(storage: Any, clock: VirtualClock, job_id: str = "j") -> list[dict[str, Any]]:
    """A job version 1 ran one turn of: running, its next turn due; returns its transcript."""
    old, _ = app_of(storage, "1", clock)
    old.run_agent("bot", job_id=job_id, messages=["count"])
    assert sched(old).run_next()
    sched(old).drop_all()
    rec = storage.get_job(job_id)
    assert rec.code_version == "1" and rec.status is JobStatus.RUNNING
    return old.messages(job_id)


def markers(messages: list[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if MARKER_KEY in m]


def test_a_newer_worker_migrates_an_older_jobs_model_view_once_and_keeps_the_transcript(storage: Any) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    before = old_job(storage, clock)
    new, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    assert new.advance("j") is AdvanceResult.ADVANCED
    seen = model.calls[0].messages
    assert seen[0] == {"role": "system", "content": "You are v2."}  # re-pinned
    assert [m["content"] for m in seen if m["role"] == "tool"] == ['{"total": 1}']  # the migrated view
    assert all(MARKER_KEY not in m for m in seen)
    stored = new.messages("j")
    assert stored[:len(before)] == before  # append-only: nothing stored was rewritten
    assert markers(stored) == [len(before)] and stored[len(before)][MARKER_KEY]["version"] == "2"
    assert storage.get_job("j").code_version == "2"
    sched(new).drain()
    assert new.get("j").status is JobStatus.COMPLETE
    assert len(upgrades) == 1 and upgrades[0][0] == {"role": "system", "content": "You are v1."}  # once
    last = model.calls[-1].messages
    assert last[0]["content"] == "You are v2." and '{"total": 1}' in [m["content"] for m in last]
    assert '{"sum": 2}' in [m["content"] for m in last]  # v2's own turns are stored and seen as they are
    assert markers(new.messages("j")) == [len(before)]


def test_a_crash_after_the_migration_before_the_commit_runs_it_again_and_it_lands_once(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    before = old_job(storage, clock)
    new, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    real = storage.commit

    def crashing(*args: Any, **kwargs: Any) -> Any:
        raise SimulatedCrash("before the turn's commit")

    monkeypatch.setattr(storage, "commit", crashing)
    with pytest.raises(SimulatedCrash):
        new.advance("j")
    monkeypatch.setattr(storage, "commit", real)
    assert len(upgrades) == 1 and len(model.calls) == 1  # migrated, the model answered: then the crash
    rec = storage.get_job("j")
    assert rec.code_version == "1" and new.messages("j") == before  # nothing landed
    storage.release_lease("j", storage.lease_owner("j") or "")
    assert new.advance("j") is AdvanceResult.ADVANCED
    assert len(upgrades) == 2 and len(model.calls) == 1  # the re-run migrates again; the answer is journaled
    assert upgrades[0] == upgrades[1]
    sched(new).drain()
    assert len(upgrades) == 2 and markers(new.messages("j")) == [len(before)]  # after the commit: never again
    assert new.get("j").status is JobStatus.COMPLETE


def test_fork_before_the_migration_and_replay_are_deterministic(storage: Any) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    old_job(storage, clock)
    new, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    sched(new).schedule_advance("j", pipeline="bot")
    sched(new).drain()
    original = new.messages("j")
    seen = [r.messages for r in model.calls]
    assert len(upgrades) == 1
    new.fork("j", at_turn=1, new_job_id="f")  # after v1's turn, before the migration
    assert storage.get_job("f").code_version == "1" and new.messages("f") == original[:markers(original)[0]]
    new.resume("f")
    sched(new).drain()
    assert storage.get_job("f").status is JobStatus.COMPLETE
    assert len(upgrades) == 2 and new.messages("f") == original  # migrated again, exactly as the original
    assert [r.messages for r in model.calls[len(seen):]] == seen
    new.fork("j", at_turn=2, new_job_id="g", run=True).wait(timeout=5)  # after the migration: not again
    assert len(upgrades) == 2 and storage.get_job("g").code_version == "2" and new.messages("g") == original


def test_a_job_from_a_newer_version_is_not_touched(storage: Any) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    newer, _ = app_of(storage, "3", clock)
    newer.run_agent("bot", job_id="j", messages=["count"])
    assert sched(newer).run_next()
    before, rec = newer.messages("j"), storage.get_job("j")
    worker, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    assert worker.advance("j") is AdvanceResult.DEFERRED
    after = storage.get_job("j")
    assert after.version == rec.version and after.code_version == "3" and worker.messages("j") == before
    assert upgrades == [] and model.calls == []


def test_a_failing_view_migration_fails_the_job_and_a_retry_after_the_fix_migrates(storage: Any) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    before = old_job(storage, clock)

    def broken(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise KeyError("total")

    bad, model = app_of(storage, "2", clock, view_migrations={"1": broken})
    assert bad.advance("j") is AdvanceResult.FAILED
    rec = storage.get_job("j")
    assert rec.status is JobStatus.ERROR and "view migration from version '1' failed: KeyError" in (rec.error or "")
    assert bad.messages("j") == before and model.calls == []
    fixed, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    fixed.retry("j")
    sched(fixed).drain()
    assert fixed.get("j").status is JobStatus.COMPLETE and len(upgrades) == 1
    assert model.calls[0].messages[0]["content"] == "You are v2." and markers(fixed.messages("j")) == [len(before)]


@pytest.mark.parametrize(("raised", "named"), [(SystemExit(3), "SystemExit: 3"), (SystemExit(), "SystemExit "),
                                               (GeneratorExit(), "GeneratorExit ")], ids=["exit-3", "exit", "gen-exit"])
def test_a_view_migration_that_calls_sys_exit_fails_the_job_as_data_not_the_worker(
        storage: Any, raised: BaseException, named: str) -> None:
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    before = old_job(storage, clock)

    def exits(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        raise raised  # what sys.exit() raises, from a library the migration calls

    bad, model = app_of(storage, "2", clock, view_migrations={"1": exits})
    assert bad.advance("j") is AdvanceResult.FAILED  # returned: the worker loop goes on
    rec = storage.get_job("j")
    assert rec.status is JobStatus.ERROR and f"view migration from version '1' failed: {named}" in (rec.error or "")
    assert bad.messages("j") == before and model.calls == []
    fixed, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    fixed.retry("j")
    sched(fixed).drain()
    assert fixed.get("j").status is JobStatus.COMPLETE and len(upgrades) == 1


def test_the_view_is_rebuilt_from_markers_and_a_later_compaction_keeps_the_new_pin() -> None:
    past: list[dict[str, Any]] = [{"role": "system", "content": "v1"}, {"role": "user", "content": "a"}]
    view = [{"role": "system", "content": "v2"}, {"role": "user", "content": "A"}]
    past = [*past, view_marker(view, upto=2, version="2"), {"role": "assistant", "content": "b"}]
    assert compacted_view(past) == [*view, {"role": "assistant", "content": "b"}]
    past = [*past, {"role": "user", "content": "c"}, marker("summary", upto=4)]
    assert compacted_view(past) == [view[0], {"role": "user", "content": "(Summary of the earlier conversation)\n"
                                                                       "summary"}, {"role": "user", "content": "c"}]


@pytest.mark.parametrize("options, match", [
    ({"version": "2", "view_migrations": {"2": upgrade}}, "not older"),
    ({"version": "2", "view_migrations": {"1": "upgrade"}}, "function of the messages"),
    ({"view_migrations": {"1": upgrade}}, "view_migrations need a version"),
])
def test_bad_view_migrations_are_refused_at_definition(options: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        Agent(name="bot", model=ScriptedModel(answer), **options)


def test_a_full_retry_after_the_migration_migrates_the_restarted_run_again(storage: Any) -> None:
    """The run's start (v1's transcript and state) comes back with a full retry: v1's, so migrated again."""
    upgrades.clear()
    clock = VirtualClock(start=1_000_000.0)
    before = old_job(storage, clock)
    new, model = app_of(storage, "2", clock, view_migrations={"1": upgrade})
    assert new.advance("j") is AdvanceResult.ADVANCED  # v2 migrates the view, stamps the job v2
    assert storage.get_job("j").code_version == "2" and len(upgrades) == 1
    sched(new).drop_all()
    new.cancel("j")
    new.retry("j", mode="full")  # back to the run's start: the transcript v1 wrote, its state
    rec = storage.get_job("j")
    assert rec.code_version == "1" and rec.run_code_version == "1"
    assert new.messages("j") == before[:rec.base_transcript_len]
    sched(new).drain()
    assert new.get("j").status is JobStatus.COMPLETE
    assert len(upgrades) == 2  # the restarted run was migrated again, from v1's view
    seen = model.calls[-1].messages
    assert seen[0] == {"role": "system", "content": "You are v2."}
    assert storage.get_job("j").code_version == "2"
