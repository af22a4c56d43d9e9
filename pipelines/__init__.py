"""phaserunner: durable, checkpointed agent loops on the job queues you already have.

Users hold an :class:`App` (storage + scheduler + registered agents and
pipelines) and a :class:`RunHandle` per run; ``run_agent``, ``run_pipeline``,
``advance_phase`` and ``build_agent_phase`` are the low-level layer with
cl-pipelines' names. Everything else lives in its module (errors in
:mod:`pipelines.errors`, the engine's records in :mod:`pipelines.models`).

Names load on first use, so ``import pipelines`` (or any engine module, or
``adapters.memory``) imports neither the composition layer nor redis, rq or
litellm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phases.agent_turn import PrepareTurn, TurnPlan, build_agent_phase
    from phases.model import Model
    from phases.stop import StopCondition, TurnInfo, has_tool_call, max_turns
    from phases.tools import Tool, ToolContext, tool
    from pipelines.agent import Agent
    from pipelines.app import App
    from pipelines.errors import PipelineError
    from pipelines.handle import JobView, RunHandle
    from pipelines.lowlevel import run_agent, run_pipeline
    from pipelines.models import Event, JobRecord, JobStatus, LogEntry, Usage
    from pipelines.phase import Done, Fail, FailJob, Next, Phase, PhaseContext, Pipeline, RetryLater, WaitForInput
    from pipelines.runner import AdvanceResult, advance_phase
    from pipelines.start import RetryMode

__all__ = [
    "AdvanceResult",
    "Agent",
    "App",
    "Done",
    "Event",
    "Fail",
    "FailJob",
    "JobRecord",
    "JobStatus",
    "JobView",
    "LogEntry",
    "Model",
    "Next",
    "Phase",
    "PhaseContext",
    "Pipeline",
    "PipelineError",
    "PrepareTurn",
    "RetryLater",
    "RetryMode",
    "RunHandle",
    "StopCondition",
    "Tool",
    "ToolContext",
    "TurnInfo",
    "TurnPlan",
    "Usage",
    "WaitForInput",
    "advance_phase",
    "build_agent_phase",
    "has_tool_call",
    "max_turns",
    "run_agent",
    "run_pipeline",
    "tool",
]

# Where each public name lives; resolved on first access (PEP 562).
_HOMES = {
    "AdvanceResult": "pipelines.runner", "advance_phase": "pipelines.runner",
    "Agent": "pipelines.agent", "App": "pipelines.app",
    "JobView": "pipelines.handle", "RunHandle": "pipelines.handle",
    "run_agent": "pipelines.lowlevel", "run_pipeline": "pipelines.lowlevel",
    "PipelineError": "pipelines.errors", "RetryMode": "pipelines.start",
    "Event": "pipelines.models", "JobRecord": "pipelines.models", "JobStatus": "pipelines.models",
    "LogEntry": "pipelines.models", "Usage": "pipelines.models",
    "Done": "pipelines.phase", "Fail": "pipelines.phase", "FailJob": "pipelines.phase", "Next": "pipelines.phase",
    "Phase": "pipelines.phase", "PhaseContext": "pipelines.phase", "Pipeline": "pipelines.phase",
    "RetryLater": "pipelines.phase", "WaitForInput": "pipelines.phase",
    "Model": "phases.model", "PrepareTurn": "phases.agent_turn", "TurnPlan": "phases.agent_turn",
    "build_agent_phase": "phases.agent_turn",
    "StopCondition": "phases.stop", "TurnInfo": "phases.stop", "has_tool_call": "phases.stop",
    "max_turns": "phases.stop", "Tool": "phases.tools", "ToolContext": "phases.tools", "tool": "phases.tools",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


__version__ = "0.1.0"
