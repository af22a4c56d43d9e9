"""A follower asked to stop stops: the waits and Redis calls of async followers never lose a cancellation.

A lost cancellation means an SSE follower whose client left reads on for good, and an event loop that ends
waits for it forever. Both cases below were seen with 1,000 followers on Python 3.11.
"""

from __future__ import annotations

import asyncio

import pytest

from adapters.live_wakeup import LoopWakeups, wait_on
from adapters.redis.live_async import _uncancelled


def test_a_wait_cancelled_as_its_future_resolves_raises_the_cancellation() -> None:
    async def main() -> None:
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(wait_on(woken, 10))
        await asyncio.sleep(0)  # it waits
        woken.set_result(None)  # the publisher's wake and the client's departure, in one loop turn
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):  # asyncio.wait_for (3.11) returns the result instead
            await waiting

    asyncio.run(main())


def test_a_wait_that_runs_out_cancels_its_future_so_a_late_wake_finds_nobody() -> None:
    async def main() -> bool:
        wakeups = LoopWakeups()
        woken = wakeups.add("job")
        await wait_on(woken, 0.01)
        wakeups.notify("job")  # the publisher, after the reader left
        await asyncio.sleep(0)
        return woken.cancelled()

    assert asyncio.run(main())


def test_a_call_that_swallows_its_cancellation_is_cancelled_all_the_same() -> None:
    async def swallowing() -> str:  # what redis-py's asyncio client was seen doing under load
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return "a reply"
        return "never"

    async def main() -> None:
        call = asyncio.create_task(_uncancelled(swallowing()))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(main())
