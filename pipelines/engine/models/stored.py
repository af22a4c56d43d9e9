"""The JSON text storage keeps: records, turn marks, log lines and events, each checked before it is written.

Adapters call these before touching storage: a field that could not be read back raises
:class:`~pipelines.engine.errors.StateNotSerializableError` naming it, a text over
``pipelines.engine.models.MAX_VALUE_BYTES`` :class:`~pipelines.engine.errors.ValueTooLargeError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import to_json as _to_json

import pipelines.engine.models as _models  # the package holds the MAX_VALUE_BYTES setting, read at each check
from pipelines.engine.errors import StateNotSerializableError
from pipelines.engine.models.records import NO_USAGE, Event, JobRecord, LogEntry, TurnMark
from pipelines.engine.models.values import (
    _ENUM_VALUE_TYPES,
    _INT_BOUND,
    MAX_VALUE_DEPTH,
    _convert,
    _isfinite,
    _plain,
    _plain_dict,
    _RefusedError,
    check_size,
)

__all__ = ["check_event_size", "check_record_fields", "dump_events", "dump_fields", "dump_logs", "dump_marks",
           "detached", "dump_record", "dump_record_apart", "plain_event", "record_fields", "changed_fields",
           "as_stored"]

# Fields whose entries are separate values (step results, a person's inputs): each entry gets the
# whole MAX_VALUE_DEPTH, as when it was journaled; the dict around them is the envelope's level.
_ENTRY_FIELDS: Final = frozenset({"journal", "inputs"})


def _check_fields(model: BaseModel, what: str, skip: frozenset[str] = frozenset()) -> None:
    """Check every stored field of ``model`` (and of the models in it) by the rules of :func:`to_json_value`.

    ``skip``: top-level fields not written with it (a record's history kept apart).
    """
    try:
        _scan(model, skip)
    except _RefusedError as exc:
        raise StateNotSerializableError(f"{what}: {''.join(reversed(exc.args[1:]))} {exc.args[0]}") from None


def _excluded(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that are never written (``Field(exclude=True)``): nothing to check there."""
    names = _EXCLUDED.get(cls)
    if names is None:
        names = _EXCLUDED[cls] = frozenset(n for n, f in cls.model_fields.items() if f.exclude)
    return names


_EXCLUDED: dict[type[BaseModel], frozenset[str]] = {}


def _scan(model: BaseModel, also: frozenset[str] = frozenset()) -> None:
    skip = _excluded(type(model))
    _scan_items(model.__dict__.items(), skip | also if also else skip)


def _scan_items(items: Iterable[tuple[str, Any]], skip: frozenset[str]) -> None:
    # Most fields are short ASCII strings, ints, floats or None: settled inline here, since a
    # call per field would cost more than the dump itself. The path of a refused value is built
    # only on the way out of a failure (exc.args[1:], innermost first), never on the hot path.
    for name, value in items:
        t = type(value)
        if t is str:
            ok = value.isascii()
        elif t is int:
            ok = -_INT_BOUND < value < _INT_BOUND
        elif t is float:
            ok = _isfinite(value)
        elif t is dict or t is list:
            ok = not value
        else:
            ok = value is None or t is bool or t in _PLAIN_ENUMS or _stored_as_value(value)
        if not ok and name not in skip:
            _scan_field(value, name)


def _stored_as_value(value: Any) -> bool:
    """Whether ``value`` is an enum member stored as its value (a str or an int); remembers enums all of whose are."""
    if not isinstance(value, Enum):
        return False
    cls = type(value)
    if all(type(m.value) in _ENUM_VALUE_TYPES for m in cls):  # members are fixed when the class is made
        _PLAIN_ENUMS.add(cls)
        return True
    return type(value.value) in _ENUM_VALUE_TYPES


_PLAIN_ENUMS: set[type] = set()  # enum classes every member of which is stored as its value (JobStatus, ...)


def _scan_field(value: Any, name: str) -> None:
    joint = "."
    try:
        if isinstance(value, BaseModel):
            _scan(value)
        elif type(value) is list and isinstance(value[0], BaseModel) and all(isinstance(v, BaseModel) for v in value):
            for item in value:  # the record's turn history
                _scan(item)
        else:
            joint = ""
            room = MAX_VALUE_DEPTH + 1 if name in _ENTRY_FIELDS else MAX_VALUE_DEPTH
            if not _plain(value, room):
                _convert(value, room)
    except _RefusedError as exc:
        if joint and type(value) is list:  # which item: looked up only now that one was refused
            joint = f"[{next(i for i, v in enumerate(value) if _refuses(v))}]."
        exc.args = (*exc.args, joint, name) if joint else (*exc.args, name)
        raise


def _refuses(model: BaseModel) -> bool:
    try:
        _scan(model)
    except _RefusedError:
        return True
    return False


def _model_json(model: BaseModel, what: str, **options: Any) -> str:
    """``model`` as the JSON text storage keeps, after checking every field; errors name ``what``."""
    _check_fields(model, what)
    try:
        text = model.model_dump_json(**options)
    except (ValueError, RecursionError) as exc:  # a safety net: _check_fields should have said why
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def dump_record(record: JobRecord, what: str) -> str:
    """The JSON text storage keeps for ``record`` (defaults left out).

    Every field is checked first by the rules of :func:`to_json_value`, so
    what is written reads back; a bad value raises
    :class:`StateNotSerializableError` naming ``what`` and the field, a text
    over :data:`MAX_VALUE_BYTES` :class:`ValueTooLargeError`. Nothing is
    written by this function: adapters call it before touching storage.
    """
    return _model_json(record, what, exclude_defaults=True)


def dump_record_apart(record: JobRecord, what: str) -> str:
    """:func:`dump_record` without the turn history, for a storage that keeps it apart (:func:`dump_marks`)."""
    _check_fields(record, what, _HISTORY)
    try:
        text = record.model_dump_json(exclude_defaults=True, exclude=_NO_HISTORY)
    except (ValueError, RecursionError) as exc:  # a safety net: _check_fields should have said why
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def check_record_fields(record: JobRecord, what: str, skip: frozenset[str] = frozenset()) -> None:
    """Check the fields of ``record`` a storage writes, but its history and ``skip``, as :func:`dump_record` does.

    For a storage that writes some fields only (a delta of what it holds); raises like :func:`dump_record`.
    """
    _check_fields(record, what, skip | _HISTORY)


_HISTORY: Final = frozenset({"history"})
_NONE: Final[frozenset[str]] = frozenset()
_NO_HISTORY: Final[set[str]] = {"history"}

# The fields a record's JSON holds (without its history, which a storage keeps apart).
_STORED: Final = tuple(n for n, f in JobRecord.model_fields.items() if not f.exclude and n != "history")
_STORED_SET: Final = frozenset(_STORED)


def record_fields() -> tuple[str, ...]:
    """The names of the record's stored fields (its JSON without the history), in the order JSON writes them."""
    return _STORED


def changed_fields(record: JobRecord, since: JobRecord, known: Iterable[str] = ()) -> set[str]:
    """``known`` and the stored fields of ``record`` that are not the very objects ``since`` holds.

    The engine builds each record from the one it loaded or committed (``model_copy``) and changes no
    object a record holds, so a field it did not set is the same object, which was checked when ``since``
    was stored; one it set is another (an equal int or text at most costs its check again).
    """
    out = set(known)
    new, old = record.__dict__, since.__dict__
    for name in _STORED:
        if new[name] is not old[name]:
            out.add(name)
    return out


def as_stored(record: JobRecord) -> JobRecord:
    """``record`` as its JSON reads back: without what storage keeps beside it (a request, the inbox, dropped usage,
    the interrupted turns)."""
    if record.control is None and not record.inbox and record.dropped == NO_USAGE and not record.interrupted:
        return record
    return record.model_copy(update={"control": None, "inbox": 0, "dropped": NO_USAGE, "interrupted": 0})


def detached(record: JobRecord) -> JobRecord:
    """A copy of ``record`` sharing no object with it: what a caller is handed of a record it just committed.

    A storage may keep the committed record object itself and hand it to the next lease as it is
    (:func:`as_stored`): a caller changing the record, state or options it was given must change
    nothing stored.
    """
    return record.model_copy(deep=True)


def dump_fields(record: JobRecord, fields: set[str], what: str) -> str:
    """The JSON object of ``record``'s ``fields`` (defaults left out), checked like :func:`dump_record` does them."""
    unknown = fields - _STORED_SET
    if unknown:
        raise ValueError(f"not stored fields of a record: {sorted(unknown)}")
    # Only the named fields are looked at (a delta is a few of the record's ~40): not a walk of all of them.
    stored = record.__dict__
    try:
        _scan_items([(name, stored[name]) for name in fields], _NONE)
    except _RefusedError as exc:
        raise StateNotSerializableError(f"{what}: {''.join(reversed(exc.args[1:]))} {exc.args[0]}") from None
    try:
        text = record.model_dump_json(include=fields, exclude_defaults=True)
    except (ValueError, RecursionError) as exc:  # a safety net: the check should have said why
        raise StateNotSerializableError(f"{what} is not JSON-serialisable: {exc}") from exc
    return check_size(text, what)


def dump_marks(marks: Sequence[TurnMark], what: str, *, start: int = 0) -> list[str]:
    """The lines of ``marks[start:]``, for a storage that keeps a record's turn history apart, a mark a line.

    Checked like :func:`dump_record` (a refused mark is named ``history[i]``, its place in the
    record); the record itself is then dumped without its history. A history changes by a mark
    a turn but holds up to ``HISTORY_LIMIT``, so a storage that knows the lines of the marks it
    already holds (the very objects it handed out) dumps only the new ones.
    """
    lines = []
    for i in range(start, len(marks)):
        mark = marks[i]
        try:
            _scan(mark)
        except _RefusedError as exc:
            raise StateNotSerializableError(
                f"{what}: history[{i}].{''.join(reversed(exc.args[1:]))} {exc.args[0]}") from None
        lines.append(check_size(mark.model_dump_json(), what))
    return lines


def dump_logs(entries: Sequence[LogEntry]) -> list[str]:
    """Log entries as the JSON lines storage keeps (checked like :func:`dump_record`)."""
    return [_model_json(e, "a log entry") for e in entries]


def dump_events(events: Sequence[Event]) -> list[str]:
    """Events as the JSON lines storage keeps: no ``id`` (storage assigns it) and no default fields."""
    return [_event_json(e) for e in events]


_NO_ID: Final[set[str]] = {"id"}
_EVENT_FIELDS: Final = frozenset(Event.model_fields)


def plain_event(e: Event) -> bool:
    """Whether every field of ``e`` is plain JSON data storage keeps as it is (the usual event).

    The hot path of writing events (several a turn, and every live-stream part): the checks of
    :func:`dump_events`, inlined for the fields an event has. ``False`` sends a writer to the
    general path, which converts what it can and says what is wrong with the rest.
    """
    f = e.__dict__
    ts, turn, phase, kind, data = f["timestamp"], f["turn"], f["phase"], f["type"], f["data"]
    try:
        return (type(ts) is float and _isfinite(ts) and type(kind) is str and kind.isascii()
                and (turn is None or (type(turn) is int and -_INT_BOUND < turn < _INT_BOUND))
                and (phase is None or (type(phase) is str and phase.isascii()))
                and type(data) is dict and (not data or _plain_dict(data, MAX_VALUE_DEPTH))
                and len(f) == len(_EVENT_FIELDS))
    except _RefusedError:
        return False


def _event_json(e: Event) -> str:
    if not plain_event(e):
        return _model_json(e, f"event {e.type!r}", exclude=_NO_ID, exclude_defaults=True)
    f = e.__dict__
    ts, turn, phase, kind, data = f["timestamp"], f["turn"], f["phase"], f["type"], f["data"]
    # What model_dump_json(exclude=_NO_ID, exclude_defaults=True) writes (the same keys, order and text),
    # without pydantic's model serializer, which costs more than the check above for an event's five fields.
    out: dict[str, Any] = {"timestamp": ts, "type": kind}
    if turn is not None:
        out["turn"] = turn
    if phase is not None:
        out["phase"] = phase
    if data:
        out["data"] = data
    return check_event_size(_to_json(out).decode(), kind)


def check_event_size(text: str, kind: str) -> str:
    """:func:`check_size` for the stored text of an event of type ``kind``, which the error names.

    Several events a turn: the description is built only for a text that could be too large.
    """
    return text if len(text) * 4 <= _models.MAX_VALUE_BYTES else check_size(text, f"event {kind!r}")
