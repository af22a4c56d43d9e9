"""Flow control on the memory twin: rate limits, concurrency keys, priorities (issue 15)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.base import Feature
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.memory.flow import MemoryFlowStore
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError, TransientModelError
from pipelines.engine.flow import LINE_SECONDS, RateLimit
from pipelines.engine.models import JobStatus
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply


class NamedModel(ScriptedModel):
    """A scripted model with a name a RateLimit can match; records when (virtual time) each call happened."""

    model = "scripted/w"

    def __init__(self, clock: VirtualClock, turns: int = 1, fail_first: float | None = None) -> None:
        super().__init__(self.answer)
        self.clock = clock
        self.turns = turns
        self.at: list[float] = []
        self.jobs: list[str] = []  # job ids in the order their model calls ran
        self.fail_first = fail_first

    def answer(self, messages: list[Any]) -> Any:
        done = sum(1 for m in messages if m.get("role") == "tool")
        return reply("done") if done + 1 >= self.turns else reply("step", call("add", a=done, b=1))

    def complete(self, request: ModelRequest) -> ModelResponse:
        if self.fail_first is not None:
            retry_after, self.fail_first = self.fail_first, None
            raise TransientModelError("429 rate limited", retry_after=retry_after)
        self.at.append(self.clock())
        self.jobs.append(request.job_id)
        return super().complete(request)


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def make_app(model: NamedModel, clock: VirtualClock, **flow: Any) -> App:
    storage = MemoryStorage(clock=clock)
    scheduler = MemoryScheduler(clock=clock)
    agent = Agent(name="w", model=model, tools=[add], stream=False)
    return App(storage=storage, scheduler=scheduler, agents=[agent], provenance=False, **flow)


def test_rate_limit_spaces_model_calls_across_jobs_and_spends_no_attempt() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, turns=2)
    app = make_app(model, clock, rate_limits=[RateLimit(model="scripted/w", rpm=60)])
    for i in range(4):
        app.run_agent("w", job_id=f"j{i}", user="go")
    app.drain()
    assert all(app.get(f"j{i}").status is JobStatus.COMPLETE for i in range(4))  # type: ignore[union-attr]
    gaps = [b - a for a, b in zip(model.at, model.at[1:], strict=False)]
    assert len(model.at) == 8 and min(gaps) >= 1.0 - 1e-6  # 60 rpm, burst 1 s: one call a second
    for i in range(4):
        record = app.storage.get_job(f"j{i}")
        assert record is not None and record.checkpoint is None
        events = [e.type for e in app.events(f"j{i}")]
        assert "retry_scheduled" not in events  # a deferral commits nothing: no attempt, no version


def test_a_turn_over_the_rate_limit_is_deferred_not_dropped() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock)
    app = make_app(model, clock, rate_limits=[RateLimit(model="scripted/w", rpm=6)])
    app.run_agent("w", job_id="a", user="go")
    app.run_agent("w", job_id="b", user="go")
    assert app.advance("a") is AdvanceResult.COMPLETED
    before = app.storage.get_job("b")
    assert app.advance("b") is AdvanceResult.DEFERRED
    after = app.storage.get_job("b")
    assert before is not None and after is not None and after.version == before.version
    assert after.status is JobStatus.RUNNING
    app.drain()  # the rescheduled advance runs once the bucket has refilled (10 s at 6 rpm)
    assert app.get("b").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert model.at[1] - model.at[0] >= 10.0 - 1e-6


def test_a_429_with_retry_after_blocks_the_model_for_every_job() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, fail_first=30.0)
    app = make_app(model, clock, rate_limits=[RateLimit(model="scripted/w", rpm=600)])
    app.run_agent("w", job_id="a", user="go")
    app.advance("a")  # the provider says 429, retry after 30 s
    app.run_agent("w", job_id="b", user="go")
    assert app.advance("b") is AdvanceResult.DEFERRED  # b never called the model: the budget is blocked
    app.drain()
    assert min(model.at) >= 1030.0 - 1e-6
    assert {app.get(j).status for j in "ab"} == {JobStatus.COMPLETE}  # type: ignore[union-attr]


def test_token_estimates_are_corrected_with_the_real_usage() -> None:
    store = MemoryFlowStore()
    limit = dict(rpm=None, tpm=600.0, burst=1.0)  # 10 tokens a second, bucket of 10
    assert store.take_rate("m", **limit, tokens=5, now=0.0) == 0.0  # type: ignore[arg-type]
    store.adjust_rate("m", 20)  # the call really used 25: the bucket is now 15 in debt
    wait = store.take_rate("m", **limit, tokens=5, now=0.0)  # type: ignore[arg-type]
    assert wait == pytest.approx((5 + 15) / 10.0)


def test_concurrency_key_holds_at_most_n_turns_and_reschedules_the_rest() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock)
    app = make_app(model, clock, concurrency={"tenant-": 2}, lease_seconds=10.0)
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore)
    # Two turns of the tenant are running elsewhere (another worker's slots).
    for other in ("x", "y"):
        assert store.take_slot("tenant-a", other, limit=2, ttl=15.0, now=clock()) == 0.0
    app.run_agent("w", job_id="c", user="go", concurrency_key="tenant-a")
    app.run_agent("w", job_id="d", user="go", concurrency_key="tenant-b")
    assert app.advance("c") is AdvanceResult.DEFERRED
    assert app.advance("d") is AdvanceResult.COMPLETED  # another key is not held back
    store.release_slot("tenant-a", "x")
    app.drain()
    assert app.get("c").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert store.slots("tenant-a", clock()) == ["y"]  # c gave its slot back after its turn


def test_a_dead_workers_slot_comes_back_when_its_lease_expires() -> None:
    clock = VirtualClock(1000.0)
    app = make_app(NamedModel(clock), clock, concurrency={"*": 1}, lease_seconds=10.0)
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore)
    store.take_slot("k", "dead-job", limit=1, ttl=15.0, now=clock())  # its worker was killed mid-turn
    app.run_agent("w", job_id="e", user="go", concurrency_key="k")
    app.drain()  # deferred until the dead slot's lease ran out, then run
    record = app.storage.get_job("e")
    assert record is not None and record.status is JobStatus.COMPLETE and record.updated_at >= 1015.0


def advance_during_the_first_turn(app: App, model: NamedModel, job_id: str) -> list[AdvanceResult]:
    """While the first model call runs (its job holds a slot), another worker takes ``job_id``'s advance: what
    that advance returned is appended to the list returned."""
    seen: list[AdvanceResult] = []
    original = model.answer

    def answer(messages: list[Any]) -> Any:
        if not seen:
            seen.append(app.advance(job_id))
        return original(messages)

    model._script = answer
    return seen


def test_a_busy_job_of_a_key_takes_turns_with_the_job_waiting_for_its_slot() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, turns=3)
    app = make_app(model, clock, concurrency={"k": 1})
    seen = advance_during_the_first_turn(app, model, "b")  # a's first turn holds the key's one slot
    app.run_agent("w", job_id="a", user="go", concurrency_key="k")
    app.run_agent("w", job_id="b", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.ADVANCED
    assert seen == [AdvanceResult.DEFERRED]
    # a's next turn is due at once, b's retry a moment later: a must not run all its turns first.
    app.drain()
    # While b waits in line, each of a's next turns asks behind it (and b is woken when a's slot frees);
    # once nothing waits (one drain runs one turn at a time), the order is the queue's.
    assert model.jobs[:4] == ["a", "b", "a", "b"] and sorted(model.jobs) == ["a"] * 3 + ["b"] * 3
    assert all(app.get(j).status is JobStatus.COMPLETE for j in "ab")  # type: ignore[union-attr]


def test_a_job_that_stops_asking_gives_up_its_place_in_the_line() -> None:
    store = MemoryFlowStore()
    assert store.take_slot("k", "a", limit=1, ttl=30.0, now=0.0) == 0.0
    assert store.take_slot("k", "gone", limit=1, ttl=30.0, now=1.0) > 0  # then deleted: it never asks again
    store.release_slot("k", "a")
    assert store.take_slot("k", "c", limit=1, ttl=30.0, now=2.0) > 0  # "gone" is ahead, for now
    assert store.line("k", 2.0) == ["gone", "c"]
    assert store.take_slot("k", "c", limit=1, ttl=30.0, now=1.0 + LINE_SECONDS) == 0.0  # its place lapsed
    assert store.line("k", 1.0 + LINE_SECONDS) == []


def test_concurrency_key_may_be_a_function_of_the_run() -> None:
    clock = VirtualClock(1000.0)
    app = make_app(NamedModel(clock), clock, concurrency={"*": 1})
    app.run_agent("w", job_id="org1-chat", user="go", concurrency_key=lambda job_id, options: job_id.split("-")[0])
    record = app.storage.get_job("org1-chat")
    assert record is not None and record.options["concurrency_key"] == "org1"


def test_interactive_runs_before_background_work_due_at_the_same_time() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock)
    app = make_app(model, clock)
    app.run_agent("w", job_id="batch", user="go", priority="background")
    app.run_agent("w", job_id="chat", user="go", priority="interactive")
    app.drain()
    assert model.jobs == ["chat", "batch"]


def test_continue_for_hands_a_job_back_when_other_work_waits() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, turns=3)
    app = make_app(model, clock)
    app.continue_for = 60.0
    app.run_agent("w", job_id="busy", user="go")
    app.run_agent("w", job_id="new", user="go")
    app.drain()
    assert model.jobs[:2] == ["busy", "new"]  # the new conversation's first turn did not wait for busy's three


def test_bad_flow_settings_are_refused_with_a_clear_error() -> None:
    with pytest.raises(InvalidInputError, match="rpm= or tpm="):
        RateLimit(model="m")
    with pytest.raises(InvalidInputError, match="rpm must be a positive"):
        RateLimit(model="m", rpm=0)
    clock = VirtualClock(1000.0)
    with pytest.raises(InvalidInputError, match="concurrency limit"):
        make_app(NamedModel(clock), clock, concurrency={"*": 0})
    app = make_app(NamedModel(clock), clock)
    with pytest.raises(InvalidInputError, match="priority"):
        app.run_agent("w", job_id="p", user="go", priority="urgent")
    assert app.storage.get_job("p") is None  # nothing written


def test_workers_take_background_work_at_least_once_in_n_takes_under_sustained_interactive_load() -> None:
    from rq import Queue

    from adapters.rq.priority import priority_order

    interactive, background = Queue.__new__(Queue), Queue.__new__(Queue)
    interactive.name, background.name = "q", "q-background"
    queues, streak, firsts = [interactive, background], 0, []
    order = list(queues)
    for _ in range(20):  # both queues always hold work: the worker takes from the first in its order
        taken = order[0]
        firsts.append(taken.name)
        order, streak = priority_order(queues, taken, streak, 5)
    assert firsts.count("q-background") == 4 and firsts[:5] == ["q", "q", "q", "q", "q-background"]


def test_the_low_level_advance_phase_goes_through_the_apps_flow_control_and_lease() -> None:
    from pipelines import advance_phase

    clock = VirtualClock(1000.0)
    model = NamedModel(clock)
    app = make_app(model, clock, concurrency={"*": 1}, lease_seconds=120.0)
    store = app.flow.store
    assert isinstance(store, MemoryFlowStore)
    store.take_slot("tenant-a", "other-job owner", limit=1, ttl=600.0, now=clock())  # the key is busy
    app.run_agent("w", job_id="j", user="hi", concurrency_key="tenant-a")
    advance_phase(job_id="j", phases=app.pipeline("w"), storage=app.storage, scheduler=app.scheduler)
    assert model.jobs == [] and app.get("j").status is JobStatus.RUNNING  # type: ignore[union-attr]
    store.release_slot("tenant-a", "other-job owner")
    clock.advance(1.0)
    advance_phase(job_id="j", phases=app.pipeline("w"), storage=app.storage, scheduler=app.scheduler)
    assert model.jobs == ["j"]


def test_the_job_woken_for_a_freed_slot_goes_to_its_own_prioritys_queue() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, turns=2)
    app = make_app(model, clock, concurrency={"k": 1})
    seen = advance_during_the_first_turn(app, model, "bg")  # the interactive job holds the slot
    app.run_agent("w", job_id="fg", user="go", concurrency_key="k")
    app.run_agent("w", job_id="bg", user="go", concurrency_key="k", priority="background")
    assert app.advance("fg") is AdvanceResult.ADVANCED and seen == [AdvanceResult.DEFERRED]
    scheduler = app.scheduler
    assert isinstance(scheduler, MemoryScheduler)
    woken = [(priority, job) for due, priority, job in scheduler.advances() if job == "bg" and due <= clock()]
    assert woken and all(priority == "background" for priority, _ in woken)  # not the interactive releaser's



def test_a_deferred_turn_is_due_for_the_sweep_only_once_its_retry_may_have_arrived() -> None:
    # A deferred turn's message has an id of its own, which the sweep's requeue cannot find: counted overdue
    # while that message may still come (RQ's come up to RQScheduler.lateness late), the job was sent a second
    # advance, and its deferral started a second chain of retries.
    class Late(MemoryScheduler):
        features = MemoryScheduler.features | {Feature.LATE_DELIVERY}

        def lateness(self) -> float:
            return 2.0

    clock = VirtualClock(1000.0)
    agent = Agent(name="w", model=NamedModel(clock), tools=[add], stream=False)
    app = App(storage=MemoryStorage(clock=clock), scheduler=Late(clock=clock), agents=[agent], provenance=False,
              concurrency={"k": 1})
    store = app.flow.store
    assert store is not None and store.take_slot("k", "elsewhere", limit=1, ttl=60.0, now=clock()) == 0.0
    app.run_agent("w", job_id="j", user="go", concurrency_key="k", priority="background")  # (its own queue's)
    assert app.advance("j") is AdvanceResult.DEFERRED  # retried in 0.5 s, first in line
    clock.advance(0.5 + 1.5)
    assert app.requeue_overdue(grace=1.0) == []  # its retry may still be on its way
    clock.advance(1.6)  # its retry's time + lateness + grace
    assert app.requeue_overdue(grace=1.0) == ["j"]  # lost, by now
