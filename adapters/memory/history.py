"""A job's turn history as :class:`~adapters.memory.MemoryStorage` keeps it: apart from the record, a mark a line.

As on Redis (``adapters.redis``): the history changes by one mark a turn but
holds up to ``HISTORY_LIMIT`` of them, so writing and parsing it whole with
every record made a late turn cost more than an early one. The engine builds
each history from the one it loaded (drop from the front, append), so the
marks it keeps are the very objects storage handed out: their lines are known
and only the new marks are checked and dumped. Anything else (a hand-made
record, a history rebuilt) is dumped whole, checked by the same rules.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from pipelines.engine.models import JobRecord, TurnMark, changed_fields, dump_fields, dump_marks, dump_record_apart

__all__ = ["NO_HISTORY", "StoredHistory", "check_since", "dump_apart", "stored_dict"]


class StoredHistory(NamedTuple):
    """The marks a record holds (the objects loads hand out, frozen) and their stored lines."""

    marks: tuple[TurnMark, ...] = ()
    lines: tuple[str, ...] = ()


NO_HISTORY = StoredHistory()


def dump_apart(record: JobRecord, held: StoredHistory, what: str) -> tuple[str, StoredHistory, int]:
    """``record``'s text without its history, the history to store, and the bytes of the lines it adds.

    ``held``: what storage holds now. Raises like :func:`~pipelines.engine.models.dump_record`,
    before anything is written.
    """
    text = dump_record_apart(record, what)
    history, added = _history(record, held, what)
    return text, history, added


def check_since(record: JobRecord, held: StoredHistory, since: JobRecord, what: str) -> tuple[StoredHistory, int]:
    """:func:`dump_apart` for a storage that keeps the record it stored (``since``), not its text.

    Only the fields of ``record`` that are not ``since``'s very objects are checked (the rest were when
    ``since`` was stored) and dumped, for the size check and the count of bytes written, which it
    returns with the history to store.
    """
    size = len(dump_fields(record, changed_fields(record, since), what))
    history, added = _history(record, held, what)
    return history, size + added


def _history(record: JobRecord, held: StoredHistory, what: str) -> tuple[StoredHistory, int]:
    """The history to store for ``record``, ``held`` being stored now, and the bytes of the lines it adds."""
    marks = record.history
    kept = _kept(marks, held)
    drop = len(held.marks) - kept
    new = dump_marks(marks, what, start=kept)
    return StoredHistory(tuple(marks), (*held.lines[drop:], *new)), sum(map(len, new))


def _kept(marks: list[TurnMark], held: StoredHistory) -> int:
    """How many marks in front of ``marks`` are the held ones' tail, object for object (0: none known)."""
    if not marks or not held.marks:
        return 0
    first = marks[0]
    if held.marks[0] is first:  # the usual case: nothing dropped yet, or (next) one mark dropped
        drop = 0
    elif len(held.marks) > 1 and held.marks[1] is first:
        drop = 1
    else:
        drop = next((i for i, m in enumerate(held.marks) if m is first), -1)
    kept = len(held.marks) - drop
    if drop < 0 or kept > len(marks) or any(a is not b for a, b in zip(marks, held.marks[drop:], strict=False)):
        return 0
    return kept


def stored_dict(text: str, held: StoredHistory) -> dict[str, Any]:
    """The stored record as one JSON document (``MemoryStorage.inspect``): its text with the history put back."""
    data: dict[str, Any] = json.loads(text)
    if held.lines:
        data["history"] = [json.loads(line) for line in held.lines]
    return data
