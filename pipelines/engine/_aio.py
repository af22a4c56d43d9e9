"""The event loop the runner owns, for ``async def`` phases, steps and tools.

The core is synchronous because RQ workers and cron are. An awaitable is run
on one long-lived loop per thread (creating a loop per call costs more than a
whole memory-adapter turn), or on a helper thread when the caller is itself
inside a running loop (``asyncio.run`` would refuse).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
import types
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["resolve", "run_sync"]

T = TypeVar("T")

_local = threading.local()


def _forget_loops_after_fork() -> None:
    # An event loop's selector must not be shared with the parent process.
    global _local
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_loops_after_fork)


class _OwnedLoop:
    """A thread's loop, closed when the thread's locals go (the thread ended): a worker or timeout thread that
    ran one ``async def`` tool must not leave an open loop and its self-pipe behind for the collector."""

    __slots__ = ("loop", "pid")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()

    def __del__(self) -> None:
        # Never in a forked child (a subprocess's preexec_fn, an RQ horse): the loop is the parent's, and
        # closing it would unregister its self-pipe from the epoll instance both processes share, so the
        # parent's loop would never be woken by another thread again (a tool's result from the pool hung).
        if os.getpid() != self.pid:
            return
        try:
            if not self.loop.is_running():
                self.loop.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to tell
            pass


def _loop() -> asyncio.AbstractEventLoop:
    owned: _OwnedLoop | None = getattr(_local, "owned", None)
    if owned is None or owned.loop.is_closed():
        owned = _local.owned = _OwnedLoop()
    return owned.loop


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to completion from synchronous code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _loop().run_until_complete(awaitable)
    # Called from inside a running loop (a user's async app calling the sync
    # API): run on a fresh thread so we neither block nor re-enter that loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(_as_coroutine(awaitable))).result()


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


def resolve(value: Any) -> Any:
    """Await ``value`` if it is awaitable (an ``async def`` result), else return it."""
    t = type(value)
    if t in _NOT_AWAITABLE:  # what a turn step returns, every time: no ABC check (most of the step's own cost)
        return value
    if inspect.isawaitable(value):
        return run_sync(value)
    if t is not types.GeneratorType and len(_NOT_AWAITABLE) < _KEPT:
        # Awaitable or not is a property of the type (Awaitable's check looks at the class), except for
        # generators, which a flag on their code makes awaitable.
        _NOT_AWAITABLE.add(t)
    return value


_NOT_AWAITABLE: set[type] = {dict, list, str, int, float, bool, type(None)}
_KEPT = 512  # types remembered at most (a bound, in case a process makes classes on the fly)
