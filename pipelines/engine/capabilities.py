"""Optional capabilities of a port (a storage that journals and publishes in one write, a scheduler with a backlog).

A ``runtime_checkable`` protocol check costs ~10 us, paid on every turn where a
capability is consulted; a class that defines the method answers from a cache.
An instance whose class does not define it may still delegate it (a wrapper
with ``__getattr__``), so that case is checked each time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard, TypeVar

from adapters.base import StepPublisher

if TYPE_CHECKING:
    from adapters.base import Storage
    from pipelines.engine.models import Event, JSONValue

__all__ = ["declares", "record_step_with_parts"]

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


def record_step_with_parts(storage: Storage, job_id: str, *, version: int, owner: str | None, key: str,
                           value: JSONValue, parts: Sequence[Event]) -> None:
    """Journal a step and publish ``parts`` once it is journaled: in one write when ``storage`` can
    (a :class:`~adapters.base.StepPublisher`), else ``record_step`` then ``publish``."""
    if not parts:
        storage.record_step(job_id, version=version, owner=owner, key=key, value=value)
    elif declares(storage, StepPublisher, "record_step_and_publish"):  # type: ignore[type-abstract]
        storage.record_step_and_publish(job_id, version=version, owner=owner, key=key, value=value, parts=parts)
    else:
        storage.record_step(job_id, version=version, owner=owner, key=key, value=value)
        storage.publish(job_id, parts)
