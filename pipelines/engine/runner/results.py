"""What one advance did: :class:`AdvanceResult`, and the result of each phase outcome."""

from __future__ import annotations

from enum import StrEnum

from pipelines.engine.phase import Done, Fail, Next, RetryLater, WaitForInput

__all__ = ["AdvanceResult"]


class AdvanceResult(StrEnum):
    """What one ``try_advance`` call did (``advance_phase`` itself returns ``None``)."""

    UNKNOWN = "unknown"
    BUSY = "busy"  # another caller holds the lease
    NOT_RUNNING = "not_running"
    NOT_DUE = "not_due"
    ADVANCED = "advanced"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY_LATER = "retry_later"
    WAITING = "waiting"
    STALE = "stale"  # fenced off: another worker moved the job on
    PAUSED = "paused"  # a pause requested during the last turn was applied
    CANCELLED = "cancelled"  # a cancel requested during the last turn was applied
    DEFERRED = "deferred"  # flow control (a rate limit, a concurrency key) moved the turn later; nothing committed
    UNREACHED = "unreached"  # the sweep could not advance it (an error, logged): not "unknown", which is no such job


_RESULTS: dict[type, AdvanceResult] = {
    Next: AdvanceResult.ADVANCED, Done: AdvanceResult.COMPLETED, Fail: AdvanceResult.FAILED,
    RetryLater: AdvanceResult.RETRY_LATER, WaitForInput: AdvanceResult.WAITING,
}
