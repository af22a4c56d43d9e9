"""``VirtualClock``: a clock that only moves when told to, shared by the memory scheduler and storage in tests."""

from __future__ import annotations

import threading
import time

__all__ = ["VirtualClock"]


class VirtualClock:
    """A clock that only moves when told to. Shared by scheduler and storage in tests."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now += seconds

    def advance_to(self, t: float) -> None:
        with self._lock:
            self._now = max(self._now, t)
