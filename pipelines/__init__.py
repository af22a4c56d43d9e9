"""phaserunner: durable, checkpointed agent loops on the job queues you already have.

Users hold an :class:`App` (storage + scheduler + registered agents and
pipelines) and a :class:`RunHandle` per run; ``run_agent``, ``run_pipeline``,
``advance_phase`` and ``build_agent_phase`` are the low-level layer with
cl-pipelines' names. Everything else lives in its module (errors in
:mod:`pipelines.engine.errors`, the engine's records in :mod:`pipelines.engine.models`).

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
    from pipelines.engine.errors import PipelineError
    from pipelines.engine.flow import RateLimit
    from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry, Usage
    from pipelines.engine.phase import (
        Done,
        Fail,
        FailJob,
        Next,
        Phase,
        PhaseContext,
        Pipeline,
        RetryLater,
        WaitForInput,
    )
    from pipelines.engine.runner import AdvanceResult
    from pipelines.engine.start import RetryMode
    from pipelines.handle import JobView, RunHandle
    from pipelines.lowlevel import advance_phase, run_agent, run_pipeline

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
    "RateLimit",
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
    "AdvanceResult": "pipelines.engine.runner",
    **dict.fromkeys(["Event", "JobRecord", "JobStatus", "LogEntry", "Usage"], "pipelines.engine.models"),
    **dict.fromkeys(["Done", "Fail", "FailJob", "Next", "Phase", "PhaseContext", "Pipeline", "RetryLater",
                     "WaitForInput"], "pipelines.engine.phase"),
    "PipelineError": "pipelines.engine.errors", "RetryMode": "pipelines.engine.start",
    "RateLimit": "pipelines.engine.flow",
    "Agent": "pipelines.agent", "App": "pipelines.app",
    "JobView": "pipelines.handle", "RunHandle": "pipelines.handle",
    "run_agent": "pipelines.lowlevel", "run_pipeline": "pipelines.lowlevel", "advance_phase": "pipelines.lowlevel",
    "Model": "phases.model", "PrepareTurn": "phases.agent_turn", "TurnPlan": "phases.agent_turn",
    "build_agent_phase": "phases.agent_turn",
    **dict.fromkeys(["StopCondition", "TurnInfo", "has_tool_call", "max_turns"], "phases.stop"),
    **dict.fromkeys(["Tool", "ToolContext", "tool"], "phases.tools"),
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
