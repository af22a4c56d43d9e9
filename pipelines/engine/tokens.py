"""Unique tokens (commit tokens, lease owners) without a system call each time.

A random per-process prefix plus a counter: unique across processes (the
prefix is 96 random bits, drawn again in every forked child) and cheap.
Short, because a turn sends about nine of them to Redis: the prefix in
URL-safe base64 (16 characters), the counter in hex without padding.
"""

from __future__ import annotations

import base64
import itertools
import os
import threading

__all__ = ["new_token"]


def _new_prefix() -> str:
    return base64.urlsafe_b64encode(os.urandom(12)).decode()  # 96 bits: 16 characters, no padding


_prefix = _new_prefix()
_counter = itertools.count()
_lock = threading.Lock()


def _after_fork() -> None:
    # A forked child must not repeat its parent's tokens.
    global _prefix, _counter
    _prefix = _new_prefix()
    _counter = itertools.count()


os.register_at_fork(after_in_child=_after_fork)


def new_token() -> str:
    """A token that no other call, in this process or any other, returns."""
    with _lock:
        n = next(_counter)
    return f"{_prefix}{n:x}"  # the prefix has a fixed length: no two (prefix, n) make one token
