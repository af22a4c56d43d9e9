"""The phase runner's semantics on the memory adapters (issue 2)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.base import Feature
from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Done, Fail, JobStatus, Next, Phase, PhaseContext, RetryLater, advance_phase, run_pipeline
from pipelines.engine.errors import (
    InvalidJobIdError,
    InvalidPipelineError,
    JobConflictError,
    StaleVersionError,
    StateNotSerializableError,
    StorageUnavailableError,
)
from pipelines.engine.models import Commit
from pipelines.engine.runner import AdvanceResult, try_advance
from tests.unit.helpers import Crash, memory


def counting_phases(log: list[str]) -> list[Phase]:
    def a(ctx: PhaseContext[Any]) -> Next:
        log.append("a")
        return Next("b", state={"n": ctx.state["n"] + 1})

    def b(ctx: PhaseContext[Any]) -> Next:
        log.append("b")
        return Next("c", state={"n": ctx.state["n"] * 10})

    def c(ctx: PhaseContext[Any]) -> Done:
        log.append("c")
        ctx.log("finishing")
        return Done(result={"n": ctx.state["n"]})

    return [Phase("a", a), Phase("b", b), Phase("c", c)]


def start(storage: MemoryStorage, scheduler: MemoryScheduler, phases: list[Phase], **kw: Any) -> None:
    run_pipeline(job_id=kw.pop("job_id", "job-1"), phases=phases, storage=storage, scheduler=scheduler, **kw)


def test_phases_run_in_order_and_done_completes_the_job() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    start(storage, scheduler, counting_phases(seen), initial_state={"n": 1})
    scheduler.drain()
    job = storage.get_job("job-1")
    assert seen == ["a", "b", "c"]
    assert job is not None and job.status is JobStatus.COMPLETE
    assert job.checkpoint is None
    assert job.result == {"n": 20}
    assert job.status == "complete"  # str enum: lower-case values
    assert [e.message for e in storage.logs("job-1")][-2:] == ["finishing", "job complete"]
    assert storage.logs("job-1")[-2].phase == "c"


def test_run_pipeline_only_writes_and_enqueues() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    start(storage, scheduler, counting_phases(seen), initial_state={"n": 1})
    job = storage.get_job("job-1")
    assert seen == []
    assert job is not None and job.status is JobStatus.RUNNING
    assert job.checkpoint is not None and job.checkpoint.next_phase == "a"
    assert scheduler.pending() == 1


def test_a_phase_that_raises_ends_in_error_and_keeps_the_last_checkpoint() -> None:
    storage, scheduler, _ = memory()

    def boom(ctx: PhaseContext[Any]) -> Next:
        raise RuntimeError("disk on fire")

    phases = [Phase("a", lambda ctx: Next("b", state={"k": 1})), Phase("b", boom)]
    start(storage, scheduler, phases, initial_state={"k": 0})
    scheduler.drain()  # must not raise
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error == "RuntimeError: disk on fire"
    assert job.checkpoint is not None
    assert job.checkpoint.next_phase == "b" and job.checkpoint.state == {"k": 1}
    assert storage.logs("job-1")[-1].level == "error"


def test_fail_outcome_ends_in_error_with_its_message() -> None:
    storage, scheduler, _ = memory()
    start(storage, scheduler, [Phase("a", lambda ctx: Fail("card declined"))])
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR and job.error == "card declined"


def test_resume_continues_from_the_checkpoint_and_full_restarts() -> None:
    storage, scheduler, _ = memory()
    ran: list[str] = []
    broken = {"b": True}

    def a(ctx: PhaseContext[Any]) -> Next:
        ran.append("a")
        return Next("b", state={"n": ctx.state["n"] + 1})

    def b(ctx: PhaseContext[Any]) -> Done:
        ran.append("b")
        if broken["b"]:
            raise ValueError("flaky")
        return Done(result=ctx.state)

    phases = [Phase("a", a), Phase("b", b)]
    start(storage, scheduler, phases, initial_state={"n": 0})
    scheduler.drain()
    assert ran == ["a", "b"]
    broken["b"] = False
    start(storage, scheduler, phases)  # default for an errored job with a checkpoint: resume
    scheduler.drain()
    assert ran == ["a", "b", "b"]
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == {"n": 1}

    start(storage, scheduler, phases, retry_mode="full", initial_state={"n": 5})
    scheduler.drain()
    assert ran == ["a", "b", "b", "a", "b"]
    job = storage.get_job("job-1")
    assert job is not None and job.result == {"n": 6}


def test_retrying_a_running_job_is_a_conflict() -> None:
    storage, scheduler, _ = memory()
    phases = [Phase("a", lambda ctx: Done())]
    start(storage, scheduler, phases)
    with pytest.raises(JobConflictError, match="running"):
        start(storage, scheduler, phases)


def test_unknown_next_phase_ends_in_error_naming_it() -> None:
    storage, scheduler, _ = memory()
    start(storage, scheduler, [Phase("a", lambda ctx: Next("nowhere"))])
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "'nowhere'" in job.error


def test_advance_is_idempotent_three_calls_run_the_phase_once() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    phases = counting_phases(seen)
    start(storage, scheduler, phases, initial_state={"n": 1})
    for _ in range(3):
        advance_phase(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler)
    assert seen == ["a", "b", "c"]  # each call found the job due at the next phase
    # Now the job is complete: further calls are no-ops.
    for _ in range(3):
        assert try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler) is (
            AdvanceResult.NOT_RUNNING
        )
    assert seen == ["a", "b", "c"]
    assert try_advance(job_id="nope", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.UNKNOWN


def test_duplicate_deliveries_of_one_step_run_it_once() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    phases = counting_phases(seen)
    start(storage, scheduler, phases, initial_state={"n": 1})
    scheduler.schedule_advance("job-1")
    scheduler.schedule_advance("job-1")  # the queue delivered the same message 3 times
    scheduler.drain()
    assert seen == ["a", "b", "c"]


def test_a_leased_job_is_not_advanced_by_a_second_caller() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    phases = counting_phases(seen)
    start(storage, scheduler, phases, initial_state={"n": 1})
    assert storage.acquire_lease("job-1", "someone-else", 30) is not None
    assert try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.BUSY
    assert seen == []


def test_expired_lease_lets_another_take_over_and_the_stale_commit_is_rejected(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="pipelines")
    storage, scheduler, clock = memory()
    started = threading.Event()
    proceed = threading.Event()
    seen: list[str] = []

    def slow(ctx: PhaseContext[Any]) -> Next:
        seen.append(f"slow v{ctx.version}")
        if len(seen) == 1:
            started.set()
            proceed.wait(5)
        return Next("end", state={"by": len(seen)})

    phases = [Phase("slow", slow), Phase("end", lambda ctx: Done(result=ctx.state))]
    start(storage, scheduler, phases)
    results: list[AdvanceResult] = []
    first = threading.Thread(
        target=lambda: results.append(
            try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler, lease_seconds=1)
        )
    )
    first.start()
    assert started.wait(5)
    clock.advance(2)  # the first worker's lease expires while it is stuck
    second = try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler, lease_seconds=1)
    assert second is AdvanceResult.ADVANCED
    proceed.set()
    first.join(5)
    assert results == [AdvanceResult.STALE]
    # Said where a worker's log shows it (INFO is not): the stalled worker's turn was thrown away.
    (said,) = [r for r in caplog.records if "fenced off" in r.getMessage()]
    assert said.levelno == logging.WARNING and "job-1" in said.getMessage() and "discarded" in said.getMessage()
    job = storage.get_job("job-1")
    assert job is not None and job.checkpoint is not None
    assert job.checkpoint.next_phase == "end" and job.checkpoint.state == {"by": 2}
    assert job.version == 2  # only one commit landed


def test_a_commit_based_on_a_stale_version_is_rejected_and_changes_nothing() -> None:
    storage, scheduler, _ = memory()
    start(storage, scheduler, [Phase("a", lambda ctx: Done())])
    base = storage.get_job("job-1")
    assert base is not None
    # Two advances interleaved by hand: both read version 1, both try to commit.
    first = base.model_copy(update={"version": 2, "result": "first"})
    second = base.model_copy(update={"version": 2, "result": "second"})
    storage.commit(Commit(job_id="job-1", expected_version=1, token="t1", record=first,
                          append_messages=[{"role": "assistant", "content": "one"}]))
    with pytest.raises(StaleVersionError):
        storage.commit(Commit(job_id="job-1", expected_version=1, token="t2", record=second,
                              append_messages=[{"role": "assistant", "content": "two"}]))
    job = storage.get_job("job-1")
    assert job is not None and job.result == "first"
    assert storage.messages("job-1") == [{"role": "assistant", "content": "one"}]


def test_step_results_survive_a_crash_and_are_not_recomputed() -> None:
    storage, scheduler, _ = memory()
    calls = {"charge": 0, "email": 0}
    crash = {"armed": True}

    def pay(ctx: PhaseContext[Any]) -> Done:
        def charge() -> dict[str, str]:
            calls["charge"] += 1
            return {"receipt": "r-1"}

        receipt = ctx.step("charge", charge)
        if crash["armed"]:
            crash["armed"] = False
            raise Crash()  # the process dies between the two steps
        ctx.step("email", lambda: calls.__setitem__("email", calls["email"] + 1))
        return Done(result=receipt)

    phases = [Phase("pay", pay)]
    start(storage, scheduler, phases)
    with pytest.raises(Crash):
        scheduler.run_next()
    assert storage.get_job("job-1").checkpoint.journal == {"charge": {"receipt": "r-1"}}  # type: ignore[union-attr]
    advance_phase(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler)
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == {"receipt": "r-1"}
    assert calls == {"charge": 1, "email": 1}


def test_step_returns_the_json_form_on_first_run_and_on_replay() -> None:
    storage, scheduler, _ = memory()

    class Quote(BaseModel):
        price: int

    got: list[Any] = []

    def quote(ctx: PhaseContext[Any]) -> Done:
        got.append(ctx.step("q", lambda: Quote(price=3)))
        return Done()

    start(storage, scheduler, [Phase("q", quote)])
    scheduler.drain()
    assert got == [{"price": 3}]


def test_save_state_mid_phase_is_where_a_crash_resumes() -> None:
    storage, scheduler, _ = memory()
    seen: list[Any] = []

    def work(ctx: PhaseContext[Any]) -> Done:
        seen.append(ctx.state)
        if ctx.state["page"] == 0:
            ctx.save_state({"page": 1})
            raise Crash()
        return Done(result=ctx.state)

    phases = [Phase("work", work)]
    start(storage, scheduler, phases, initial_state={"page": 0})
    with pytest.raises(Crash):
        scheduler.run_next()
    advance_phase(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler)
    assert seen == [{"page": 0}, {"page": 1}]
    assert storage.get_job("job-1").result == {"page": 1}  # type: ignore[union-attr]


def test_delays_follow_the_virtual_clock_and_nothing_runs_early() -> None:
    storage, scheduler, clock = memory()
    times: list[float] = []
    t0 = clock()

    def tick(ctx: PhaseContext[Any]) -> Next | Done:
        times.append(clock() - t0)
        return Next("tick", state=ctx.state + 1, delay=30.0) if ctx.state < 2 else Done()

    phases = [Phase("tick", tick)]
    start(storage, scheduler, phases, initial_state=0)
    assert scheduler.run_next()
    # Due in 30 s: a direct early call is a no-op.
    assert try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.NOT_DUE
    assert scheduler.run_due() == 0
    clock.advance(29.9)
    assert scheduler.run_due() == 0 and times == [0.0]
    scheduler.drain()  # no sleeping: the clock jumps
    assert times == [0.0, 30.0, 60.0]


def test_a_delivery_a_little_early_is_held_until_its_time_not_run_early() -> None:
    # A queue that may deliver a delayed message up to a second early (RQ's whole seconds, two machines'
    # clocks) declares it as its precision: such a message waits for its time, it does not run early.
    import time

    class EarlyQueue(MemoryScheduler):
        precision = 1.0

        def now(self) -> float:
            return time.time()

    storage, scheduler = MemoryStorage(clock=time.time), EarlyQueue()
    ran: list[float] = []

    def b(ctx: PhaseContext[Any]) -> Done:
        ran.append(time.time())
        return Done()

    phases = [Phase("a", lambda ctx: Next("b", delay=0.4)), Phase("b", b)]
    start(storage, scheduler, phases)
    assert scheduler.run_next()
    job = storage.get_job("job-1")
    assert job is not None and job.checkpoint is not None
    due = job.checkpoint.due_at
    try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler)  # ~0.4 s early
    assert len(ran) == 1 and ran[0] >= due
    assert storage.get_job("job-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_a_delivery_early_by_more_than_a_second_is_sent_again_for_its_time_not_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A scheduler may declare a large precision (Celery's is settable up to a minute): a worker is not kept
    # idle that long under the lease; the advance is sent again for the time left.
    import time

    class VeryEarlyQueue(MemoryScheduler):
        precision = 30.0

        def now(self) -> float:
            return time.time()

    import pipelines.engine.runner.turn as turn_module

    slept: list[float] = []
    monkeypatch.setattr(turn_module.time, "sleep", slept.append)
    storage, scheduler = MemoryStorage(clock=time.time), VeryEarlyQueue()
    phases = [Phase("a", lambda ctx: Next("b", delay=20.0)), Phase("b", lambda ctx: Done())]
    start(storage, scheduler, phases)
    assert scheduler.run_next()
    sent = scheduler.scheduled
    assert try_advance(job_id="job-1", phases=phases, storage=storage, scheduler=scheduler) is AdvanceResult.NOT_DUE
    assert slept == []  # not held for ~20 s
    assert storage.get_job("job-1").checkpoint.next_phase == "b"  # type: ignore[union-attr]  # nothing ran
    assert scheduler.scheduled == sent + 1  # sent again for its time


def test_state_that_is_not_json_is_an_error_at_the_commit_with_nothing_half_written() -> None:
    storage, scheduler, _ = memory()

    def a(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "should not land"}])
        return Next("b", state={"when": object()})

    start(storage, scheduler, [Phase("a", a), Phase("b", lambda ctx: Done())], initial_state={"ok": True})
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "not JSON-serialisable" in job.error
    assert job.checkpoint is not None and job.checkpoint.state == {"ok": True}
    assert storage.messages("job-1") == []


def test_tuples_and_int_keys_are_rejected_rather_than_silently_changed() -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(StateNotSerializableError, match="round trip"):
        start(storage, scheduler, [Phase("a", lambda ctx: Done())], initial_state={1: "x"})
    assert storage.get_job("job-1") is None


def test_pydantic_state_models_round_trip_and_validate() -> None:
    storage, scheduler, _ = memory()

    class Cart(BaseModel):
        items: list[str]

    seen: list[Any] = []

    def add(ctx: PhaseContext[Cart]) -> Next | Done:
        seen.append(ctx.state)
        cart = ctx.state
        if len(cart.items) < 2:
            return Next("add", state=Cart(items=[*cart.items, "x"]))
        return Done(result=cart)

    start(storage, scheduler, [Phase("add", add, state_model=Cart)], initial_state=Cart(items=[]))
    scheduler.drain()
    assert all(isinstance(s, Cart) for s in seen)
    assert storage.get_job("job-1").result == {"items": ["x", "x"]}  # type: ignore[union-attr]


def test_stored_state_that_no_longer_validates_fails_the_job_clearly() -> None:
    storage, scheduler, _ = memory()

    class V2(BaseModel):
        count: int

    # Started by code whose phase took any state; the phase of the code that runs it now reads a V2.
    start(storage, scheduler, [Phase("a", lambda ctx: Done())], initial_state={"old": "shape"})
    advance_phase(job_id="job-1", phases=[Phase("a", lambda ctx: Done(), state_model=V2)], storage=storage,
                  scheduler=scheduler)
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "does not validate against V2" in job.error


def test_async_phases_run_on_the_runner_loop() -> None:
    storage, scheduler, _ = memory()

    async def fetch(ctx: PhaseContext[Any]) -> Done:
        value = await ctx.astep("fetch", _async_value)
        return Done(result=value)

    start(storage, scheduler, [Phase("fetch", fetch)])
    scheduler.drain()
    assert storage.get_job("job-1").result == 42  # type: ignore[union-attr]


async def _async_value() -> int:
    return 42


def test_retry_later_reruns_the_same_phase_after_the_delay_keeping_steps() -> None:
    storage, scheduler, clock = memory()
    calls = {"prep": 0, "runs": 0}
    t0 = clock()
    times: list[float] = []

    def flaky(ctx: PhaseContext[Any]) -> Done:
        ctx.step("prep", lambda: calls.__setitem__("prep", calls["prep"] + 1))
        calls["runs"] += 1
        times.append(clock() - t0)
        if calls["runs"] == 1:
            raise RetryLater(12.0, "rate limited")
        return Done()

    start(storage, scheduler, [Phase("flaky", flaky)])
    scheduler.drain()
    assert calls == {"prep": 1, "runs": 2}
    assert times == [0.0, 12.0]
    assert storage.get_job("job-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_many_threads_advancing_many_jobs_commit_each_step_once() -> None:
    storage, scheduler, _ = memory()
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        with lock:
            key = f"{ctx.job_id}:{ctx.state}"
            counts[key] = counts.get(key, 0) + 1
        return Next("step", state=ctx.state + 1) if ctx.state < 4 else Done()

    phases = [Phase("step", step)]
    ids = [f"j{i}" for i in range(20)]
    for jid in ids:
        run_pipeline(job_id=jid, phases=phases, storage=storage, scheduler=scheduler, initial_state=0)

    def hammer() -> None:
        for _ in range(10):
            for jid in ids:
                advance_phase(job_id=jid, phases=phases, storage=storage, scheduler=scheduler)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    scheduler.drain()
    assert all(storage.get_job(j).status is JobStatus.COMPLETE for j in ids)  # type: ignore[union-attr]
    assert set(counts.values()) == {1}, "a step ran twice"
    assert len(counts) == 20 * 5


@pytest.mark.parametrize("bad", ["", "a" * 201, "has space", "{x}", "x}", "line\nbreak", "\uff4aob", "j\u043eb"])
def test_invalid_job_ids_are_rejected_before_anything_is_written(bad: str) -> None:
    storage, scheduler, _ = memory()
    with pytest.raises(InvalidJobIdError):
        run_pipeline(job_id=bad, phases=[Phase("a", lambda ctx: Done())], storage=storage, scheduler=scheduler)
    assert storage.list_jobs() == [] and scheduler.pending() == 0


def test_bad_pipelines_are_rejected_with_a_clear_error() -> None:
    storage, scheduler, _ = memory()
    p = Phase("a", lambda ctx: Done())
    with pytest.raises(InvalidPipelineError, match="at least one phase"):
        run_pipeline(job_id="j", phases=[], storage=storage, scheduler=scheduler)
    with pytest.raises(InvalidPipelineError, match="duplicate phase name 'a'"):
        run_pipeline(job_id="j", phases=[p, p], storage=storage, scheduler=scheduler)
    with pytest.raises(InvalidPipelineError, match="unknown initial_phase 'z'"):
        run_pipeline(job_id="j", phases=[p], storage=storage, scheduler=scheduler, initial_phase="z")
    with pytest.raises(StateNotSerializableError):
        run_pipeline(job_id="j", phases=[p], storage=storage, scheduler=scheduler, initial_state={"s": {1, 2}})
    assert storage.list_jobs() == [] and scheduler.pending() == 0


def test_initial_phase_starts_the_job_there() -> None:
    storage, scheduler, _ = memory()
    seen: list[str] = []
    start(storage, scheduler, counting_phases(seen), initial_state={"n": 2}, initial_phase="b")
    scheduler.drain()
    assert seen == ["b", "c"]


def test_a_retried_commit_whose_reply_was_lost_is_recognised_as_applied() -> None:
    storage, scheduler, _ = memory()
    start(storage, scheduler, [Phase("a", lambda ctx: Done())])
    base = storage.get_job("job-1")
    assert base is not None
    commit = Commit(job_id="job-1", expected_version=1, token=uuid.uuid4().hex,
                    record=base.model_copy(update={"version": 2}),
                    append_messages=[{"role": "user", "content": "once"}])
    storage.commit(commit)
    storage.commit(commit)  # the client retried: no error, no second append
    assert storage.messages("job-1") == [{"role": "user", "content": "once"}]


def test_a_forked_child_can_run_phases_even_if_the_parent_held_the_lease_keeper_lock() -> None:
    import os

    from pipelines.engine.leases import LEASE_KEEPER

    storage, scheduler, _ = memory()
    start(storage, scheduler, [Phase("a", lambda ctx: Done(result="child"))])
    with LEASE_KEEPER._lock:  # a fork taken while another thread holds the lock
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                advance_phase(job_id="job-1", phases=[Phase("a", lambda ctx: Done(result="child"))],
                              storage=storage, scheduler=scheduler)
                code = 0 if storage.get_job("job-1").result == "child" else 2  # type: ignore[union-attr]
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_continue_for_runs_due_phases_inline_under_one_lease_then_hands_back() -> None:
    from pipelines import App

    storage, scheduler, _ = memory()
    seen: list[int] = []

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        seen.append(ctx.state)
        if ctx.state == 3:
            return Next("step", state=ctx.state + 1, delay=10.0)  # not due at once: back to the queue
        return Next("step", state=ctx.state + 1) if ctx.state < 5 else Done(result=ctx.state)

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("step", step)]}, continue_for=60.0)
    app.run_pipeline("p", job_id="job-1", initial_state=0)
    assert scheduler.run_next()
    assert seen == [0, 1, 2, 3]  # one queue message, four phases
    job = storage.get_job("job-1")
    assert job is not None and job.version == 5  # each phase still committed on its own
    assert storage.lease_owner("job-1") is None and scheduler.pending() == 1
    scheduler.drain()
    assert seen == [0, 1, 2, 3, 4, 5] and storage.get_job("job-1").result == 5  # type: ignore[union-attr]


def test_a_phase_changing_its_state_in_place_leaves_the_earlier_turns_checkpoints_as_committed() -> None:
    from pipelines import App

    storage, scheduler, _ = memory()

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        ctx.state["items"].append(len(ctx.state["items"]))  # the same object, turn after turn (continue_for)
        return Next("step", state=ctx.state) if len(ctx.state["items"]) < 3 else Done(result=ctx.state)

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("step", step)]}, continue_for=60.0)
    app.run_pipeline("p", job_id="job-1", initial_state={"items": []})
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.result == {"items": [0, 1, 2]}
    # A fork at each turn starts from the state that turn committed, not from what the phase did later.
    assert [m.state for m in job.history] == [{"items": []}, {"items": [0]}, {"items": [0, 1]}, {"items": [0, 1, 2]}]


class ProbingScheduler(MemoryScheduler):
    """A memory scheduler that answers ``continue_for``'s question later, as RQ's does (a BacklogProbe)."""

    features = MemoryScheduler.features | {Feature.BACKLOG_PROBE}  # a subclass declares what it adds

    def __init__(self, log: list[str], waiting: bool = False, fails: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log, self.waiting, self.fails = log, waiting, fails

    def probe_work_waiting(self, priority: str | None = None) -> Any:
        self.log.append("asked")

        def answer() -> bool:
            self.log.append("answered")
            if self.fails:
                raise StorageUnavailableError("queue unreachable")
            return self.waiting

        return answer


def probing_app(log: list[str], step: Any, **kwargs: Any) -> tuple[Any, MemoryStorage, ProbingScheduler]:
    from pipelines import App

    storage, _, clock = memory()
    scheduler = ProbingScheduler(log, clock=clock, **kwargs)
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("step", step)]}, continue_for=60.0)
    return app, storage, scheduler


def test_continue_for_asks_the_queue_before_the_phase_and_reads_the_answer_at_its_commit() -> None:
    log: list[str] = []

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        log.append(f"phase {ctx.state}")
        return Next("step", state=ctx.state + 1) if ctx.state < 2 else Done()

    app, storage, scheduler = probing_app(log, step)
    app.run_pipeline("p", job_id="job-1", initial_state=0)
    assert scheduler.run_next()
    # One question per phase, its round trip overlapping the phase; nothing waited, so one message ran all three.
    assert log == ["asked", "phase 0", "answered", "asked", "phase 1", "answered", "asked", "phase 2", "answered"]
    assert storage.get_job("job-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


@pytest.mark.parametrize("answer", ["waiting", "unreachable"])
def test_continue_for_hands_the_job_back_when_the_answer_is_work_waiting_or_none(answer: str) -> None:
    log: list[str] = []

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        log.append(f"phase {ctx.state}")
        return Next("step", state=ctx.state + 1) if ctx.state < 2 else Done()

    app, storage, scheduler = probing_app(log, step, waiting=answer == "waiting", fails=answer == "unreachable")
    app.run_pipeline("p", job_id="job-1", initial_state=0)
    assert scheduler.run_next()
    assert log == ["asked", "phase 0", "answered"]
    assert storage.lease_owner("job-1") is None and scheduler.pending() == 1  # released and queued again


def test_a_question_asked_for_a_phase_that_raised_is_still_answered() -> None:
    log: list[str] = []

    def step(ctx: PhaseContext[Any]) -> Next:
        log.append("phase")
        raise Crash("the worker dies inside the phase")

    app, _, scheduler = probing_app(log, step)
    app.run_pipeline("p", job_id="job-1", initial_state=0)
    with pytest.raises(Crash):
        scheduler.run_next()
    assert log == ["asked", "phase", "answered"]  # RQ's question holds a connection until it is answered


def test_without_continue_for_each_advance_runs_one_phase() -> None:
    from pipelines import App

    storage, scheduler, _ = memory()
    seen: list[int] = []

    def step(ctx: PhaseContext[Any]) -> Next | Done:
        seen.append(ctx.state)
        return Next("step", state=ctx.state + 1) if ctx.state < 2 else Done()

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("step", step)]})
    app.run_pipeline("p", job_id="job-1", initial_state=0)
    scheduler.run_next()
    assert seen == [0] and scheduler.pending() == 1


def test_a_phase_can_wait_for_a_person_with_its_own_details() -> None:
    from pipelines import WaitForInput

    storage, scheduler, _ = memory()

    def ask(ctx: PhaseContext[Any]) -> Done:
        raise WaitForInput("need a signature", details={"reason": "shadowed", "form": "B-7"})

    start(storage, scheduler, [Phase("ask", ask)])
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.WAITING
    assert job.waiting == {"reason": "need a signature", "form": "B-7", "call_id": None}
    assert storage.events("job-1")[-1].data == {"reason": "need a signature", "form": "B-7"}


def test_the_details_of_a_wait_are_the_engines_own_copy_and_checked_where_the_phase_ends() -> None:
    # The record keeps them (waiting): a phase's code changing its dict afterwards changes nothing stored, and
    # what JSON cannot carry fails the job naming the wait, not a commit storage refused.
    from pipelines.engine.phase import Pipeline, WaitForInput

    details: dict[str, Any] = {"kind": "question", "options": ["yes", "no"]}
    asked = [WaitForInput("ask", details=details), WaitForInput("ask", details={"point": (1, 2)})]

    def only(ctx: PhaseContext[Any]) -> Done:
        raise asked.pop(0)

    storage, scheduler = MemoryStorage(), MemoryScheduler()
    pipeline = Pipeline(phases=[Phase("only", only)])
    for job_id in ("w1", "w2"):
        run_pipeline(job_id=job_id, phases=pipeline, storage=storage, scheduler=scheduler, initial_state={})
        advance_phase(job_id=job_id, phases=pipeline, storage=storage, scheduler=scheduler)
    record = storage.acquire_lease("w1", "someone", 30)  # the record a storage keeps, handed to a lease
    assert record is not None and record.waiting is not None
    details["options"].append("changed afterwards")
    assert record.waiting["options"] == ["yes", "no"]
    failed = storage.get_job("w2")
    assert failed is not None and failed.status is JobStatus.ERROR
    assert "details of the wait of phase 'only'" in (failed.error or "")


class _Unspeakable(Exception):  # noqa: N818 - named for what it does
    def __str__(self) -> str:
        raise RuntimeError("no words")


def test_a_phase_raising_an_exception_whose_message_cannot_be_read_fails_its_job_saying_so() -> None:
    # describe() read str(exc) bare: the RuntimeError escaped the runner and the job stayed running for ever.
    storage, scheduler, _ = memory()

    def speechless(ctx: PhaseContext[Any]) -> Done:
        raise _Unspeakable

    start(storage, scheduler, [Phase("a", speechless)])
    scheduler.drain()
    job = storage.get_job("job-1")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error == "_Unspeakable: (its message could not be read: RuntimeError)"
