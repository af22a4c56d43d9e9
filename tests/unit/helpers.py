"""Small builders shared by the unit tests."""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock


def memory() -> tuple[MemoryStorage, MemoryScheduler, VirtualClock]:
    clock = VirtualClock(start=1_000_000.0)
    return MemoryStorage(clock=clock), MemoryScheduler(clock=clock), clock


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing inside catches it."""


def calls() -> dict[str, Any]:
    return {}
