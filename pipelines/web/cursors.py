"""The cursors a client of :mod:`pipelines.web.sse` resumes from: parsed, compared, and checked against the stream.

A cursor is a part id (``<n>`` on memory and SQLite, ``<ms>-<seq>`` on Redis), or in the ``ai-sdk``
format an event id ``<part id>:<k>[:<flags>]``. The SSE endpoint answers 400 for one this job's stream
never gave out (:func:`check_in_stream`), as far as the stream still shows it: parts that are gone (a
run trimmed off the live stream, a finished job's live parts after ``live_ttl``) leave gaps a cursor of
another job can fall into, and memory and SQLite number each job's parts from its own counter, so a
cursor of another job in the same range names a part of this one.
"""

from __future__ import annotations

from pipelines.engine.models import Event
from pipelines.errors import InvalidInputError
from pipelines.web.core import is_count

__all__ = ["check_in_stream", "parts_after", "parts_upto", "split"]

# What a worker publishes outside any commit: the parts a live stream drops (older runs, a finished job's
# after live_ttl). The durable events stay on every backend.
_EPHEMERAL = frozenset({"attempt_started", "text_delta"})
_FLAGS = frozenset({"h", "c", "hc", "w", "cw"})


def split(cursor: str | None) -> tuple[str | None, int | None, str]:
    """An ``ai-sdk`` event id ``<part id>:<k>[:<flags>]`` as (part id, k, flags); a bare part id is (part id, None, "").

    The flags say how the stream that gave it out was made: ``h`` held its text, ``c`` was a replay of
    a run's latest attempts only, ``w`` (on a ``turn_committed``'s chunks) sent its turn's text whole, none of
    it having come live (see :meth:`pipelines.web.sse._AiSdkEmitter.replay_ai`).
    """
    if cursor is None or ":" not in cursor:
        return cursor, None, ""
    flags = ""
    head, _, tail = cursor.rpartition(":")
    if tail in _FLAGS:
        cursor, flags = head, tail
    part, _, k = cursor.rpartition(":")
    if not (part and is_count(k) and str(int(k)) == k):
        raise InvalidInputError(f"cursor {cursor!r:.60} is not an event id: expected <part id>:<chunk number>")
    return part, int(k), flags


def check_in_stream(cursor: str, parts: list[Event], job_id: str) -> None:
    """Raise :class:`InvalidInputError` unless ``cursor`` may be a part id ``parts`` (the whole stream) gave out.

    ``"0"`` is before every part on every backend, and so is any id older than the job's first part (a
    cursor of an earlier job under the same id): either gets the stream from its start, skipping nothing.
    Past the first part it must name a part, except where parts may be gone: behind the first ephemeral
    part the stream holds (a live stream keeps a run's parts from its start on and drops the older ones
    whole), or anywhere once it holds none. There an unknown id is taken as a part that is gone.
    """
    if cursor == "0":
        return
    if not parts or not _comparable(cursor, parts[-1].id) or _key(cursor) > _key(parts[-1].id):
        raise InvalidInputError(f"cursor {cursor!r:.60} is not a part id of job {job_id!r}'s stream")
    key = _key(cursor)
    if key < _key(parts[0].id) or any(p.id == cursor for p in parts):
        return
    if any(p.type in _EPHEMERAL and _key(p.id) < key for p in parts):
        raise InvalidInputError(f"cursor {cursor!r:.60} names no part of job {job_id!r}'s stream (another job's?)")


def parts_after(parts: list[Event], cursor: str | None) -> list[Event]:
    if cursor is None:
        return parts
    return [p for p in parts if _key(p.id) > _key(cursor)]


def parts_upto(parts: list[Event], cursor: str) -> list[Event]:
    return [p for p in parts if _key(p.id) <= _key(cursor)]


def _key(cursor: str) -> tuple[int, ...]:
    return tuple(int(x) for x in cursor.split("-"))


def _comparable(a: str, b: str) -> bool:
    return a.count("-") == b.count("-")
