"""The one handle: App, RunHandle and JobView, typed state, per-run options, and the transition core."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from adapters.memory import MemoryStorage
from pipelines import Agent, App, Done, JobStatus, Next, Phase, PhaseContext, Pipeline, tool
from pipelines.engine import transitions
from pipelines.engine.errors import (
    ConfigurationError,
    InvalidInputError,
    JobConflictError,
    JobFailedError,
    JobNotFoundError,
    WaitTimeoutError,
)
from pipelines.engine.models import JobRecord
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory


class Counter(BaseModel):
    counter: int = 0


def bump(ctx: PhaseContext[Counter]) -> Next | Done:
    # A typed state: attribute access, no dict (issue: ctx.state.counter raised AttributeError).
    if ctx.state.counter >= 2:
        return Done(result={"counter": ctx.state.counter})
    return Next("bump", state=Counter(counter=ctx.state.counter + 1))


class Invoice(BaseModel):
    total: int


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: 42"


def app_with(*agents: Any, **kw: Any) -> tuple[App, Any]:
    storage, scheduler, clock = memory()
    app = App(storage=storage, scheduler=scheduler, agents=agents, **kw)
    return app, clock


def test_a_registered_agent_runs_by_name_and_the_handle_waits_for_its_result() -> None:
    model = ScriptedModel([reply(None, call("lookup", order="A-1")), "It costs 42."])
    app, _ = app_with(Agent(name="support", model=model, tools=[lookup]))
    run = app.run_agent("support", job_id="chat-1", messages=["how much is A-1?"])
    assert run.job_id == "chat-1" and run.get().status is JobStatus.RUNNING  # run_agent only writes
    view = run.wait(timeout=5)
    assert view.status is JobStatus.COMPLETE and view.result == "It costs 42."
    assert run.result() == "It costs 42." and view.usage.model_calls == 2
    assert [m["role"] for m in app.messages("chat-1")] == ["user", "assistant", "tool", "assistant"]
    assert app.events("chat-1")[0].type == "job_started" and app.logs("chat-1")
    assert app.get("nope") is None


def test_pipelines_declare_their_state_once_and_phases_and_get_see_it_typed() -> None:
    app, _ = app_with(pipelines={"count": Pipeline(phases=[Phase("bump", bump)], state=Counter)})
    view = app.run_pipeline("count", job_id="c1", initial_state=Counter()).wait(timeout=5)
    assert view.status is JobStatus.COMPLETE and view.result == {"counter": 2}
    app.run_pipeline("count", job_id="c2", initial_state=Counter(counter=5))
    app.drain()
    assert app.get("c2").result == {"counter": 5}


def test_a_pydantic_initial_state_without_a_declared_model_is_refused_with_what_to_do() -> None:
    app, _ = app_with(pipelines={"count": [Phase("bump", bump)]})
    with pytest.raises(InvalidInputError, match=r"declare it: Pipeline\(phases=\[\.\.\.\], state=Counter\)"):
        app.run_pipeline("count", job_id="c1", initial_state=Counter())
    assert app.get("c1") is None


def test_paused_waiting_state_is_typed_on_the_view() -> None:
    app, _ = app_with(pipelines={"count": Pipeline(phases=[Phase("bump", bump)], state=Counter)})
    app.run_pipeline("count", job_id="c1", initial_state=Counter())
    view = app.pause("c1", wait=0)
    assert view.status is JobStatus.PAUSED and isinstance(view.state, Counter) and view.state.counter == 0
    assert app.resume("c1").status is JobStatus.RUNNING


def test_per_run_options_travel_with_the_job_and_are_honoured() -> None:
    model = ScriptedModel(lambda msgs: reply(None, call("lookup", order="A")))
    app, _ = app_with(Agent(name="a", model=model, tools=[lookup], max_turns=10), schemas=[Invoice])
    app.run_agent("a", job_id="j", messages=["go"], max_turns=2)
    app.drain()
    job = app.get("j")
    assert job.record.options["max_turns"] == 2
    assert job.stop_reason == "max_turns" and len(model.calls) == 2


def test_a_per_run_output_schema_is_stored_by_name_and_the_result_comes_back_typed() -> None:
    app, _ = app_with(Agent(name="a", model=ScriptedModel(['{"total": 7}'])), schemas=[Invoice])
    run = app.run_agent("a", job_id="j", messages=["bill"], output_schema=Invoice)
    assert app.get("j").record.options["output_schema"] == "Invoice"
    assert run.result(timeout=5) == Invoice(total=7)


@pytest.mark.parametrize(("options", "message"), [
    ({"model_params": {"api_key": "sk-secret"}}, "unknown per-run option"),
    ({"tools": []}, "unknown per-run option"),
    ({"max_turns": 0}, "max_turns"),
    # Counts are ints within bounds: True is no count, and every number from outside is bounded.
    ({"max_turns": True}, "max_turns: Input should be a valid integer"),
    ({"max_turns": 10**30}, "max_turns: Input should be less than or equal to 1000000"),
    ({"max_tokens": 10**13}, "max_tokens: Input should be less than or equal to"),
    ({"max_retries": True}, "max_retries: Input should be a valid integer"),
    ({"stream_retries": 1000}, "stream_retries: Input should be less than or equal to 100"),
    ({"output_schema": Counter}, "not registered on the App"),
])
def test_per_run_options_that_cannot_travel_are_refused_and_nothing_is_written(options: dict[str, Any],
                                                                               message: str) -> None:
    app, _ = app_with(Agent(name="a", model=ScriptedModel(["hi"])))
    with pytest.raises((InvalidInputError, ConfigurationError), match=message):
        app.run_agent("a", job_id="j", messages=["x"], **options)
    assert app.get("j") is None


def test_every_control_returns_the_view_and_unknown_ids_raise_job_not_found() -> None:
    app, _ = app_with(Agent(name="a", model=ScriptedModel(["hi"])))
    for op in (app.cancel, app.pause, app.resume, app.retry, app.messages, app.logs, app.events):
        with pytest.raises(JobNotFoundError):
            op("nope")
    with pytest.raises(JobNotFoundError):
        app.approve("nope", "c1")
    app.run_agent("a", job_id="j", messages=["x"])
    view = app.cancel("j")
    assert view.status is JobStatus.CANCELLED and view.record.checkpoint is not None
    assert app.retry("j").status is JobStatus.RUNNING
    with pytest.raises(InvalidInputError, match="mode must be 'resume' or 'full'"):
        app.retry("j", mode="again")  # type: ignore[arg-type]


def test_wait_times_out_with_a_clear_error_and_result_of_a_failed_job_raises() -> None:
    storage, scheduler, _ = memory()

    def boom(ctx: PhaseContext[Any]) -> Done:
        raise RuntimeError("no")

    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("x", boom)], "slow": [
        Phase("s", lambda ctx: Next("s", delay=3600))]})
    with pytest.raises(JobFailedError, match="RuntimeError: no"):
        app.run_pipeline("p", job_id="f").result(timeout=5)
    scheduler.drop_all()
    run = app.run_pipeline("slow", job_id="s")
    scheduler.drop_all()  # nothing will advance it: the wait must give up, saying where the job is
    with pytest.raises(WaitTimeoutError, match="still running"):
        run.wait(timeout=0.05, poll=0.01)


@tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


def test_wait_on_an_in_process_run_waiting_for_a_person_says_so_at_once_naming_the_call_and_what_to_run() -> None:
    # It slept the whole timeout (60 s by default, under a scheduler the README calls a virtual clock) and then
    # said only "still waiting", and the CLI added "is a worker running?".
    storage, scheduler, _ = memory()
    agent = Agent(name="desk", model=ScriptedModel([reply(None, call("refund", order="A-1")), "done"]),
                  tools=[refund])
    app = App(storage=storage, scheduler=scheduler, agents=[agent])
    run = app.run_agent("desk", job_id="r", user="refund A-1")
    with pytest.raises(WaitTimeoutError) as raised:
        run.wait(timeout=3600)
    said = str(raised.value)
    assert raised.value.status == "waiting" and "still waiting now" in said
    assert "approve or reject 1 call(s): 'call_0_0' ('refund')" in said
    assert "app.approve('r', 'call_0_0')" in said and "`pipelines approve r call_0_0`" in said
    from pipelines.cli.errors import error_line
    assert "worker" not in error_line(raised.value)
    app.approve("r", "call_0_0")
    assert run.result(timeout=5) == "done"


def test_wait_on_an_in_process_run_that_is_paused_says_so_at_once() -> None:
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("x", lambda ctx: Done())]})
    run = app.run_pipeline("p", job_id="p")
    app.pause("p")
    with pytest.raises(WaitTimeoutError, match=r"still paused now .*app.resume\('p'\)") as raised:
        run.wait(timeout=3600)
    assert raised.value.status == "paused"
    app.resume("p")
    assert run.wait(timeout=5).status is JobStatus.COMPLETE


def test_drain_on_a_queue_scheduler_is_a_configuration_error() -> None:
    class QueueOnly:
        precision = 1.0

        def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                             version: int | None = None) -> None: ...

        def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None) -> None: ...

        def now(self) -> float:
            return 0.0

    app = App(storage=MemoryStorage(), scheduler=QueueOnly())
    with pytest.raises(ConfigurationError, match="in-process scheduler"):
        app.drain()


def test_the_low_level_layer_reuses_the_apps_settings_instead_of_replacing_them() -> None:
    from pipelines import run_pipeline

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, continue_for=30.0, lease_seconds=7.0)
    run = run_pipeline(job_id="j", phases=[Phase("bump", bump)], storage=storage, scheduler=scheduler,
                       initial_state=Counter(), state_model=Counter)
    assert run.app is app and app.continue_for == 30.0 and app.lease_seconds == 7.0
    assert scheduler.drain() == 1  # continue_for ran all three phases under one lease
    assert app.get("j").result == {"counter": 2}


def test_every_transition_moves_the_version_by_one_and_emits_its_event() -> None:
    record = transitions.create("j", pipeline="p", first="a", state=None, messages=[], options={}, now=1.0).record
    seen: dict[str, tuple[int, list[str]]] = {}

    def check(name: str, commit: Any, rec: JobRecord) -> JobRecord:
        assert commit.expected_version == rec.version and commit.record.version == rec.version + 1
        cp = commit.record.checkpoint
        assert cp is None or cp.commit_id == commit.token  # one token per commit, stamped on its checkpoint
        seen[name] = (commit.record.version, [e.type for e in commit.events])
        return commit.record

    paused = check("pause", transitions.pause(record, owner="o", now=2.0), record)
    resumed = check("resume", transitions.resume(paused, now=3.0), paused)
    cancelled = check("cancel", transitions.cancel(resumed, owner=None, now=4.0), resumed)
    check("retry", transitions.retry_resume(cancelled, now=5.0), cancelled)
    check("full", transitions.retry_full(cancelled, first="a", state=None, now=5.0), cancelled)
    assert {k: v[1] for k, v in seen.items()} == {
        "pause": ["job_paused"], "resume": ["job_resumed"], "cancel": ["job_cancelled"],
        "retry": ["job_retried"], "full": ["job_retried"]}
    with pytest.raises(JobConflictError):
        transitions.resume(resumed, now=6.0)


def test_a_structured_output_failure_counts_every_paid_call_and_a_resume_asks_again() -> None:
    model = ScriptedModel(["not json", "still not json", '{"total": 3}'])
    app, _ = app_with(Agent(name="a", model=model, output_schema=Invoice, tools=[lookup]))
    app.run_agent("a", job_id="j", messages=["bill"]).wait(timeout=5)
    failed = app.get("j")
    assert failed.status is JobStatus.ERROR and failed.usage.model_calls == 2  # both paid calls counted
    view = app.retry("j")
    assert view.status is JobStatus.RUNNING
    done = app.handle("j").wait(timeout=5)
    assert done.result == Invoice(total=3) and len(model.calls) == 3  # the follow-up was asked again
    assert done.usage.model_calls == 3  # the replayed first answer is not counted twice


def test_an_outcome_that_cannot_be_stored_ends_the_job_in_error_instead_of_leaving_it_due() -> None:
    def bad_state(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "fine"}])
        ctx.log("x\ud83d")  # a lone surrogate: only the commit finds out it cannot be stored
        return Next("bad")

    app, _ = app_with(pipelines={"p": [Phase("bad", bad_state)]})
    app.run_pipeline("p", job_id="j")
    app.drain()
    job = app.get("j")
    assert job.status is JobStatus.ERROR and "could not be committed" in (job.error or "")
    assert app.storage.due_jobs(1e12) == [] and app.messages("j") == []


def test_one_unreadable_due_record_never_stops_the_sweep_for_the_others() -> None:
    storage, scheduler, clock = memory()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": Pipeline([Phase("bump", bump)], state=Counter)})
    for job_id in ("a-bad", "b-good"):
        app.run_pipeline("p", job_id=job_id, initial_state=Counter())
    scheduler.drop_all()  # the queue lost both messages
    storage._jobs["a-bad"].record = "{not json"  # written by other software, say
    clock.advance(60)
    assert app.requeue_overdue(grace=1.0) == ["b-good"]
    results = dict(app.advance_due(grace=1.0))
    assert results["b-good"].value == "advanced" and results["a-bad"].value == "unreached"


# --- an App does not outlive what refers to it ----------------------------------------------------


class _QueueScheduler:
    """A queue scheduler's shape (no ``attach``): the App it belongs to lives only as long as its caller holds it."""

    precision = 0.001

    def __init__(self) -> None:
        self.sent: list[str] = []

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        self.sent.append(job_id)

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        self.sent.append(job_id)

    def now(self) -> float:
        import time

        return time.time()


def test_an_app_dropped_after_its_runs_is_freed_with_its_storage() -> None:
    # The registry of Apps by scheduler held each App strongly; an App holds its scheduler, so the weak key
    # never died: every App ever made, its storage and every job in it, stayed in memory for good.
    import gc
    import weakref

    def run_one() -> tuple[weakref.ref[Any], weakref.ref[Any]]:
        storage, scheduler, _ = memory()
        agent = Agent(name="a", model=ScriptedModel(["hi"]))
        agent.run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
        scheduler.drain()
        assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]
        return weakref.ref(storage), weakref.ref(App.for_adapters(storage, scheduler))

    storage_ref, app_ref = run_one()
    gc.collect()
    assert storage_ref() is None and app_ref() is None


def test_the_low_level_layer_finds_the_app_a_scheduler_belongs_to_while_it_lives() -> None:
    import gc

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, continue_for=5.0)
    assert App.for_adapters(storage, scheduler) is app
    del app
    gc.collect()
    # An in-process scheduler keeps its App alive itself: its settings are not lost behind the caller's back.
    app = App.for_adapters(storage, scheduler)
    assert app.continue_for == 5.0
    assert App.for_adapters(MemoryStorage(), scheduler) is not app  # another storage: not that App

    queue = _QueueScheduler()
    held = App(storage=storage, scheduler=queue, continue_for=5.0)  # type: ignore[arg-type]
    assert App.for_adapters(storage, queue) is held  # type: ignore[arg-type]
    del held
    gc.collect()
    assert App.for_adapters(storage, queue).continue_for == 0.0  # type: ignore[arg-type]  # a new App
    # ... and the low-level layer still writes and enqueues through it.
    Agent(name="a", model=ScriptedModel(["hi"])).run(job_id="q", messages=["go"], storage=storage,
                                                    scheduler=queue)  # type: ignore[arg-type]
    assert queue.sent == ["q"] and storage.get_job("q") is not None


def test_wait_with_the_local_schedulers_workers_waits_for_a_person_who_answers_from_another_thread(
        tmp_path: Any) -> None:
    # Its workers run the job meanwhile: wait() gave up at once ("an in-process scheduler runs nothing").
    import threading
    import time

    from adapters.local import LocalScheduler
    from adapters.sqlite import SQLiteStorage
    from pipelines.engine.phase import wait_for_input

    def review(ctx: PhaseContext[Any]) -> Done:
        return Done(result={"ok": wait_for_input(ctx, "manager_ok", "a manager approves")})

    app = App(storage=SQLiteStorage(str(tmp_path / "a.db")), scheduler=LocalScheduler(workers=1), provenance=False,
              pipelines={"refund": [Phase("review", review)]})
    with app.scheduler:  # type: ignore[attr-defined]
        run = app.run_pipeline("refund", job_id="r", initial_state={})
        asked = threading.Event()

        def person() -> None:
            while (view := app.get("r")) is None or view.status is not JobStatus.WAITING:
                pass
            asked.set()
            time.sleep(0.5)  # the waiting caller sees the job waiting for a person meanwhile
            app.supply_input("r", "manager_ok", True)

        threading.Thread(target=person, daemon=True).start()
        assert run.wait(timeout=20).result == {"ok": True} and asked.is_set()


def test_wait_on_a_parent_waiting_for_its_children_says_so_not_that_a_person_approves_their_calls() -> None:
    # Its child-run calls were named as calls to approve, and approving one was refused ("not waiting for an
    # approval").
    storage, scheduler, _ = memory()
    clerk = Agent(name="clerk", model=ScriptedModel([reply(None, call("refund", order="A-1")), "refunded"]),
                  tools=[refund])
    boss = Agent(name="boss", model=ScriptedModel([reply(None, call("clerk", input="refund A-1")), "done"]),
                 tools=[clerk.as_tool(description="A clerk.")])
    app = App(storage=storage, scheduler=scheduler, agents=[boss, clerk])
    run = app.run_agent("boss", job_id="b", user="go")
    with pytest.raises(WaitTimeoutError, match=r"still waiting now .*it waits for its child runs") as raised:
        run.wait(timeout=3600)
    assert "approve" not in str(raised.value)
