"""What a phase returns or raises: its outcome (Next, Done, Fail), the signals, and what it produced besides."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.engine.contain import describe
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import NO_USAGE, Event, LogEntry, Message, Usage

__all__ = ["MAX_DELAY", "Done", "Fail", "FailJob", "Next", "Outcome", "PhaseOutput", "RetryLater", "WaitForInput"]

MAX_DELAY = 10 * 365 * 86400.0
"""The longest a phase may ask to wait before it runs again (``Next.delay``, ``RetryLater``): ten years. Every
scheduler takes it (a thread's wait stops at ~292 years, a queue's datetime at year 9999); wait longer with
``WaitForInput`` and a person or a cron that wakes the job."""


@dataclass(frozen=True)
class Next:
    """Go on with ``next_phase`` (after ``delay`` seconds) with ``state``.

    ``state=None`` keeps the current state.
    """

    next_phase: str
    state: Any = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.delay, int | float) or isinstance(self.delay, bool) or not (
            0 <= self.delay <= MAX_DELAY
        ):
            raise InvalidInputError(f"Next.delay must be a number of seconds from 0 to {MAX_DELAY:.0f} (ten years, "
                                    f"pipelines.engine.phase.outcomes.MAX_DELAY), got {self.delay!r}")


@dataclass(frozen=True)
class Done:
    """The job is complete; ``result`` (JSON) stays readable on the record.

    ``reason`` (optional) says why it stopped, e.g. ``"max_turns"``; it is
    stored as ``record.stop_reason``.
    """

    result: Any = None
    reason: str | None = None


@dataclass(frozen=True)
class Fail:
    """The job ends in status ``error`` with ``error``; the last good checkpoint is kept.

    ``error``: a message; an exception is taken as ``"<type>: <message>"``.
    """

    error: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "error", _error_text(self.error, "Fail"))


Outcome = Next | Done | Fail


class RetryLater(Exception):  # noqa: N818 - a control signal, not an error
    """Raised by a phase to end this attempt and run the same phase again after ``delay``.

    Steps already journaled are kept, so the retry does not repeat them.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        if (not isinstance(delay, int | float) or isinstance(delay, bool) or not math.isfinite(delay)
                or delay > MAX_DELAY):  # a bool is a mistake (RetryLater(True) is not "retry in 1 s")
            raise InvalidInputError(f"RetryLater needs a delay in seconds of at most {MAX_DELAY:.0f} (ten years, "
                                    f"pipelines.engine.phase.outcomes.MAX_DELAY), got {delay!r}")
        super().__init__(reason or f"retry in {delay:.1f}s")
        self.delay = max(0.0, float(delay))
        self.reason = reason


class WaitForInput(Exception):  # noqa: N818 - a control signal, not an error
    """Raised by a phase or tool to park the job in status ``waiting`` until a person acts.

    The checkpoint and the journal stay; ``reason`` and ``call_id`` are readable
    on the record (``record.waiting``) until the job is resumed.
    """

    def __init__(self, reason: str, *, call_id: str | None = None, details: dict[str, Any] | None = None) -> None:
        # Checked here, in the phase or tool that raises it: a wrong type caught only when the wait is
        # committed would leave the job running and due, its side effects run again at every sweep (I9).
        if not isinstance(reason, str):
            raise InvalidInputError(f"WaitForInput(reason) must be a string, got {type(reason).__name__}")
        if call_id is not None and not isinstance(call_id, str):
            raise InvalidInputError(f"WaitForInput(call_id=) must be a string or None, got {type(call_id).__name__}")
        if details is not None and not isinstance(details, dict):
            raise InvalidInputError(f"WaitForInput(details=) must be a dict or None, got {type(details).__name__}")
        super().__init__(reason)
        self.reason = reason
        self.call_id = call_id
        self.details = details or {}


class FailJob(Exception):  # noqa: N818 - a control signal, not an error
    """Raised by a tool or step to fail the whole job on purpose with ``error``."""

    def __init__(self, error: str) -> None:
        error = _error_text(error, "FailJob")
        super().__init__(error)
        self.error = error


def _error_text(error: object, what: str) -> str:
    """A failure's message: a string as it is, an exception as ``"<type>: <message>"``; else refused."""
    if isinstance(error, str):
        return error
    if isinstance(error, BaseException):
        return describe(error)
    raise InvalidInputError(f"{what}(error) takes a message (a string) or an exception, got {type(error).__name__}")


class PhaseOutput:
    """What a phase produced besides its outcome (from the phase context's buffer)."""

    def __init__(self, *, logs: Sequence[LogEntry] = (), messages: Sequence[Message] = (),
                 events: Sequence[Event] = (), usage: Usage | None = None,
                 usage_keys: Sequence[str] = (), take_inbox: int = 0) -> None:
        self.logs = list(logs)
        self.messages = list(messages)
        self.events = list(events)
        self.usage = usage or NO_USAGE
        # Journal keys whose usage is in ``usage`` (so a kept journal does not count them twice).
        self.usage_keys = list(usage_keys)
        # How many messages the phase took from the job's inbox (its commit removes them there).
        self.take_inbox = take_inbox
