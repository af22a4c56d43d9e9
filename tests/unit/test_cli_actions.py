"""``pipelines pause/resume/approve/reject/tail`` on in-memory apps."""

from __future__ import annotations

import io

from pipelines import JobStatus
from pipelines.cli import main
from tests.apps import approval_app, memory_app

APPROVALS = "tests.apps.approval_app:app"
MEMORY = "tests.apps.memory_app:app"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def start_refund() -> approval_app.App:
    app = approval_app.reset()
    agent = app.agents["desk"]
    agent.run(job_id="t1", messages=["refund me"], storage=app.storage, scheduler=app.scheduler)  # type: ignore[attr-defined]
    app.scheduler.drain()  # type: ignore[attr-defined]
    return app


def test_approve_from_the_command_line_runs_the_waiting_call() -> None:
    app = start_refund()
    assert app.storage.get_job("t1").status is JobStatus.WAITING  # type: ignore[union-attr]
    code, out, _ = run("status", "t1", "--app", APPROVALS)
    assert code == 0 and '"call_id": "r1"' in out
    assert run("approve", "t1", "r1", "--app", APPROVALS) == (0, "t1: call r1 approved\n", "")
    app.scheduler.drain()  # type: ignore[attr-defined]
    assert approval_app.refunds == [7] and app.storage.get_job("t1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_reject_needs_a_reason_and_sends_it_to_the_model() -> None:
    app = start_refund()
    code, out, err = run("reject", "t1", "r1", "--reason", "not eligible", "--app", APPROVALS)
    assert (code, out) == (0, "t1: call r1 rejected\n")
    app.scheduler.drain()  # type: ignore[attr-defined]
    assert approval_app.refunds == []
    assert "not eligible" in app.storage.messages("t1")[2]["content"]
    code, _, err = run("approve", "t1", "r1", "--app", APPROVALS)
    assert code == 1 and err.startswith("error: job 't1' is complete, not waiting for an approval")


def test_pause_and_resume_from_the_command_line() -> None:
    app = memory_app.reset()
    app.run_pipeline("slow", job_id="s")
    assert run("pause", "s", "--app", MEMORY) == (0, "s: paused at phase 'wait'\n", "")
    assert app.storage.get_job("s").status is JobStatus.PAUSED  # type: ignore[union-attr]
    code, _, err = run("pause", "s", "--app", MEMORY)
    assert code == 1 and "only a running job can be paused" in err
    assert run("resume", "s", "--app", MEMORY) == (0, "s: resumed, status running\n", "")


def test_tail_prints_events_from_a_cursor() -> None:
    start_refund()
    code, out, _ = run("tail", "t1", "--app", APPROVALS)
    lines = out.splitlines()
    # The live stream: the model's attempt started (it asked for a tool, no text), then the wait.
    assert code == 0 and [line.split()[2] for line in lines] == [
        "job_started", "attempt_started", "approval_requested"]
    first_id = lines[0].split()[1]
    code, out, _ = run("tail", "t1", "--after", first_id, "--app", APPROVALS)
    assert [line.split()[2] for line in out.splitlines()] == ["attempt_started", "approval_requested"]
    code, _, err = run("tail", "nope", "--app", APPROVALS)
    assert code == 1 and err.startswith("error: job 'nope' not found; `pipelines jobs --app") and err.count("\n") == 1
