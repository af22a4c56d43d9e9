"""Job events: building them, and the in-process hooks that see them once committed.

Events are stored with the commit that produced them (atomically, so a crash
re-run never duplicates them) and read back with ``storage.events(job_id,
after=cursor)``. In the process that committed them, each event also goes to
the ``on_event`` hooks and to the stdlib logger ``pipelines.engine.events`` (INFO).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipelines.engine.models import Event

__all__ = ["make_event", "on_event", "publish"]

logger = logging.getLogger("pipelines.events")

EventHook = Callable[[str, Event], None]
_hooks: list[EventHook] = []
_lock = threading.Lock()


def make_event(type_: str, now: float, *, turn: int | None = None, phase: str | None = None, **data: Any) -> Event:
    return Event(timestamp=now, type=type_, turn=turn, phase=phase, data=data)


def on_event(fn: EventHook) -> Callable[[], None]:
    """Call ``fn(job_id, event)`` for every event this process commits; returns a function that unsubscribes.

    Hooks run after the commit, in the committing thread; an exception in a
    hook is logged and does not affect the job.
    """
    with _lock:
        _hooks.append(fn)

    def unsubscribe() -> None:
        with _lock:
            if fn in _hooks:
                _hooks.remove(fn)

    return unsubscribe


def publish(job_id: str, events: Sequence[Event]) -> None:
    """Hand committed events to the hooks and the ``pipelines.engine.events`` logger."""
    if not events:
        return
    with _lock:
        hooks = list(_hooks)
    for event in events:
        if logger.isEnabledFor(logging.INFO):
            logger.info("%s %s turn=%s %s", job_id, event.type, event.turn, event.data)
        for fn in hooks:
            try:
                fn(job_id, event)
            except Exception:
                logger.warning("event hook %r failed", fn, exc_info=True)
