"""Reading a job's history from its end on Redis (:class:`~adapters.base.RecentHistory`).

The latest events are one ``XREVRANGE`` of the job's event stream; only when
the stream holds fewer than a page (a finished job whose events were moved
into the record's archive field, see :mod:`adapters.redis.archive`) is the
archive read too. The latest log lines are one ``LRANGE`` from the list's end
beside its ``LLEN``, pipelined: one round trip.
"""

from __future__ import annotations

from pydantic import ValidationError

from adapters.redis import archive as redis_archive
from adapters.redis.client import _mapped
from adapters.redis.connection import RedisConnection
from adapters.redis.events import entry, event
from adapters.redis.values import _bounded, _text
from pipelines.engine.errors import CorruptRecordError
from pipelines.engine.events import LAST_CURSOR, check_cursor
from pipelines.engine.models import Event, LogEntry

__all__ = ["RecentReads"]


class RecentReads:
    """A job's latest events and log lines, newest first (a part of :class:`~adapters.redis.RedisStorage`)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, before the cursor ``before`` (a stream id)."""
        cursor = check_cursor(before, "event cursor")
        if limit <= 0:
            return []
        limit = _bounded(limit)
        k = self.conn.keys(job_id)
        top = "+" if cursor is None or cursor == LAST_CURSOR else f"({cursor}"
        with _mapped(f"reading the events of job {job_id!r}"):
            entries = [(_text(i), entry(f)) for i, f in self.conn.client.xrevrange(k.events, top, "-", count=limit)]
            blob = self.conn.client.hget(k.record, redis_archive.ARCHIVE_FIELD) if len(entries) < limit else None
        if blob:
            try:
                archived = redis_archive.unpack(_text(blob))
            except ValueError as exc:
                raise CorruptRecordError(f"the archived events of job {job_id!r}: {exc}") from exc
            if cursor is not None and cursor != LAST_CURSOR:
                cut = redis_archive.entry_key(cursor)
                archived = [e for e in archived if redis_archive.entry_key(e[0]) < cut]
            entries.extend(reversed(archived[-(limit - len(entries)):]))
        return [event(job_id, i, raw) for i, raw in entries]

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """The ``limit`` log entries before the last ``skip``, oldest first, and how many there are."""
        skip, limit = min(max(0, skip), 1 << 61), min(max(0, limit), 1 << 61)  # LRANGE takes 64-bit indexes
        k = self.conn.keys(job_id)
        with _mapped(f"reading the logs of job {job_id!r}"):
            pipe = self.conn.client.pipeline(transaction=False)
            pipe.llen(k.logs)
            # From the end: -skip-limit .. -skip-1; a start before the list's head is clamped by Redis.
            pipe.lrange(k.logs, -(skip + limit), -(skip + 1)) if limit else pipe.llen(k.logs)
            total, lines = pipe.execute()
        if not limit or skip >= int(total):
            return [], int(total)
        try:
            return [LogEntry.model_validate_json(line) for line in lines], int(total)
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored log entry of job {job_id!r} does not parse: {exc}") from exc
