"""The tool-call ledger (intended -> started -> done) and the per-tool recovery policies (issue 5)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.approvals import record_tool_result
from pipelines import Agent, JobStatus, Tool, tool
from pipelines.engine.errors import InvalidInputError, JobConflictError
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import Crash, memory


def crash_once_inside(effects: list[str]) -> Any:
    """The body of a tool whose process dies mid-call the first time (after its effect happened)."""
    state = {"armed": True}

    def body(order: str) -> str:
        effects.append(order)
        if state["armed"]:
            state["armed"] = False
            raise Crash()
        return f"charged {order}"

    return body


def start(t: Tool) -> tuple[MemoryStorage, MemoryScheduler, ScriptedModel]:
    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, {**call(t.name, order="o-1"), "id": "c1"}), "done"])
    Agent(model=model, tools=[t]).run(job_id="j", messages=["pay"], storage=storage, scheduler=scheduler)
    with pytest.raises(Crash):
        scheduler.run_next()
    scheduler.schedule_advance("j", pipeline="agent")  # the sweep finds the job due again
    return storage, scheduler, model


def test_started_is_journaled_before_the_tool_runs_and_done_after() -> None:
    storage, scheduler, _ = memory()
    seen: list[dict[str, Any]] = []

    @tool(idempotent=False)
    def probe(x: int) -> int:
        """Looks at the journal while running."""
        seen.append(storage.inspect("j")["journal"])
        return x

    model = ScriptedModel([reply(None, {**call("probe", x=1), "id": "c1"}), "ok"])
    Agent(model=model, tools=[probe]).run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.run_next()
    assert set(seen[0]) == {"model", "tools:started"}  # intended (model) and started, not yet done
    assert seen[0]["tools:started"] == ["c1"]
    assert storage.messages("j")[2]["content"] == "1"


def test_retry_only_batches_skip_the_started_mark() -> None:
    storage, scheduler, _ = memory()
    seen: list[dict[str, Any]] = []

    @tool
    def probe(x: int) -> int:
        """Idempotent: running it again is its recovery."""
        seen.append(storage.inspect("j")["journal"])
        return x

    model = ScriptedModel([reply(None, {**call("probe", x=1), "id": "c1"}), "ok"])
    Agent(model=model, tools=[probe]).run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.run_next()
    assert set(seen[0]) == {"model"}


def test_retry_policy_runs_an_interrupted_idempotent_call_again() -> None:
    effects: list[str] = []
    t = tool(crash_once_inside(effects), name="charge")
    assert t.on_interrupted == "retry"
    storage, scheduler, _ = start(t)
    scheduler.drain()
    assert effects == ["o-1", "o-1"]
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_fail_policy_stops_the_job_until_a_person_records_the_outcome() -> None:
    effects: list[str] = []
    t = tool(crash_once_inside(effects), name="charge", idempotent=False)
    assert t.on_interrupted == "fail"
    storage, scheduler, model = start(t)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert job.error is not None and "interrupted mid-call" in job.error and "'charge'" in job.error
    assert effects == ["o-1"]  # not run a second time
    record_tool_result("j", "c1", "charged o-1 (checked by hand)", storage=storage, scheduler=scheduler)
    Agent(model=model, tools=[t]).run(job_id="j", storage=storage, scheduler=scheduler)  # resume
    scheduler.drain()
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert storage.messages("j")[2]["content"] == "charged o-1 (checked by hand)"
    assert effects == ["o-1"] and len(model.calls) == 2


def test_reconcile_policy_asks_the_outside_world_instead_of_running_again() -> None:
    effects: list[str] = []
    asked: list[str] = []

    def reconcile(args: Any, ctx: Any) -> str | None:
        asked.append(ctx.idempotency_key)
        return "charged o-1 (found by reconcile)" if args.order in effects else None

    t = tool(crash_once_inside(effects), name="charge", idempotent=False, on_interrupted="reconcile",
             reconcile=reconcile)
    storage, scheduler, _ = start(t)
    scheduler.drain()
    assert asked == ["j/c1"] and effects == ["o-1"]
    assert storage.messages("j")[2]["content"] == "charged o-1 (found by reconcile)"
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_reconcile_that_finds_no_effect_runs_the_call_again() -> None:
    runs: list[str] = []

    def body(order: str) -> str:
        runs.append(order)
        if len(runs) == 1:
            raise Crash()  # died before the effect
        return "ok"

    t = tool(body, name="charge", idempotent=False, on_interrupted="reconcile", reconcile=lambda a, c: None)
    storage, scheduler, _ = start(t)
    scheduler.drain()
    assert runs == ["o-1", "o-1"]
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_ask_policy_waits_for_the_outcome_then_goes_on() -> None:
    effects: list[str] = []
    t = tool(crash_once_inside(effects), name="charge", idempotent=False, on_interrupted="ask")
    storage, scheduler, _ = start(t)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.WAITING
    assert job.waiting is not None and job.waiting["call_id"] == "c1"
    with pytest.raises(InvalidInputError, match="no tool call 'zz'"):
        record_tool_result("j", "zz", "x", storage=storage, scheduler=scheduler)
    record_tool_result("j", "c1", {"charged": True}, storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.COMPLETE and job.waiting is None
    assert storage.messages("j")[2]["content"] == '{"charged": true}'
    assert effects == ["o-1"]
    with pytest.raises(JobConflictError):
        record_tool_result("j", "c1", "again", storage=storage, scheduler=scheduler)


def test_reconcile_policy_needs_a_reconcile_function() -> None:
    with pytest.raises(InvalidInputError, match="reconcile function"):
        tool(crash_once_inside([]), name="x", on_interrupted="reconcile")


# --- a result that fits its journal step but not the transcript's tool message ---------------------------


def test_a_reconciled_result_too_large_for_its_tool_message_tells_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine import models

    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 64 * 1024)
    effects: list[str] = []
    t = tool(crash_once_inside(effects), name="charge", idempotent=False, on_interrupted="reconcile",
             reconcile=lambda a, c: "x" * (models.MAX_VALUE_BYTES - 10))
    storage, scheduler, _ = start(t)
    scheduler.drain()
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    got = storage.messages("j")[2]["content"]
    assert got.startswith("Error: tool 'charge' ran, but its result could not be kept: the tool message answering "
                          "call 'c1' is ")


def test_a_recorded_result_too_large_for_its_tool_message_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine import models
    from pipelines.engine.errors import ValueTooLargeError

    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 64 * 1024)
    effects: list[str] = []
    storage, scheduler, _ = start(tool(crash_once_inside(effects), name="charge", idempotent=False,
                                       on_interrupted="ask"))
    scheduler.drain()
    before = storage.inspect("j")
    with pytest.raises(ValueTooLargeError, match=r"the tool message answering call 'c1' is .* MiB limit"):
        record_tool_result("j", "c1", "x" * (models.MAX_VALUE_BYTES - 10), storage=storage, scheduler=scheduler)
    assert storage.inspect("j") == before  # still waiting for an outcome that fits
