"""A plain pipeline's phase waits for a person's input (``wait_for_input``) and goes on when given it."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines import App, Done, JobStatus, Phase, PhaseContext
from pipelines.engine.errors import InvalidInputError, JobConflictError, StateNotSerializableError
from pipelines.engine.phase import wait_for_input
from tests.unit.helpers import memory


def make() -> tuple[App, list[str]]:
    storage, scheduler, _ = memory()
    charged: list[str] = []

    def review(ctx: PhaseContext[Any]) -> Done:
        quote = ctx.step("quote", lambda: charged.append("quoted") or {"amount": 42})
        ok = wait_for_input(ctx, "manager_ok", "a manager approves the refund")
        return Done(result={"refund": quote["amount"] if ok else 0})

    app = App(storage=storage, scheduler=scheduler, provenance=False, pipelines={"refund": [Phase("review", review)]})
    return app, charged


def test_a_phase_waits_for_its_input_and_goes_on_with_it_without_repeating_its_steps() -> None:
    app, charged = make()
    app.run_pipeline("refund", job_id="r", initial_state={})
    app.drain()
    job = app.get("r")
    assert job is not None and job.status is JobStatus.WAITING
    assert job.record.waiting == {"kind": "input", "key": "manager_ok", "reason": "a manager approves the refund",
                                  "call_id": None}
    with pytest.raises(JobConflictError, match="waits for input 'manager_ok', not 'ok'"):
        app.supply_input("r", "ok", True)
    with pytest.raises(JobConflictError, match=r"it waits for input 'manager_ok': give it with app.supply_input"):
        app.resume("r")
    app.supply_input("r", "manager_ok", True)
    app.drain()
    job = app.get("r")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == {"refund": 42}
    assert charged == ["quoted"]  # the step before the wait ran once
    assert "input_supplied" in [e.type for e in app.events("r")]
    with pytest.raises(JobConflictError, match="is complete and waits for no input"):
        app.supply_input("r", "manager_ok", False)  # given twice: the second is refused


def test_a_bad_input_is_refused_with_nothing_written() -> None:
    app, _ = make()
    app.run_pipeline("refund", job_id="r", initial_state={})
    app.drain()
    version = app.get("r").record.version  # type: ignore[union-attr]
    with pytest.raises(StateNotSerializableError, match="input 'manager_ok'"):
        app.supply_input("r", "manager_ok", {1, 2})
    for key in ("", None, "k" * 201):
        with pytest.raises(InvalidInputError, match="an input's key must be a non-empty string"):
            app.supply_input("r", key, True)  # type: ignore[arg-type]
    assert app.get("r").record.version == version  # type: ignore[union-attr]
