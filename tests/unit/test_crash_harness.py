"""The crash-injection harness, on the project's own example agent and on a pipeline (issue 5)."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.base import Scheduler, Storage
from examples.support_agent import build_agent
from pipelines import Agent, Done, Next, Phase, PhaseContext, run_pipeline, tool
from pipelines.engine.phase import PhaseContext as Ctx
from pipelines.testing import ScriptedModel, call, crash_test, reply, transcript_problems


def start_support(storage: Storage, scheduler: Scheduler) -> None:
    build_agent(refunds=False).run(job_id="t", messages=["Where is A-1001?"], storage=storage, scheduler=scheduler)


def test_the_support_agent_survives_a_crash_at_every_boundary() -> None:
    report = crash_test(start_support, job_id="t")
    report.assert_ok()
    ops = {r.point.operation for r in report.results}
    assert {"create_job", "commit", "schedule_advance", "record_step:model"} <= ops
    assert any(op.startswith("record_step:tool:") for op in ops)
    # before/after: create + first schedule, then two tool turns (model, tool, commit, schedule; its
    # tools retry, so no "started" mark) and a final turn (model, commit): 2 * (2 + 4 + 4 + 2) points.
    assert len(report.results) == 24
    assert report.clean_status == "complete"


def test_a_pipeline_with_steps_survives_a_crash_at_every_boundary() -> None:
    def fetch(ctx: PhaseContext[Any]) -> Next:
        rows = ctx.step("download", lambda: [3, 1, 2])
        return Next("report", state={"rows": rows}, delay=5)

    def report_phase(ctx: PhaseContext[Any]) -> Done:
        return Done(result=min(ctx.state["rows"]))

    def start(storage: Storage, scheduler: Scheduler) -> None:
        run_pipeline(job_id="p", phases=[Phase("fetch", fetch), Phase("report", report_phase)], storage=storage,
                     scheduler=scheduler, initial_state={})

    crash_test(start, job_id="p").assert_ok()


def test_non_retry_tools_end_in_their_documented_state() -> None:
    @tool(idempotent=False)
    def charge(order: str) -> str:
        """Charge an order."""
        return f"charged {order}"

    def start(storage: Storage, scheduler: Scheduler) -> None:
        model = ScriptedModel(lambda msgs: reply(None, call("charge", order="o-1"))
                              if len(msgs) == 1 else reply("done"))
        Agent(model=model, tools=[charge]).run(job_id="c", messages=["pay"], storage=storage, scheduler=scheduler)

    report = crash_test(start, job_id="c", policies={"charge": "fail"})
    report.assert_ok()
    assert [r.status for r in report.results if r.point.operation.startswith("record_step:tool:")
            and r.point.when == "before"] == ["error"]


def test_the_harness_catches_a_runner_that_forgets_its_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ctx, "record", lambda self, key, value: None)  # steps never reach storage
    report = crash_test(start_support, job_id="t")
    problems = [p for r in report.failures for p in r.problems]
    assert any("the model was called 1 extra time(s)" in p for p in problems)
    with pytest.raises(AssertionError, match="crash points failed"):
        report.assert_ok()


def test_transcript_problems_finds_unanswered_and_duplicate_results() -> None:
    ok = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "a"}]},
          {"role": "tool", "tool_call_id": "a", "content": "1"}]
    assert transcript_problems(ok) == []
    assert transcript_problems(ok[:2]) == ["end: tool calls ['a'] were never answered"]
    assert "answers no open tool call" in transcript_problems([*ok, ok[2]])[0]
