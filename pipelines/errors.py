"""The exception hierarchy, at its public path (``from pipelines.errors import JobNotFoundError``).

The classes live in :mod:`pipelines.engine.errors`, whose docstring draws the tree.
"""

from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    InvalidJobIdError,
    InvalidPipelineError,
    JobConflictError,
    JobFailedError,
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
    WaitTimeoutError,
)

__all__ = [
    "ConfigurationError",
    "CorruptRecordError",
    "InvalidInputError",
    "InvalidJobIdError",
    "InvalidPipelineError",
    "JobConflictError",
    "JobFailedError",
    "JobNotFoundError",
    "ModelError",
    "PermanentModelError",
    "PipelineError",
    "StaleVersionError",
    "StateNotSerializableError",
    "StateValidationError",
    "StorageError",
    "StorageUnavailableError",
    "TransientModelError",
    "ValueTooLargeError",
    "WaitTimeoutError",
]
