"""A finished job's durable events, archived: one compressed field of its record hash instead of a stream.

The event stream holds five small entries a turn, about 0.8 KiB of Redis
memory per turn once the stream's own overhead is counted: twice the
transcript of a typical turn, kept for as long as the job is. When a job
finishes, :meth:`adapters.redis.RedisStorage.archive_events` moves those
entries into the record hash's ``evz`` field, zlib-compressed (JSON lines of
entry id and entry, base64 so that a client made with ``decode_responses``
reads it too), about a tenth of the size.

The stream is trimmed to empty, not deleted: an empty stream keeps the last
id it gave out, so the events of a job that is continued later (a new
message, a retry) still get ids after the archived ones. Readers merge the
archive and the stream (:func:`merge`), so a cursor means what it meant
before, wherever its event now lives; deleting the job deletes the archive
with the record hash.

The archive is written by one script that checks, in the same step, that the
job is still finished, that the stream's newest entry is the one the archive
was built up to and that the archive it extends is the one read: a job that
moved on meanwhile is left for the next time (``"moved"``), never half moved.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence

__all__ = ["ARCHIVE_FIELD", "entry_key", "merge", "pack", "unpack"]

ARCHIVE_FIELD = "evz"
"""The record-hash field holding the archived events."""

_LEVEL = 6  # zlib's default: within a few percent of level 9 on these JSON lines, at a third of the time


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream id (``"<ms>-<seq>"``) as a sortable pair; ``ValueError`` for anything else."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def pack(entries: Sequence[tuple[str, str]]) -> str:
    """``(id, entry)`` pairs, oldest first, as the archive field's text.

    An entry is the stream entry's ``e`` field: JSON, which never holds a raw
    tab or newline (both are escaped inside strings), so the lines split back exactly.
    """
    text = "\n".join(f"{entry_id}\t{entry}" for entry_id, entry in entries)
    return base64.b64encode(zlib.compress(text.encode(), _LEVEL)).decode("ascii")


def unpack(blob: str | bytes) -> list[tuple[str, str]]:
    """The ``(id, entry)`` pairs of an archive field; ``ValueError`` if it is not one."""
    if not blob:
        return []
    try:
        text = zlib.decompress(base64.b64decode(blob, validate=True)).decode()
    except (zlib.error, ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"the archived events do not decode: {exc}") from exc
    out = []
    for line in text.split("\n"):
        entry_id, tab, entry = line.partition("\t")
        if not tab:
            raise ValueError(f"an archived event line has no id: {line[:80]!r}")
        out.append((entry_id, entry))
    return out


def merge(archived: Sequence[tuple[str, str]], stream: Sequence[tuple[str, str]], after: str | None,
          limit: int) -> list[tuple[str, str]]:
    """Up to ``limit`` entries after the cursor ``after``: the archived ones first, then the stream's.

    Every stream entry is newer than every archived one (see the module
    docstring), so the two are concatenated, not interleaved.
    """
    if after:
        cut = entry_key(after)
        archived = [e for e in archived if entry_key(e[0]) > cut]
    return [*archived, *stream][:max(0, limit)]
