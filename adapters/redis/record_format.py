"""How a job's record is written in its Redis hash: whole (format 1), as a delta of a base (2), compact (3).

**Format 1** (every version reads it): the record's JSON, without its turn history, in the hash's
``data`` field, written whole by every commit.

**Format 2** (read by the versions from the one that brought it): the record as of its last whole
write in ``base``, and in ``dx`` a JSON object of the top-level fields that differ from it, rewritten
whole by each commit (``data`` absent). A turn changes a few fields (the checkpoint, the version, the
usage, counters and times), so a commit sends those instead of the whole record: about 60 % of its
bytes in W1 (bench/README.md, figure 4). A reader puts the two together as one JSON text, ``dx``'s
fields after ``base``'s: a JSON object's later member wins (pydantic-core and :mod:`json` both read it
so; a test holds pydantic-core to it). A commit sends a delta only when the record hash holds what its
worker last saw (the stored token, as the turn history's delta: :mod:`adapters.redis.records`), else it
writes the record whole, in ``base``.

**Format 3** (this version and later): format 2, with ``dx`` and every stream entry (the events and
the live parts) written compact: each of the engine's own key runs as one control byte
(:mod:`adapters.redis.compact`), about 40 % of those texts; so is a journaled model answer after its
message (:func:`~adapters.redis.compact.narrow_answer`; added to format 3 before any release held it, so
every reader of format 3 widens it). Every reader of this version widens what it
reads from those places, which leaves a text written whole as it is: it reads the three formats alike.

**Which format a storage writes** is the prefix's, recorded in its layout key beside the bucket
count (:func:`adapters.redis.keys.layout_key`): ``buckets=<n>`` is format 1, ``buckets=<n>
records=2`` format 2, ``buckets=<n> records=3`` format 3. A prefix first written by this version
records format 3. Versions before it that record a layout compare the whole value where they check it
(a worker's start, a first write, a first index read) and refuse such a prefix, naming it; a record
they read without that check reads as unreadable (format 2's readers: an event or a ``dx`` with a code
byte does not parse), never as another record. A prefix written by an earlier version stays in its
format until it is moved on, in two steps:

1. run this version (or a later one) in every process on the prefix: it reads every format and
   writes the prefix's, so the earlier version's processes read everything it writes;
2. then :func:`upgrade_record_format` (``pipelines upgrade-records``):
   processes started after it write format 3; ones started before go on writing the earlier format
   until restarted, which every version from this one reads. A format-1 commit of a newer record
   writes it whole in ``data`` again.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic_core import from_json, to_json

from adapters.redis.compact import widen
from adapters.redis.keys import layout_key
from adapters.redis.values import _text
from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import JobRecord, changed_fields, check_size, dump_fields, record_fields

__all__ = ["LAYOUT_SUFFIX", "NEWEST", "changed_fields", "check_known", "delta_json", "format_of", "merged",
           "record_fields", "stored_text", "upgrade_record_format"]

NEWEST: Final = 3
"""The record format a prefix first written by this version records."""

LAYOUT_SUFFIX: Final = {1: "", 2: " records=2", 3: " records=3"}
"""What each format adds to the layout key's ``buckets=<n>``."""


def format_of(stored: str, buckets: str) -> int | None:
    """The format the layout ``stored`` records for a storage whose layout is ``buckets``; None: another layout."""
    for fmt, suffix in LAYOUT_SUFFIX.items():
        if stored == buckets + suffix:
            return fmt
    return None


def check_known(prefix: str, stored: str, buckets: str) -> None:
    """Raise :class:`ConfigurationError` if the layout ``stored`` names this storage's buckets in a record format
    this version does not know: a newer version wrote the prefix (nothing of it is read or written)."""
    if stored.startswith(buckets + " records=") and format_of(stored, buckets) is None:
        raise ConfigurationError(
            f"the jobs under prefix {prefix!r} are in a record format this version does not know ({stored}): "
            "a newer version wrote them; run that version (or a later one) on this prefix")


def merged(base: str, dx: str) -> str:
    """The record's JSON text: ``base`` with ``dx``'s members after its own (a later member wins).

    ``dx`` as stored: compact in format 3 (widened here).
    """
    dx = widen(dx).strip()
    if not dx or dx[1:].strip() == "}":  # no member ("{}", or "{ }" written by hand)
        return base
    body = base.rstrip()[:-1].rstrip()
    return f"{body}{'' if body.endswith('{') else ','}{dx[1:]}"


def stored_text(data: Any, base: Any, dx: Any) -> str | None:
    """A record hash's record as one JSON text, from its ``data``, ``base`` and ``dx`` fields; None: it has none."""
    if data:
        return _text(data)
    return merged(_text(base), _text(dx) if dx else "") if base else None


# What each stored field is when left out (a delta writes a field back at its default with it).
_DEFAULT_JSON: Final = {n: to_json(JobRecord.model_fields[n].get_default(call_default_factory=True)).decode()
                        for n in record_fields() if not JobRecord.model_fields[n].is_required()}


def delta_json(record: JobRecord, fields: set[str], what: str) -> str:
    """The JSON object of ``record``'s ``fields``, checked like a whole record: ``dx``.

    Left out like the whole record's defaults, except that a field back at its default is written
    with it (its base may hold another value).
    """
    text = dump_fields(record, fields, what)
    # The fields the dump left out (at their default): exactly those its JSON does not name.
    back = fields.difference(from_json(text))
    if back:
        extra = ",".join(f'"{n}":{_DEFAULT_JSON[n]}' for n in record_fields() if n in back)
        text = check_size(f"{text[:-1]}{',' if len(text) > 2 else ''}{extra}}}", what)
    return text


def upgrade_record_format(storage: Any) -> bool:
    """Step 2 of moving a prefix to the newest record format (3): record it in the prefix's layout key.

    From format 1 or 2 (see the module). Run it once every process on the prefix runs this version or
    a later one (step 1): processes started afterwards, and ``storage`` itself, write format 3; ones
    started before go on writing the earlier format until they restart. ``True`` if the prefix moved
    now, ``False`` if it was there already. A prefix whose recorded layout has other buckets (or names
    a format this version does not know) raises :class:`ConfigurationError`, with nothing written.
    """
    conn = storage.conn
    buckets = conn.layout.description
    older = [buckets + LAYOUT_SUFFIX[f] for f in sorted(LAYOUT_SUFFIX) if f != NEWEST]
    reply = conn.run(conn.scripts.upgrade_records, [layout_key(conn.prefix)],
                     [buckets + LAYOUT_SUFFIX[NEWEST], *older],
                     f"upgrading the record format of prefix {conn.prefix!r}")
    if not isinstance(reply, int):
        check_known(conn.prefix, _text(reply), buckets)
        raise ConfigurationError(f"the jobs under prefix {conn.prefix!r} were written with {_text(reply)}, this "
                                 f"storage uses {buckets}: nothing was upgraded")
    conn.record_format = NEWEST
    return bool(reply)
