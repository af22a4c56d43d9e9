"""Background threads started without waiting for them to run: the lease keeper and the delta flusher.

``threading.Thread.start()`` blocks until the new thread has been scheduled
and has run its bootstrap. In a freshly forked RQ work-horse that wait was
~4 ms per thread (p90 14 ms) on a 2-core VM, against ~0.15 ms for the
clone itself, and a horse starts both threads on every turn it runs (the
threads of the parent do not survive the fork). Here the thread is started
with ``_thread.start_new_thread`` and the caller goes on at once; the new
thread's start-up then overlaps the caller's next Redis round trip.

The thread runs under ``name`` as far as ``threading.current_thread()`` can
tell (a dummy thread object: always daemonic, never joined), which is what
these loops need: they run for the life of the process.
"""

from __future__ import annotations

import _thread
import logging
import threading
from collections.abc import Callable

__all__ = ["Daemon", "start_daemon"]

logger = logging.getLogger("pipelines")


class Daemon:
    """A handle on a loop started by :func:`start_daemon`: whether it still runs."""

    __slots__ = ("alive",)

    def __init__(self) -> None:
        # True from the start: the loop counts as running before it is first scheduled, so a
        # second caller does not start another one meanwhile.
        self.alive = True

    def is_alive(self) -> bool:
        return self.alive


def start_daemon(target: Callable[[], object], name: str) -> Daemon:
    """Run ``target`` on a new daemon thread called ``name``; return without waiting for it to start."""
    handle = Daemon()

    def run() -> None:
        threading.current_thread().name = name
        try:
            target()
        except Exception:  # threading's excepthook would have printed it; the next caller starts another
            logger.exception("background thread %s stopped on an unexpected error", name)
        finally:
            handle.alive = False

    _thread.start_new_thread(run, ())
    return handle
