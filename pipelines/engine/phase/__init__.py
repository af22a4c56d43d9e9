"""The phase protocol: what a phase is, what it sees, what it returns.

A phase is ``Phase(name=..., run=fn)`` where ``fn(ctx)`` (plain or
``async def``) returns ``Next``, ``Done`` or ``Fail``. Inside, ``ctx.step``
journals results so a re-run after a crash does not repeat finished work.

The package holds it in three modules: :mod:`~pipelines.engine.phase.outcomes` (what a phase
returns or raises), :mod:`~pipelines.engine.phase.pipeline` (what a phase is, and a pipeline of
them) and :mod:`~pipelines.engine.phase.context` (what it sees and can do while it runs).
"""

from __future__ import annotations

from pipelines.engine.phase.context import INBOX_STEP, DeltaTarget, PhaseContext, ToolScope
from pipelines.engine.phase.inputs import wait_for_input
from pipelines.engine.phase.outcomes import (
    Done,
    Fail,
    FailJob,
    Next,
    Outcome,
    PhaseOutput,
    RetryLater,
    WaitForInput,
)
from pipelines.engine.phase.pipeline import Phase, Pipeline, validate_state

__all__ = [
    "INBOX_STEP",
    "DeltaTarget",
    "Done",
    "Fail",
    "FailJob",
    "Next",
    "Outcome",
    "Phase",
    "PhaseContext",
    "PhaseOutput",
    "Pipeline",
    "RetryLater",
    "ToolScope",
    "WaitForInput",
    "validate_state",
    "wait_for_input",
]
