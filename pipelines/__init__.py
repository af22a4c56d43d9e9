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
)
from pipelines.models import Checkpoint, JobRecord, JobStatus, LogEntry, Usage
from pipelines.phase import Done, Fail, FailJob, Next, Phase, PhaseContext, RetryLater
from pipelines.runner import DEFAULT_LEASE_SECONDS, AdvanceResult, advance_phase, run_pipeline, try_advance

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "AdvanceResult",
    "Checkpoint",
    "ConfigurationError",
    "CorruptRecordError",
    "Done",
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
    "advance_phase",
    "run_pipeline",
    "try_advance",
]

__version__ = "0.1.0"
