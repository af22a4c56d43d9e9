"""``pipelines fork / delete / gc`` and the lineage ``pipelines status`` shows (issue 14)."""

from __future__ import annotations

import io

from pipelines import JobStatus
from pipelines.cli import main
from tests.apps import memory_app

MEMORY = "tests.apps.memory_app:app"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def etl_done(job_id: str = "e1") -> memory_app.App:
    app = memory_app.app
    app.run_pipeline("etl", job_id=job_id)
    app.drain()
    return app


def test_fork_from_the_command_line_and_status_shows_the_lineage() -> None:
    memory_app.reset()
    app = etl_done()
    code, out, _ = run("fork", "e1", "--at-turn", "1", "--new-id", "e1-b", "--app", MEMORY)
    assert (code, out) == (0, "e1-b: forked from e1 at turn 1, status paused\n")
    assert app.storage.get_job("e1-b").checkpoint.state == {"rows": [1, 2, 3]}  # type: ignore[union-attr]
    code, out, _ = run("status", "e1-b", "--app", MEMORY)
    assert code == 0 and "forked from: e1 at turn 1\n" in out
    code, out, _ = run("fork", "e1", "--at-turn", "1", "--new-id", "e1-c", "--run", "--app", MEMORY)
    assert code == 0 and "status running" in out
    app.drain()
    assert app.storage.get_job("e1-c").result == {"loaded": 3}  # type: ignore[union-attr]
    code, _, err = run("fork", "e1", "--at-turn", "7", "--new-id", "x", "--app", MEMORY)
    assert code == 1 and "no checkpoint for turn 7" in err


def test_delete_and_gc_from_the_command_line() -> None:
    app = memory_app.reset()
    etl_done("a")
    etl_done("b")
    app.run_pipeline("slow", job_id="s")
    assert run("delete", "a", "--app", MEMORY) == (0, "a: deleted\n", "")
    code, _, err = run("delete", "s", "--app", MEMORY)
    assert code == 1 and "is running; cancel it before deleting it" in err
    code, _, err = run("gc", "--app", MEMORY)
    assert code == 1 and "gc needs older_than" in err
    app.scheduler.clock.advance(60)  # type: ignore[attr-defined]
    assert run("gc", "--older-than", "30", "--app", MEMORY) == (0, "b\n1 finished job(s) removed\n", "")
    assert app.get("b") is None and app.get("s").status is JobStatus.RUNNING  # type: ignore[union-attr]


def test_gc_from_the_command_line_keeps_another_apps_jobs_unless_told_all_pipelines() -> None:
    from adapters.memory import MemoryScheduler
    from pipelines import Agent, App
    from pipelines.testing import ScriptedModel

    app = memory_app.reset()
    clock = app.scheduler.clock  # type: ignore[attr-defined]
    other = App(storage=app.storage, scheduler=MemoryScheduler(clock=clock), provenance=False,
                agents=[Agent(name="theirs", model=ScriptedModel(lambda m: "hi"))])
    other.run_agent("theirs", job_id="t", user="hi")
    etl_done("mine")
    other.drain()
    clock.advance(60)
    assert run("gc", "--older-than", "30", "--app", MEMORY) == (0, "mine\n1 finished job(s) removed\n", "")
    assert other.get("t").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert run("gc", "--older-than", "30", "--all-pipelines", "--app", MEMORY) == (
        0, "t\n1 finished job(s) removed\n", "")
    assert app.storage.list_jobs() == []
