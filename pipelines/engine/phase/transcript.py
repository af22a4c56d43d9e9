"""A phase's read of its job's committed transcript, checked against what the record counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.engine.errors import CorruptRecordError
from pipelines.engine.models import Message

if TYPE_CHECKING:
    from adapters.base import Storage

__all__ = ["read_transcript"]


def read_transcript(storage: Storage, job_id: str, start: int, length: int) -> list[Message]:
    """Messages ``[start:length]`` of ``job_id``'s transcript, ``length`` being what its record counts.

    Fewer than that is a transcript deleted or evicted outside the app (a Redis whose ``maxmemory-policy``
    evicts keys, a hand-run ``DEL``): :class:`CorruptRecordError` naming it, which fails the job, rather
    than a turn that asks its model with no system prompt and no history and a record counting messages
    that do not exist. (A commit that truncated it meanwhile, a full retry, fences this turn off anyway.)
    """
    messages = storage.messages(job_id, start, length)
    expected = len(range(length)[start:])
    if len(messages) < expected:
        raise CorruptRecordError(
            f"job {job_id!r}: its transcript holds {len(messages)} of the {expected} messages from {start} its "
            "record counts: deleted or evicted outside the app (Redis needs maxmemory-policy noeviction), or "
            "cut back by a full retry while this turn ran (which fences this turn off)")
    return messages
