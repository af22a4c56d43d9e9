"""The runner's per-thread event loop (``pipelines.engine._aio``): reused within a thread, closed with it.

A worker or ``tool_timeout`` thread that ran one ``async def`` tool used to leave its loop and the loop's
self-pipe sockets open for the garbage collector (``ResourceWarning: unclosed event loop``, seen in CI).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from typing import Any

import pytest

from pipelines.engine import _aio
from pipelines.engine._aio import run_sync


async def _loop_of_this_call() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_one_thread_reuses_its_loop() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    def body() -> None:
        seen.extend([run_sync(_loop_of_this_call()), run_sync(_loop_of_this_call())])

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen[0] is seen[1]


def test_a_finished_thread_leaves_no_open_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def body() -> None:
        loops.append(run_sync(_loop_of_this_call()))

    for _ in range(3):
        t = threading.Thread(target=body)
        t.start()
        t.join()
    gc.collect()
    assert all(loop.is_closed() for loop in loops)
    assert [str(u.exc_value) for u in unraisable] == []


def test_a_loop_closed_by_someone_else_is_replaced() -> None:
    first = run_sync(_loop_of_this_call())
    first.close()
    second = run_sync(_loop_of_this_call())
    assert second is not first and not second.is_closed()
    assert _aio._local.owned.loop is second



def test_a_fork_leaves_the_parents_loop_wakeable_by_other_threads() -> None:
    # A child forked by subprocess with a preexec_fn runs the at-fork hooks, which forget the inherited loops.
    # Closing them there unregistered the parent's self-pipe from the epoll instance the two share: a result
    # handed over from a pool thread never woke the parent's loop again (tests hung in the tool runner).
    import subprocess

    loop: Any = run_sync(_loop_of_this_call())  # this thread's loop exists before the fork
    subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: None, check=True, timeout=60)
    gc.collect()
    assert not loop.is_closed()
    loop._write_to_self()  # what call_soon_threadsafe does from another thread
    woken = loop._selector.select(5)  # what the loop waits on: the kernel's epoll instance
    loop._read_from_self()
    assert [key.fd for key, _ in woken] == [loop._ssock.fileno()]
    assert run_sync(_loop_of_this_call()) is loop
