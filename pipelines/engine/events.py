"""Job events: building them, and the in-process hooks that see them once committed.

Events are stored with the commit that produced them (atomically, so a crash
re-run never duplicates them) and read back with ``storage.events(job_id,
after=cursor)``. In the process that committed them, each event also goes to
the ``on_event`` hooks and to the stdlib logger ``pipelines.engine.events`` (INFO).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Event

__all__ = ["LAST_CURSOR", "MAX_CURSOR_PART", "check_cursor", "make_event", "notify", "on_event"]

MAX_CURSOR_PART = 2**64 - 1
"""The largest number either part of a cursor holds: a Redis stream id's parts are unsigned 64-bit."""
LAST_CURSOR = f"{MAX_CURSOR_PART}-{MAX_CURSOR_PART}"
"""The largest stream id: nothing comes after it (and Redis refuses to read from past it)."""

# [0-9], not \d or int(): those take other scripts' digits, signs, spaces and "1_0", none of which a
# stream ever gave out; nor a leading zero ("007"), which int() reads as the id it pads but no stream writes.
_CURSOR = re.compile(r"(0|[1-9][0-9]*)(?:-(0|[1-9][0-9]*))?")
_DIGITS = len(str(MAX_CURSOR_PART))

logger = logging.getLogger("pipelines.events")

EventHook = Callable[[str, Event], None]
_hooks: list[EventHook] = []
_lock = threading.Lock()


def check_cursor(after: object, what: str = "stream cursor") -> str | None:
    """``after`` if it is a cursor (``<n>`` or ``<ms>-<seq>``), ``None`` for no cursor (``None`` or ``""``).

    The one check of every cursor a reader passes in (``app.stream``,
    ``storage.events`` and ``read_live`` on every backend, the SSE endpoint):
    each part is ASCII digits with no leading zero, at most :data:`MAX_CURSOR_PART`. Anything else
    raises :class:`~pipelines.errors.InvalidInputError` naming ``what`` and the
    problem, before anything is read.
    """
    if after is None or after == "":
        return None
    if not isinstance(after, str):
        raise InvalidInputError(f"{what} must be a string (a part id), got {type(after).__name__}")
    match = _CURSOR.fullmatch(after)
    if match is None:
        raise InvalidInputError(f"{what} {after!r:.60} is not a part id: expected <n> or <ms>-<seq> in ASCII digits, "
                                "no leading zeros")
    # The length is looked at first, so int() never parses a huge string.
    too_big = [p for p in match.groups() if p is not None and (len(p) > _DIGITS or int(p) > MAX_CURSOR_PART)]
    if too_big:
        raise InvalidInputError(f"{what} {after!r:.60} is out of range: each part is at most "
                                f"2**64-1 in at most 20 digits, got {too_big[0]:.30}")
    return after


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


def notify(job_id: str, events: Sequence[Event]) -> None:
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
