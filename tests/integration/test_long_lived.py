"""Issue 14: fork and replay, delete and retention, on memory and on a real redis-server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from pipelines import Agent, App, Done, JobStatus, Next, PhaseContext, tool
from pipelines.engine import transitions
from pipelines.engine.errors import ConfigurationError, InvalidInputError, JobConflictError, JobNotFoundError
from pipelines.testing import ScriptedModel, SimulatedCrash, call, reply


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"ll{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool(needs_approval=True)
def wire(to: str) -> str:
    """Send money."""
    return f"sent to {to}"


def answer(messages: list[dict[str, Any]]) -> Any:
    """Deterministic per conversation: turn k (counted from the answers so far) adds k+1, the 4th says done."""
    k = sum(1 for m in messages if m["role"] == "assistant")
    return reply(f"turn {k}", call("add", a=k, b=1)) if k < 3 else "done"


def make_app(storage: Any, clock: VirtualClock | None = None) -> tuple[App, ScriptedModel]:
    model = ScriptedModel(answer)
    scheduler = MemoryScheduler(clock=clock or VirtualClock(start=1_000_000.0))
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="bot", model=model, tools=[add],
                                                                    system="be brief")], provenance=False)
    return app, model


def finished(app: App, job_id: str = "orig") -> list[dict[str, Any]]:
    app.run_agent("bot", job_id=job_id, messages=["count"])
    app.drain()
    return app.messages(job_id)


# --- fork and replay ----------------------------------------------------------------------
def test_a_fork_starts_from_the_transcript_and_state_of_that_turn(storage: Any) -> None:
    app, model = make_app(storage)
    original = finished(app)
    before = storage.get_job("orig")
    mark = transitions.turn_mark(before, 2)
    app.fork("orig", at_turn=2, new_job_id="f2")
    fork = storage.get_job("f2")
    assert fork.status is JobStatus.PAUSED and fork.forked_from == "orig" and fork.at_turn == 2
    assert app.messages("f2") == original[: mark.transcript_len] and mark.transcript_len == 6  # sys, user, 2x2
    assert fork.checkpoint.state == {"turn": 2} and fork.phases_done == 2
    assert storage.get_job("orig") == before and app.messages("orig") == original  # untouched
    calls = len(model.calls)
    app.resume("f2")
    app.drain()
    assert app.get("f2").status is JobStatus.COMPLETE and app.messages("f2") == original
    assert len(model.calls) - calls == 2  # turns 3 and 4 only: the first two were not asked again
    assert app.events("f2")[0].type == "job_forked"


def test_fork_at_turn_zero_and_at_the_last_turn(storage: Any) -> None:
    app, _ = make_app(storage)
    original = finished(app)
    app.fork("orig", at_turn=0, new_job_id="f0")
    assert app.messages("f0") == original[:2] and storage.get_job("f0").checkpoint.state == {"turn": 0}
    app.fork("orig", at_turn=4, new_job_id="f4")
    last = app.get("f4")
    assert last.status is JobStatus.COMPLETE and last.result == "done" and app.messages("f4") == original
    app.run_agent("bot", job_id="f4", messages=["again"])  # a complete fork is continued like any conversation
    app.drain()
    assert app.messages("f4")[len(original)] == {"role": "user", "content": "again"}


def test_rerun_runs_the_fork_with_overridden_options(storage: Any) -> None:
    app, _ = make_app(storage)
    finished(app)
    run = app.rerun("orig", from_turn=1, new_job_id="r1", max_turns=2)
    view = run.wait(timeout=5)
    assert view.status is JobStatus.COMPLETE and view.record.stop_reason == "max_turns"
    assert view.record.options["max_turns"] == 2 and view.record.forked_from == "orig"
    assert len([m for m in app.messages("r1") if m["role"] == "assistant"]) == 2


def test_a_fork_of_a_fork_and_a_retried_fork(storage: Any) -> None:
    app, _ = make_app(storage)
    original = finished(app)
    app.fork("orig", at_turn=3, new_job_id="a")
    app.fork("a", at_turn=1, new_job_id="b")  # the fork kept the history up to its turn
    assert app.messages("b") == original[:4] and storage.get_job("b").forked_from == "a"
    # The same fork again (a retry after a lost reply) returns the job that landed; another is a conflict.
    assert app.fork("a", at_turn=1, new_job_id="b").job_id == "b"
    with pytest.raises(JobConflictError, match="already exists"):
        app.fork("orig", at_turn=2, new_job_id="b")


def test_bad_forks_are_refused_with_nothing_written(storage: Any) -> None:
    app, _ = make_app(storage)
    finished(app)
    with pytest.raises(InvalidInputError, match=r"no checkpoint for turn 9: its record keeps turns 0\.\.4"):
        app.fork("orig", at_turn=9, new_job_id="x")
    with pytest.raises(InvalidInputError, match="at_turn must be an int"):
        app.fork("orig", at_turn="1", new_job_id="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="nothing runs after it"):
        app.rerun("orig", from_turn=4, new_job_id="x")
    with pytest.raises(InvalidInputError, match="max_turns"):
        app.rerun("orig", from_turn=1, new_job_id="x", max_turns=-1)
    with pytest.raises(JobNotFoundError):
        app.fork("nope", at_turn=0, new_job_id="x")
    assert storage.get_job("x") is None


def test_a_refused_fork_names_the_turns_kept_with_their_gaps(storage: Any) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False,
              agents=[Agent(name="a", model=ScriptedModel(lambda m: "ok"), stream=False)])
    app.run_agent("a", job_id="c", user="hi").wait()
    app.retry("c", mode="full")  # the run it cut takes its turn out of the history
    app.drain()
    with pytest.raises(InvalidInputError, match=r"keeps turns 0, 2 \(.*a full retry drops the turns of the run"):
        app.fork("c", at_turn=1, new_job_id="c-f1")


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_around_the_fork_write_leaves_no_half_fork(storage: Any, monkeypatch: pytest.MonkeyPatch,
                                                           when: str) -> None:
    app, _ = make_app(storage)
    original = finished(app)
    real = storage.create_job

    def crashing(*args: Any, **kwargs: Any) -> None:
        if when == "after":
            real(*args, **kwargs)
        raise SimulatedCrash(f"{when} create_job")

    monkeypatch.setattr(storage, "create_job", crashing)
    with pytest.raises(SimulatedCrash):
        app.fork("orig", at_turn=2, new_job_id="f")
    monkeypatch.setattr(storage, "create_job", real)
    assert (storage.get_job("f") is None) == (when == "before")  # all or nothing
    app.fork("orig", at_turn=2, new_job_id="f")  # what the caller does after a crash: the same call
    assert app.messages("f") == original[:6] and storage.get_job("f").status is JobStatus.PAUSED


# --- the bounded history --------------------------------------------------------------------
def loop(ctx: PhaseContext[Any]) -> Next | Done:
    n = ctx.state["n"]
    size = ctx.state["size"]
    return Done(result=n) if n >= 60 else Next("loop", state={"n": n + 1, "size": size, "pad": "x" * size})


def test_the_history_keeps_the_last_turns_only(storage: Any) -> None:
    from pipelines import Phase

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"loop": [Phase("loop", loop)]})
    app.run_pipeline("loop", job_id="p", initial_state={"n": 0, "size": 0})
    app.drain()
    rec = storage.get_job("p")
    assert len(rec.history) == transitions.HISTORY_LIMIT and rec.history[-1].phases_done == 61
    with pytest.raises(InvalidInputError, match=r"keeps turns 12\.\.61"):
        app.fork("p", at_turn=5, new_job_id="old")
    app.fork("p", at_turn=40, new_job_id="q", run=True)
    app.drain()
    assert storage.get_job("q").checkpoint is None and storage.get_job("q").result == 60


def test_a_large_state_keeps_fewer_turns_within_the_byte_bound(storage: Any) -> None:
    from pipelines import Phase

    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"loop": [Phase("loop", loop)]})
    pad = transitions.HISTORY_BYTES // 10
    app.run_pipeline("loop", job_id="big", initial_state={"n": 0, "size": pad})
    app.drain()
    history = storage.get_job("big").history
    assert sum(m.size for m in history) <= transitions.HISTORY_BYTES and 5 <= len(history) < 10
    assert history[-1].phases_done == 61


# --- delete and retention ------------------------------------------------------------------
def stored_keys(storage: Any, job_id: str) -> list[str]:
    """Everything storage holds for ``job_id``: its own keys and its index entries."""
    if isinstance(storage, MemoryStorage):
        left = [k for k, v in storage.inspect(job_id).items() if v not in (None, [], {})]
        return left + [name for name, index in (("due", storage._due), ("finished", storage._finished))
                       if job_id in index]
    r = storage.client
    own = [k.decode() for k in r.scan_iter(match=f"{storage.prefix}:{{{job_id}}}:*")]
    indexed = [key for key in (storage.due_key, storage.finished_key) if r.zscore(key, job_id) is not None]
    return own + indexed + ([storage.jobs_key] if r.sismember(storage.jobs_key, job_id) else [])


def test_delete_removes_every_key_of_a_finished_job_and_nothing_else(storage: Any) -> None:
    app, _ = make_app(storage)
    finished(app)
    finished(app, "other")
    app.stream("orig", follow=False)  # the live stream exists too
    assert stored_keys(storage, "orig")
    app.delete("orig")
    assert stored_keys(storage, "orig") == [] and app.get("orig") is None
    assert app.get("other").status is JobStatus.COMPLETE and len(app.messages("other")) == 9
    with pytest.raises(JobNotFoundError):
        app.delete("orig")


def test_delete_refuses_a_running_or_waiting_job(storage: Any) -> None:
    app, _ = make_app(storage)
    app.run_agent("bot", job_id="live", messages=["count"])  # running, not drained
    with pytest.raises(JobConflictError, match="is running; cancel it before deleting it"):
        app.delete("live")
    assert storage.get_job("live") is not None and len(app.messages("live")) == 2
    asking = Agent(name="asker", model=ScriptedModel([reply(None, call("wire", to="ann"))]), tools=[wire])
    app.add_agent(asking)
    app.run_agent("asker", job_id="ask", messages=["pay"])
    app.drain()
    assert app.get("ask").status is JobStatus.WAITING
    with pytest.raises(JobConflictError, match="is waiting"):
        app.delete("ask")
    assert stored_keys(storage, "ask")


def test_a_paused_job_can_be_deleted(storage: Any) -> None:
    app, _ = make_app(storage)
    app.run_agent("bot", job_id="p", messages=["count"])
    app.pause("p")
    app.delete("p")
    assert stored_keys(storage, "p") == []


def test_a_delete_is_fenced_on_the_version_it_judged(storage: Any) -> None:
    from pipelines.engine.errors import StaleVersionError

    app, _ = make_app(storage)
    app.run_agent("bot", job_id="j", messages=["count"])
    app.cancel("j", force=True)
    judged = storage.get_job("j")
    app.retry("j")  # a restart lands between the check and the delete
    with pytest.raises(StaleVersionError):
        storage.delete_job("j", if_version=judged.version)
    assert storage.get_job("j").status is JobStatus.RUNNING and len(app.messages("j")) == 2


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_around_the_delete_leaves_the_job_whole_or_gone(storage: Any, monkeypatch: pytest.MonkeyPatch,
                                                                when: str) -> None:
    app, _ = make_app(storage)
    original = finished(app)
    real = storage.delete_job

    def crashing(*args: Any, **kwargs: Any) -> bool:
        done = real(*args, **kwargs) if when == "after" else False
        raise SimulatedCrash(f"{when} delete_job {done}")

    monkeypatch.setattr(storage, "delete_job", crashing)
    with pytest.raises(SimulatedCrash):
        app.delete("orig")
    monkeypatch.setattr(storage, "delete_job", real)
    if when == "before":
        assert app.messages("orig") == original and storage.get_job("orig").status is JobStatus.COMPLETE
        app.delete("orig")
    assert stored_keys(storage, "orig") == []


def family_app(storage: Any) -> App:
    """A boss whose two calls each start a researcher run, which starts a clerk run of its own (three levels),
    run to its end."""
    def boss(messages: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input="a"), "id": "c0"}, {**call("researcher", input="b"),
                                                                                 "id": "c1"})
        return "boss done"

    def researcher(messages: list[dict[str, Any]]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("clerk", input="x"), "id": "k0"})
        return "researcher done"

    clerk = Agent(name="clerk", model=ScriptedModel(lambda m: "clerk done"))
    r = Agent(name="researcher", model=ScriptedModel(researcher), tools=[clerk.as_tool(description="C.")])
    app = App(storage=storage, scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)), provenance=False,
              agents=[Agent(name="boss", model=ScriptedModel(boss), tools=[r.as_tool(description="R.")])])
    app.run_agent("boss", job_id="fam", user="go")
    app.drain()
    assert app.get("fam").status is JobStatus.COMPLETE
    return app


FAMILY = ["fam", "fam:c:c0", "fam:c:c1", "fam:c:c0:c:k0", "fam:c:c1:c:k0"]


def test_deleting_a_job_deletes_its_child_runs_all_the_way_down(storage: Any) -> None:
    # Its finished child runs stayed, each naming a parent that no longer existed, for ever without retention.
    app = family_app(storage)
    assert all(app.get(j).status is JobStatus.COMPLETE for j in FAMILY)
    app.run_agent("clerk", job_id="other", user="not of the family")
    app.drain()
    app.delete("fam")
    assert {j: stored_keys(storage, j) for j in FAMILY} == {j: [] for j in FAMILY}
    assert [r.job_id for r in storage.list_jobs()] == ["other"]


def test_a_job_whose_child_run_is_running_is_not_deleted_nor_any_of_its_family(storage: Any) -> None:
    app = family_app(storage)
    app.run_agent("clerk", job_id="fam:c:c1:c:k0", user="again")  # its parent read it: anyone's to run again
    with pytest.raises(JobConflictError, match="child run 'fam:c:c1:c:k0' that is running; cancel it"):
        app.delete("fam")
    assert all(app.get(j) is not None for j in FAMILY)
    app.drain()
    app.delete("fam")
    assert all(app.get(j) is None for j in FAMILY)


@pytest.mark.parametrize("dies_at", ["fam:c:c0", "fam"])
def test_a_delete_that_dies_midway_through_a_family_is_finished_by_the_next(
        storage: Any, monkeypatch: pytest.MonkeyPatch, dies_at: str) -> None:
    # Children first, the job last: a process that dies midway never leaves children without the job that
    # names them, so deleting the job again finds and deletes the rest.
    app = family_app(storage)
    real = storage.delete_job

    def dying(job_id: str, **kwargs: Any) -> bool:
        if job_id == dies_at:
            raise SimulatedCrash(f"the process dies deleting {job_id}")
        return bool(real(job_id, **kwargs))

    monkeypatch.setattr(storage, "delete_job", dying)
    with pytest.raises(SimulatedCrash):
        app.delete("fam")
    monkeypatch.setattr(storage, "delete_job", real)
    assert app.get("fam") is not None and app.get("fam:c:c1:c:k0") is None  # a grandchild went first
    app.delete("fam")
    assert {j: stored_keys(storage, j) for j in FAMILY} == {j: [] for j in FAMILY}


def test_gc_removes_only_finished_jobs_older_than_the_cutoff(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    app, _ = make_app(storage, clock)
    finished(app, "old")
    app.run_agent("bot", job_id="old-failed", messages=["count"])
    app.cancel("old-failed", force=True)
    app.run_agent("bot", job_id="old-paused", messages=["count"])
    app.pause("old-paused")
    app.run_agent("bot", job_id="old-running", messages=["count"])  # never drained: stays running
    clock.advance(500)
    finished(app, "young")
    assert sorted(app.gc(older_than=400)) == ["old", "old-failed"]
    assert app.get("old") is None and app.get("old-failed") is None
    for kept in ("young", "old-paused", "old-running"):
        assert app.get(kept) is not None
    with pytest.raises(ConfigurationError, match="gc needs older_than"):
        app.gc()



def test_gc_goes_on_past_a_job_it_cannot_delete_now(storage: Any, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # One job's delete failing (its blob store down, say) never keeps the others from being deleted.
    from pipelines.engine.errors import StorageUnavailableError

    clock = VirtualClock(start=1_000_000.0)
    app, _ = make_app(storage, clock)
    for job_id in ("a", "b", "c"):
        finished(app, job_id)
    clock.advance(500)
    real = storage.delete_job

    def failing(job_id: str, **kwargs: Any) -> Any:
        if job_id == "b":
            raise StorageUnavailableError("the blob store is down")
        return real(job_id, **kwargs)

    monkeypatch.setattr(storage, "delete_job", failing)
    assert sorted(app.gc(older_than=400)) == ["a", "c"]
    assert app.get("b") is not None and "job b not deleted: the blob store is down" in caplog.text
    monkeypatch.setattr(storage, "delete_job", real)
    assert app.gc(older_than=400) == ["b"]  # a later sweep deletes it

def test_a_restarted_job_leaves_the_finished_index(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    app, _ = make_app(storage, clock)
    app.run_agent("bot", job_id="j", messages=["count"])
    app.cancel("j", force=True)
    assert storage.finished_jobs(clock()) == ["j"]
    app.retry("j")
    assert storage.finished_jobs(clock()) == []
    clock.advance(1000)
    assert app.gc(older_than=10) == [] and app.get("j").status is JobStatus.RUNNING


def test_retention_on_the_app_is_applied_by_the_sweeps(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    scheduler = MemoryScheduler(clock=clock)
    app = App(storage=storage, scheduler=scheduler, retention=3600,
              agents=[Agent(name="bot", model=ScriptedModel(answer), tools=[add])])
    app.run_agent("bot", job_id="a", messages=["count"])
    app.drain()
    app.advance_due()
    assert app.get("a") is not None  # not old enough yet
    clock.advance(3601)
    app.requeue_overdue(grace=0)
    assert app.get("a") is None and stored_keys(storage, "a") == []


def test_gc_scan_finds_jobs_the_index_does_not_know(storage: Any) -> None:
    clock = VirtualClock(start=1_000_000.0)
    app, _ = make_app(storage, clock)
    finished(app, "legacy")
    if isinstance(storage, MemoryStorage):
        storage._finished.clear()
    else:
        storage.client.delete(storage.finished_key)  # as a job finished before the index existed
    clock.advance(100)
    assert app.gc(older_than=10) == []
    assert app.gc(older_than=10, scan=True) == ["legacy"] and stored_keys(storage, "legacy") == []


def test_bad_retention_values_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="retention must be a finite number of seconds"):
        App(storage=MemoryStorage(), scheduler=MemoryScheduler(), retention=-1)
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler())
    with pytest.raises(InvalidInputError, match="older_than must be"):
        app.gc(float("nan"))
