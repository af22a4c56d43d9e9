"""The one exception hierarchy of phaserunner.

Every exception the library raises on purpose derives from ``PipelineError``;
backend exceptions (redis-py, RQ, litellm) are translated at the adapter edge,
so callers catch only these::

    PipelineError
    ├── InvalidInputError (also ValueError)   bad caller input; nothing was written
    │   ├── InvalidJobIdError
    │   ├── InvalidPipelineError             empty phases, duplicate names, unknown phase
    │   ├── StateNotSerializableError        state/result/message that is not JSON
    │   │   └── ValueTooLargeError           ... or whose JSON exceeds MAX_VALUE_BYTES
    │   └── StateValidationError             stored state no longer fits the phase's model
    ├── JobNotFoundError (also LookupError)
    ├── JobConflictError                     the job exists / is in the wrong status
    ├── JobFailedError                       RunHandle.result() of a job that failed or was cancelled
    ├── WaitTimeoutError (also TimeoutError) RunHandle.wait() ran out of time
    ├── ConfigurationError                   bad Redis URL, bad --app import path
    ├── StorageError
    │   ├── StaleVersionError                commit/journal fenced off: another
    │   │   │                                worker moved the job on (I2)
    │   │   └── InboxNotEmptyError           a commit would end a run past messages
    │   │                                    sent to it meanwhile (app.send)
    │   ├── CorruptRecordError               a stored record does not parse
    │   └── StorageUnavailableError          the backend cannot be reached
    └── ModelError                           a model call failed
        ├── TransientModelError              rate limit, timeout, 5xx: retried
        └── PermanentModelError              bad request, auth, context window

Control signals that phases and tools raise on purpose (``RetryLater``,
``FailJob``) live in :mod:`pipelines.engine.phase`; they are not errors.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

__all__ = [
    "ConfigurationError",
    "CorruptRecordError",
    "InboxNotEmptyError",
    "InvalidInputError",
    "InvalidJobIdError",
    "InvalidPipelineError",
    "JobConflictError",
    "JobFailedError",
    "JobNotFoundError",
    "MAX_RETRY_AFTER_SECONDS",
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
    "bound_retry_after",
    "validation_summary",
]


class PipelineError(Exception):
    """Base class of every error phaserunner raises."""


class InvalidInputError(PipelineError, ValueError):
    """The caller passed something invalid; nothing was written."""


class InvalidJobIdError(InvalidInputError):
    """A job id outside ``[A-Za-z0-9._:-]{1,200}``."""


class InvalidPipelineError(InvalidInputError):
    """Empty phase list, duplicate phase names, an unknown phase name."""


class StateNotSerializableError(InvalidInputError):
    """A state, result, message or step value that does not survive JSON."""


class ValueTooLargeError(StateNotSerializableError):
    """A value whose JSON text is larger than storage accepts (``pipelines.engine.models.MAX_VALUE_BYTES``)."""


class StateValidationError(InvalidInputError):
    """A stored state does not validate against the phase's ``state_model`` (the schema changed)."""


class JobNotFoundError(PipelineError, LookupError):
    """No job with this id exists in storage."""


class JobConflictError(PipelineError):
    """The job exists, or is in a status that does not allow the operation."""


class JobFailedError(PipelineError):
    """The run ended in ``error`` or ``cancelled`` where a result was asked for."""


class WaitTimeoutError(PipelineError, TimeoutError):
    """Waiting for a run took longer than the timeout given; the job goes on regardless.

    ``status``: the job's status then (``"waiting"``: for a person, whom the message names with the calls or
    input it waits for; ``"paused"``: for a ``resume``); ``None`` when not known.
    """

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


class ConfigurationError(PipelineError):
    """Bad configuration: an unparsable URL, an import path that does not resolve."""


class StorageError(PipelineError):
    """The storage backend refused or failed an operation."""


class StaleVersionError(StorageError):
    """A write was fenced off because the job's version or lease moved on.

    The worker that gets this stops: another worker owns the job now.
    ``unrecorded``: the result a step computed and could not journal (a paid
    model answer, say), so the caller can still account for it.
    """

    unrecorded: object = None


class InboxNotEmptyError(StaleVersionError):
    """A commit that would end the run was refused, nothing written: messages wait in the job's inbox.

    They were sent (``app.send``) while the run's last turn was in flight, after
    it read the inbox. Storage checks this in the commit itself, so a run never
    completes past them; the runner commits the run's end together with a new
    run that starts with them instead. ``waiting``: the inbox's length.
    """

    def __init__(self, message: str, *, waiting: int) -> None:
        super().__init__(message)
        self.waiting = waiting


class CorruptRecordError(StorageError):
    """A stored record could not be parsed (edited by hand, or written by an incompatible version)."""


class StorageUnavailableError(StorageError):
    """The storage backend could not be reached, even after retries.

    ``fix``: what to check, when the storage knows better than "is its server running" (a file's storage).
    """

    fix: str | None = None  # also for a subclass whose own __init__ does not call this one

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


class ModelError(PipelineError):
    """A model call failed.

    ``usage``: what the failed call's attempts were paid for (a
    :class:`~pipelines.engine.models.Usage`; ``None``: nothing known), for
    example a stream that broke after it started, then a retry that failed:
    the agent turn counts it for the job, so budgets see every paid call.
    """

    usage: Any = None


MAX_RETRY_AFTER_SECONDS = 3600.0
"""The longest a server's Retry-After is believed: a longer hint (``inf``, ``1e9``, a far date) means an hour."""


def bound_retry_after(value: object) -> float | None:
    """A Retry-After hint in seconds as the engine may use it: within ``[0, MAX_RETRY_AFTER_SECONDS]``.

    The number comes from outside (a provider's header, a model's exception),
    so it is bounded before use: a hint that is not a number (or NaN) is no
    hint (``None``), a negative one is 0, a longer one is the maximum.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:  # NaN != NaN
        return None
    return min(max(0.0, float(value)), MAX_RETRY_AFTER_SECONDS)


class TransientModelError(ModelError):
    """Rate limits, timeouts, 5xx: worth retrying later.

    ``retry_after`` is the server's hint in seconds, when it gave one, bounded
    by :func:`bound_retry_after` (an endless hint would block a model, and
    every job using it, for ever).
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = bound_retry_after(retry_after)


class PermanentModelError(ModelError):
    """Bad request, authentication, unknown model, context window: retrying will not help."""


def validation_summary(exc: ValidationError) -> str:
    """Pydantic's refusal in one line: ``"<field path>: <why>"`` for its first five errors, ``;``-separated."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()[:5])
