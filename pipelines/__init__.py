"""phaserunner: durable, checkpointed agent loops on the job queues you already have.

``run_pipeline`` / ``run_agent`` write a job and enqueue it; ``advance_phase``
runs one phase (one agent turn) and commits a checkpoint; storage and
scheduling are adapters (``adapters.memory``, ``adapters.redis``, ``adapters.rq``).

``import pipelines`` imports neither redis, rq nor litellm.
"""

from pipelines.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    InvalidJobIdError,
    InvalidPipelineError,
    JobConflictError,
    JobNotFoundError,
    ModelError,
    PermanentModelError,
    PipelineError,
    StaleVersionError,
    StateNotSerializableError,
    StateValidationError,
    StorageError,
    StorageUnavailableError,
    TransientModelError,
    ValueTooLargeError,
)
from pipelines.events import on_event
from pipelines.models import Checkpoint, Event, JobRecord, JobStatus, LogEntry, Usage
from pipelines.phase import Done, Fail, FailJob, Next, Phase, PhaseContext, RetryLater, WaitForInput
from pipelines.runner import DEFAULT_LEASE_SECONDS, AdvanceResult, advance_phase, try_advance
from pipelines.start import run_pipeline

# The composing layer: the agent loop and the app registry build on the core
# above and on `phases`; they come last so `phases.*` can import the core.
from phases.agent_turn import AgentState, TurnPlan  # isort: skip
from phases.model import Model, ModelRequest, ModelResponse  # isort: skip
from phases.stop import TurnInfo, has_tool_call, max_turns  # isort: skip
from phases.tools import Tool, ToolContext, tool  # isort: skip
from pipelines.agent import Agent, build_agent_phase, run_agent  # isort: skip
from pipelines.approvals import approve, pending_calls, record_tool_result, reject  # isort: skip
from pipelines.app import App, load_app  # isort: skip
from pipelines.control import cancel_job, pause_job, resume_job, retry_job  # isort: skip

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Agent",
    "AgentState",
    "App",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Tool",
    "ToolContext",
    "TurnInfo",
    "TurnPlan",
    "approve",
    "build_agent_phase",
    "cancel_job",
    "pause_job",
    "pending_calls",
    "reject",
    "resume_job",
    "retry_job",
    "has_tool_call",
    "load_app",
    "on_event",
    "max_turns",
    "record_tool_result",
    "run_agent",
    "tool",
    "AdvanceResult",
    "Checkpoint",
    "ConfigurationError",
    "CorruptRecordError",
    "Done",
    "Event",
    "Fail",
    "FailJob",
    "InvalidInputError",
    "InvalidJobIdError",
    "InvalidPipelineError",
    "JobConflictError",
    "JobNotFoundError",
    "JobRecord",
    "JobStatus",
    "LogEntry",
    "ModelError",
    "Next",
    "PermanentModelError",
    "Phase",
    "PhaseContext",
    "PipelineError",
    "RetryLater",
    "StaleVersionError",
    "StateNotSerializableError",
    "StateValidationError",
    "StorageError",
    "StorageUnavailableError",
    "TransientModelError",
    "Usage",
    "ValueTooLargeError",
    "WaitForInput",
    "advance_phase",
    "run_pipeline",
    "try_advance",
]

__version__ = "0.1.0"
