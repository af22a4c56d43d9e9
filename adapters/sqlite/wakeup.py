"""Waking the live stream's followers of one SQLite file in this process, within a few milliseconds.

A commit or a publish in this process bumps the file's counter and wakes every
thread waiting on it; a follower that found nothing waits for the counter to
move past the value it read before it looked. Writes by other processes are
not seen here: followers also look again every :data:`POLL_SECONDS` (short
polling, one indexed read). ``async`` followers wait on futures instead (see
:mod:`adapters.sqlite.alive`): a write kicks the one watcher of each event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapters.sqlite.alive import Heads, LoopFollowers

__all__ = ["POLL_SECONDS", "Wakeup", "wakeup_for"]

POLL_SECONDS = 0.05
"""How often a waiting follower looks at the file again for parts written by another process."""


class Wakeup:
    """A counter of writes to one file, and a condition its waiters sleep on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.count = 0
        self._loops: dict[asyncio.AbstractEventLoop, LoopFollowers] = {}

    def notify(self) -> None:
        """A write landed: wake every waiter (threads here, and each event loop's watcher)."""
        with self._cond:
            self.count += 1
            self._cond.notify_all()
            for loop, followers in list(self._loops.items()):
                if not followers.kick():
                    del self._loops[loop]

    def followers(self, heads: Heads) -> LoopFollowers:
        """The :class:`~adapters.sqlite.alive.LoopFollowers` of the running event loop on this file."""
        from adapters.sqlite.alive import LoopFollowers  # alive imports POLL_SECONDS from here

        loop = asyncio.get_running_loop()
        with self._cond:
            found = self._loops.get(loop)
            if found is None:
                found = self._loops[loop] = LoopFollowers(loop, heads)
            return found

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until the counter moves past ``seen``, at most ``timeout`` (and at most one poll) seconds."""
        deadline = time.monotonic() + min(timeout, POLL_SECONDS)
        with self._cond:
            while self.count == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)


_by_path: dict[str, Wakeup] = {}
_lock = threading.Lock()


def wakeup_for(path: str) -> Wakeup:
    """The one :class:`Wakeup` of the file at ``path`` (an absolute path) in this process."""
    with _lock:
        found = _by_path.get(path)
        if found is None:
            found = _by_path[path] = Wakeup()
        return found
