"""Call observation for tests: the crash harness counts model calls and tool executions through it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["notify", "observe_calls"]

# Test instrumentation (the crash harness counts model and tool executions
# through it); a no-op loop over an empty list when nobody observes.
_observers: list[Callable[[str, str, str], None]] = []


@contextmanager
def observe_calls(fn: Callable[[str, str, str], None]) -> Iterator[None]:
    """Call ``fn(kind, job_id, key)`` right before every model call (``"model"``, turn) and tool execution
    (``"tool"``, call id) in this process, while the ``with`` block runs."""
    _observers.append(fn)
    try:
        yield
    finally:
        _observers.remove(fn)


def notify(kind: str, job_id: str, key: str) -> None:
    for fn in list(_observers):
        fn(kind, job_id, key)
