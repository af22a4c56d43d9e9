"""Issue 30: ``sys.exit()`` (or another standard BaseException) from user code inside a turn ends as data.

A phase, a custom model, a state migration or a view migration that raises
``SystemExit``, ``GeneratorExit`` or ``asyncio.CancelledError`` fails its job
with a readable error, and the worker loop (here ``drain()``) goes on to the
next job. ``KeyboardInterrupt`` and a BaseException from outside the standard
library (by convention the process going down) still propagate.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from pipelines import Agent, App, JobStatus
from pipelines.engine.phase import Done, Phase, PhaseContext
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel
from tests.unit.helpers import Crash, memory


def exiting(raise_: BaseException) -> Phase:
    def run(ctx: PhaseContext[Any]) -> Done:
        raise raise_
    return Phase("a", run)


def done(ctx: PhaseContext[Any]) -> Done:
    return Done(result="ok")


def app_of(first: Phase) -> App:
    storage, scheduler, _ = memory()
    return App(storage=storage, scheduler=scheduler,
               pipelines={"bad": [first], "good": [Phase("a", done)]})


@pytest.mark.parametrize(("raised", "error"), [
    pytest.param(SystemExit(3), "SystemExit: 3", id="sys-exit-3"),
    pytest.param(SystemExit(), "SystemExit", id="sys-exit"),
    pytest.param(GeneratorExit("closed"), "GeneratorExit: closed", id="generator-exit"),
    pytest.param(asyncio.CancelledError(), "CancelledError", id="cancelled"),
    pytest.param(BaseExceptionGroup("two", [SystemExit(1), ValueError("v")]), "BaseExceptionGroup: two",
                 id="a-group-of-them"),
])
def test_a_phase_that_exits_fails_its_job_and_the_worker_loop_runs_the_next(raised: BaseException,
                                                                         error: str) -> None:
    app = app_of(exiting(raised))
    app.run_pipeline("bad", job_id="bad", initial_state={})
    app.run_pipeline("good", job_id="good", initial_state={})
    assert app.drain() == 2  # no exception out of the loop, and the next job ran
    bad = app.get("bad")
    assert bad is not None and bad.status is JobStatus.ERROR and bad.error is not None
    assert bad.error.startswith(error)
    good = app.get("good")
    assert good is not None and good.status is JobStatus.COMPLETE


@pytest.mark.parametrize("raised", [KeyboardInterrupt(), Crash()], ids=["keyboard-interrupt", "process-going-down"])
def test_a_keyboard_interrupt_or_a_process_going_down_still_stops_the_worker(raised: BaseException) -> None:
    app = app_of(exiting(raised))
    app.run_pipeline("bad", job_id="bad", initial_state={})
    with pytest.raises(type(raised)):
        app.drain()
    bad = app.get("bad")
    assert bad is not None and bad.status is JobStatus.RUNNING  # nothing recorded: the sweep runs it again


def test_a_custom_model_that_calls_sys_exit_fails_the_job() -> None:
    class Quits:
        def complete(self, request: Any) -> Any:
            sys.exit("no key configured")

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=Quits(), stream=False)])
    app.run_agent("a", job_id="j", messages=["hi"])
    app.drain()
    job = app.get("j")
    assert job is not None and job.status is JobStatus.ERROR and "SystemExit: no key configured" in (job.error or "")


def test_a_state_migration_that_calls_sys_exit_fails_the_job_with_its_reason() -> None:
    storage, scheduler, _ = memory()
    old = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(["x"]),
                                                                   version="1", stream=False)])
    old.run_agent("a", job_id="j", messages=["hi"])
    scheduler.drop_all()

    def migrate(state: Any) -> Any:
        sys.exit(4)

    new = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=ScriptedModel(["x"]), version="2",
                                                                   migrations={"1": migrate}, stream=False)])
    assert new.advance("j") is AdvanceResult.FAILED
    job = new.get("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert "migration from version '1' failed: SystemExit: 4" in (job.error or "")
