"""Unique tokens (commit tokens, lease owners) without a system call each time.

A random per-process prefix plus a counter: unique across processes (the
prefix is 96 random bits, drawn again in every forked child) and cheap.
"""

from __future__ import annotations

import itertools
import os
import threading

__all__ = ["new_token"]

_prefix = os.urandom(12).hex()
_counter = itertools.count()
_lock = threading.Lock()


def _after_fork() -> None:
    # A forked child must not repeat its parent's tokens.
    global _prefix, _counter
    _prefix = os.urandom(12).hex()
    _counter = itertools.count()


os.register_at_fork(after_in_child=_after_fork)


def new_token() -> str:
    """A token that no other call, in this process or any other, returns."""
    with _lock:
        n = next(_counter)
    return f"{_prefix}{n:08x}"
