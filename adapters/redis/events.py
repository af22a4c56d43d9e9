"""A job's durable events on Redis: the event stream, and the archive a finished job's events move into.

:class:`EventReads` is the part of :class:`~adapters.redis.RedisStorage`
that reads them (``events``: the archived ones, then the stream's, one
script) and archives a finished job's (:mod:`adapters.redis.archive`). The
functions decode a stream entry, shared with the live and newest-first readers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from adapters.redis import archive as redis_archive
from adapters.redis.connection import RedisConnection
from adapters.redis.values import _bounded, _load_part, _text
from pipelines.engine.errors import CorruptRecordError, PipelineError
from pipelines.engine.events import LAST_CURSOR, check_cursor
from pipelines.engine.models import Event

__all__ = ["EventReads", "entry", "event", "json_line"]

_log = logging.getLogger("pipelines")


class EventReads:
    """The durable events of a job: read, and archived once it finished (a part of ``RedisStorage``)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Events after the cursor ``after`` (a stream id): the archived ones, then the stream's (one script)."""
        # Checked before the limit, so a bad cursor is refused whatever the limit.
        if check_cursor(after, "event cursor") == LAST_CURSOR or limit <= 0:
            return []  # nothing sorts after the largest id, and XRANGE refuses to start past it
        limit = _bounded(limit)
        start = "-" if not after else f"({after}"  # "(" makes the start exclusive (Redis >= 6.2)
        k = self.conn.keys(job_id)
        what = f"reading the events of job {job_id!r}"
        reply = self.conn.run(self.conn.scripts.events, [k.record, k.events], [start, str(limit), after or ""], what,
                              write=False)
        self.conn.check_types(job_id, reply, what)
        blob, entries = reply
        stream = [(_text(entry_id), entry(fields)) for entry_id, fields in entries]
        try:
            archived = redis_archive.unpack(_text(blob)) if blob else []
        except ValueError as exc:
            raise CorruptRecordError(f"the archived events of job {job_id!r}: {exc}") from exc
        return [event(job_id, entry_id, raw) for entry_id, raw in redis_archive.merge(archived, stream, after,
                                                                                          limit)]

    def archive_events(self, job_id: str) -> bool:
        """Move a finished job's events from its stream into one compressed field (see :mod:`adapters.redis.archive`).

        ``True`` if they moved; ``False`` if there was nothing to move, the job
        is not finished, or it moved on meanwhile (nothing written; try again
        later). Readers see the same events with the same ids either way.
        """
        k = self.conn.keys(job_id)
        what = f"archiving the events of job {job_id!r}"
        reply = self.conn.run(self.conn.scripts.events, [k.record, k.events], ["-", "", ""], what, write=False)
        self.conn.check_types(job_id, reply, what)
        blob, entries = reply
        return self._archive(job_id, blob, entries, what)

    def _archive(self, job_id: str, blob: Any, entries: Any, what: str) -> bool:
        """Write the archive of ``entries`` (the whole stream, as read) after ``blob`` (the archive read with them)."""
        if not entries:
            return False
        k, ix = self.conn.keys(job_id), self.conn.layout.indexes_of(job_id)
        stream = [(_text(entry_id), entry(fields)) for entry_id, fields in entries]
        old = _text(blob) if blob else ""
        try:
            archived = redis_archive.unpack(old)
        except ValueError as exc:
            raise CorruptRecordError(f"the archived events of job {job_id!r}: {exc}") from exc
        new = redis_archive.pack([*archived, *stream])
        done = _text(self.conn.run(self.conn.scripts.archive, [k.record, k.events, ix.finished],
                               [job_id, stream[-1][0], str(len(old)), new], what))
        self.conn.check_types(job_id, done, what)
        return done == "ok"

    def archive_quietly(self, job_id: str, read: tuple[Any, Any] | None = None) -> None:
        """:meth:`archive_events` after a commit that finished the job, from ``read`` (the archive and the
        stream's entries, as the commit read them) when given.

        The commit stands whatever happens here: a failure is logged, and a job left unarchived still
        reads the same and is archived by a later call.
        """
        try:
            if read is None:
                self.archive_events(job_id)
            else:
                self._archive(job_id, *read, f"archiving the events of job {job_id!r}")
        except PipelineError as exc:
            _log.warning("job %s: its events stay in their stream (archiving failed: %s)", job_id, exc)


_E_FIELD = (b"e", "e")  # a stream entry's one field, as bytes or (decode_responses) as str


def entry(fields: Any) -> str:
    if isinstance(fields, list):  # from a script: [field, value, ...]
        if len(fields) == 2 and fields[0] in _E_FIELD:
            return _text(fields[1])  # every entry this storage writes: ~60 a finished job's archive reads
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    raw = (fields or {}).get(b"e") or (fields or {}).get("e") or ""
    return _text(raw)


def event(job_id: str, entry_id: Any, raw: Any) -> Event:
    if not isinstance(raw, str | bytes):
        raw = entry(raw)
    try:
        event = _load_part(raw)
    except (ValidationError, ValueError) as exc:
        raise CorruptRecordError(f"a stored event of job {job_id!r} does not parse: {exc}") from exc
    return event.model_copy(update={"id": _text(entry_id)})


def json_line(job_id: str, line: Any, what: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise CorruptRecordError(f"a stored {what} of job {job_id!r} does not parse: {exc}") from exc
