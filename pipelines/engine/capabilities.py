"""Optional capabilities of a port (a storage that journals and publishes in one write, a scheduler with a backlog).

A ``runtime_checkable`` protocol check costs ~10 us, paid on every turn where a
capability is consulted; a class that defines the method answers from a cache.
An instance whose class does not define it may still delegate it (a wrapper
with ``__getattr__``), so that case is checked each time.
"""

from __future__ import annotations

from typing import TypeGuard, TypeVar

__all__ = ["declares"]

T = TypeVar("T")

_DECLARED: set[tuple[type, str]] = set()  # (class, method) pairs found defined on the class


def declares(obj: object, protocol: type[T], method: str) -> TypeGuard[T]:
    """Whether ``obj`` is a ``protocol`` (which ``method`` stands for), cheaply after the first time."""
    # mypy refuses a Protocol class as type[T] (python/mypy#4717): callers pass one with an ignore.
    key = (type(obj), method)
    if key in _DECLARED:
        return True
    if hasattr(key[0], method):
        _DECLARED.add(key)
        return True
    return isinstance(obj, protocol)
