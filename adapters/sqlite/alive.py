"""``async`` followers of an SQLite file's live stream: waits that hold no thread.

A follower in an event loop that found nothing new registers a future for its
job and the part number it has read up to. One task per event loop and file
(:class:`LoopFollowers`) looks at the heads of the waiting jobs' streams with
one indexed query, and resolves each future whose job has a part past its
reader's number (or is gone). It looks when this process writes to the file
(:meth:`~adapters.sqlite.wakeup.Wakeup.notify` kicks every loop, a few
milliseconds) and every :data:`~adapters.sqlite.wakeup.POLL_SECONDS` for other
processes' writes, so a thousand idle followers cost one short query per poll,
not a thread or a query each.

The query runs on the loop's thread (an SQLite read in WAL mode never waits
for writers); a future is compared with the head the query finds, not with the
head seen before, so a part written between a follower's read and its
registration still wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from adapters.live_wakeup import forget_waiter
from adapters.sqlite.wakeup import POLL_SECONDS

__all__ = ["Heads", "LoopFollowers"]

Heads = Callable[[list[str]], dict[str, int]]
"""Reads the highest part number of each named job that still exists (0 for no parts; a gone job is absent)."""


class LoopFollowers:
    """The waiting ``async`` followers of one file in one event loop, and the task that wakes them.

    Every method but :meth:`kick` runs on the loop's thread; :meth:`kick` may be
    called from any thread (a writer's), and reaches the loop through
    ``call_soon_threadsafe``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, heads: Heads) -> None:
        self._loop = loop
        self._heads = heads
        self._waiting: dict[str, dict[asyncio.Future[None], int]] = {}
        self._kicked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add(self, job_id: str, start: int) -> asyncio.Future[None]:
        """A future resolved once ``job_id`` has a part after ``start`` (or is gone)."""
        woken: asyncio.Future[None] = self._loop.create_future()
        self._waiting.setdefault(job_id, {})[woken] = start
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._watch(), name="sqlite-live-followers")
        return woken

    def discard(self, job_id: str, woken: asyncio.Future[None]) -> None:
        """Forget ``woken`` (its reader stopped waiting: woken, timed out or cancelled)."""
        forget_waiter(self._waiting, job_id, woken)

    def waiting(self) -> int:
        """How many followers wait in this loop."""
        return sum(map(len, self._waiting.values()))

    def kick(self) -> bool:
        """Look now (this process wrote to the file); ``False`` once the loop is closed (forget this object)."""
        if not self._waiting:
            return not self._loop.is_closed()
        try:
            self._loop.call_soon_threadsafe(self._kicked.set)
        except RuntimeError:  # the loop is closed: nobody in it waits any more
            return False
        return True

    async def _watch(self) -> None:
        while self._waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), POLL_SECONDS)
            self._kicked.clear()
            if not self._waiting:
                return
            failure: Exception | None = None
            heads: dict[str, int] = {}
            try:
                heads = self._heads(list(self._waiting))
            except Exception as exc:  # noqa: BLE001 - woken, the followers' own reads raise it, each to its caller
                failure = exc
            for job_id, waiters in list(self._waiting.items()):
                head = heads.get(job_id)
                for woken, start in list(waiters.items()):
                    if not woken.done() and (failure is not None or head is None or head > start):
                        woken.set_result(None)
