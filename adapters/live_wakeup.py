"""Waking ``async`` readers of an in-process live stream from whichever thread publishes.

A :class:`~adapters.memory.MemoryStorage` follower in an event loop waits on a
future, not on the storage's ``threading.Condition``: a blocked condition wait
would hold a thread per follower. The publisher (a worker thread, or the loop's
own thread) resolves each waiting future of the job through its loop's
``call_soon_threadsafe``, the one loop-safe way in from another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

__all__ = ["LoopWakeups", "forget_waiter", "wait_on"]

K = TypeVar("K")
W = TypeVar("W")
V = TypeVar("V")


def forget_waiter(waiting: dict[K, dict[W, V]], key: K, woken: W) -> None:
    """Drop ``woken`` from ``waiting[key]``, and the key once nobody waits on it (a reader that stopped)."""
    waiters = waiting.get(key)
    if waiters is not None:
        waiters.pop(woken, None)
        if not waiters:
            del waiting[key]


class LoopWakeups:
    """Futures of ``async`` readers waiting for a key (a job's live stream), woken from any thread.

    Not locked itself: the owner calls :meth:`add`, :meth:`discard` and
    :meth:`notify` under the lock that guards the stream, so a reader that
    found nothing and registers cannot miss a part published in between.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, dict[asyncio.Future[None], asyncio.AbstractEventLoop]] = {}

    def add(self, key: str) -> asyncio.Future[None]:
        """A future of the running loop, resolved by the next :meth:`notify` of ``key``."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._waiting.setdefault(key, {})[woken] = loop
        return woken

    def discard(self, key: str, woken: asyncio.Future[None]) -> None:
        """Forget ``woken`` (its reader stopped waiting: woken, timed out or cancelled)."""
        forget_waiter(self._waiting, key, woken)

    def notify(self, key: str) -> None:
        """Wake every reader waiting for ``key``, each in its own loop."""
        for woken, loop in self._waiting.pop(key, {}).items():
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is left to wake
                loop.call_soon_threadsafe(_resolve, woken)

    def waiting(self, key: str | None = None) -> int:
        """How many readers wait (for ``key``, or for any key)."""
        if key is not None:
            return len(self._waiting.get(key, ()))
        return sum(map(len, self._waiting.values()))


async def wait_on(woken: asyncio.Future[None], timeout: float) -> None:
    """Until ``woken`` is resolved or ``timeout`` seconds passed; ``woken`` is cancelled if it was not.

    Not ``asyncio.wait_for``: on Python 3.11 a cancellation that lands as the
    future resolves is swallowed there, and a follower asked to stop (a client
    that left) would follow on for good.
    """
    try:
        await asyncio.wait({woken}, timeout=max(0.0, timeout))
    finally:
        woken.cancel()  # a no-op once resolved; else nobody resolves it later


def _resolve(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # a reader that timed out or was cancelled has already left
        woken.set_result(None)
