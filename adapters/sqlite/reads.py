"""What an SQLite storage reads: records, transcripts, logs, events, the live stream, listings, indexes.

Each read is one read transaction (one snapshot), fetched whole before it
ends, so no reader ever holds the file's WAL open past its own statement: a
follower waiting for the live stream holds no transaction while it waits.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from collections.abc import Sequence
from typing import Any, cast

from pydantic import ValidationError

from adapters.base import FinishedEntry, LeaseState, parse_cursor
from adapters.live_wakeup import wait_on
from adapters.sqlite.connection import Database
from adapters.sqlite.history import Histories
from adapters.sqlite.wakeup import Wakeup
from pipelines.engine.errors import CorruptRecordError, InvalidInputError
from pipelines.engine.events import check_cursor
from pipelines.engine.models import Event, JobRecord, JobStatus, JSONValue, LogEntry, Message, Usage

__all__ = ["RECORD_COLUMNS", "SQLiteReads", "load_record", "position"]

logger = logging.getLogger("pipelines")

_HEADS_CHUNK = 500  # job ids per query of the followers' watcher (SQLite's bound-parameter limit is far above)
_SQL_INT_MAX = 2**63 - 1  # a cursor past it names a place after every part SQLite can number


def _count(n: int) -> int:
    """A count or position as SQLite can bind it: ``limit=10**20`` means "all" here as in memory (no OverflowError)."""
    return min(max(0, n), _SQL_INT_MAX)

RECORD_COLUMNS = ("job_id, record, journal_version = version AND EXISTS (SELECT 1 FROM journal "
                  "WHERE journal.job_id = jobs.job_id), control, dropped, "
                  "(SELECT count(*) FROM inbox WHERE inbox.job_id = jobs.job_id), "
                  "CASE WHEN lapsed_at = version THEN lapses ELSE 0 END")
"""The columns :func:`load_record` reads, in its order. The third says whether the journal holds steps of the
record's version: a commit empties the journal but leaves it at the version it wrote, so after most commits a
record is loaded without a second statement for an empty journal."""


def position(after: str | None, what: str) -> int:
    """The part number a cursor names (0 for none); the shared check first, so every backend refuses alike."""
    if check_cursor(after, what) is None:
        return 0
    assert after is not None
    if "-" in after:
        raise InvalidInputError(f"{what} {after!r} is not an id this storage gave out (a number, not <ms>-<seq>)")
    return min(int(after), _SQL_INT_MAX)


def _json(job_id: str, text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CorruptRecordError(f"a stored {what} of job {job_id!r} does not parse: {exc}") from exc


def load_record(conn: sqlite3.Connection, row: Sequence[Any], kept: Histories | None) -> JobRecord:
    """The record of a :data:`RECORD_COLUMNS` row, with its journal, control request, inbox, dropped usage and
    interrupted turns
    (parsed apart from its history when ``kept`` holds the text: see :mod:`adapters.sqlite.history`).

    ``kept``: only for the engine's lease, which shares the kept history marks (its commit then dumps only
    the marks it adds); a reader (``None``) gets marks of its own, parsed, so changing them changes nothing
    a later load or fork sees.
    """
    job_id, text, journaled, control, dropped, waiting, lapses = row
    try:
        rec = JobRecord.model_validate_json(text) if kept is None else kept.load(job_id, text)
    except ValidationError as exc:
        raise CorruptRecordError(f"stored record of job {job_id!r} does not parse: {exc}") from exc
    if rec.checkpoint is not None and journaled:
        steps = conn.execute("SELECT key, body FROM journal WHERE job_id = ?", (job_id,)).fetchall()
        if steps:
            journal = {k: _json(job_id, v, "step result") for k, v in steps}
            rec = rec.model_copy(update={"checkpoint": rec.checkpoint.model_copy(update={"journal": journal})})
    update: dict[str, Any] = {}
    if control is not None:
        update["control"] = control
    if waiting:
        update["inbox"] = int(waiting)
    if lapses or rec.interrupted:
        update["interrupted"] = int(lapses)
    if dropped:
        try:
            update["dropped"] = Usage.model_validate_json(dropped)
        except ValidationError as exc:
            raise CorruptRecordError(f"the dropped usage of job {job_id!r} does not parse: {exc}") from exc
    return rec.model_copy(update=update) if update else rec


def _events(job_id: str, rows: list[Any]) -> list[Event]:
    out = []
    for seq, body in rows:
        try:
            out.append(Event.model_validate_json(body).model_copy(update={"id": str(seq)}))
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored event of job {job_id!r} does not parse: {exc}") from exc
    return out


class SQLiteReads:
    """The read side of :class:`~adapters.sqlite.SQLiteStorage` (history, live stream, listings, indexes)."""

    _db: Database
    _wakeup: Wakeup
    _kept: Histories

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record with its current journal, control request and inbox length, or ``None``."""
        def read(conn: sqlite3.Connection) -> JobRecord | None:
            row = conn.execute(f"SELECT {RECORD_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            return None if row is None else load_record(conn, row, None)

        return self._db.read(read, f"loading job {job_id!r}")

    def lease_owner(self, job_id: str) -> str | None:
        return self.lease_state(job_id).owner

    def fenced_answers(self, job_id: str) -> list[JSONValue]:
        """What fenced-off attempts of the job were answered, oldest first (the newest FENCED_KEPT)."""
        rows = self._db.read(lambda c: c.execute("SELECT body FROM fenced WHERE job_id = ? ORDER BY pos",
                                                 (job_id,)).fetchall(), f"reading the fenced-off answers of {job_id!r}")
        return [_json(job_id, body, "fenced-off answer") for (body,) in rows]

    def lease_state(self, job_id: str) -> LeaseState:
        """A lease let go (or reaped from a dead process) clears its owner; one that ran out keeps it."""
        row = self._db.read(lambda c: c.execute("SELECT lease_owner, lease_expires FROM jobs WHERE job_id = ?",
                                                (job_id,)).fetchone(), f"reading the lease of job {job_id!r}")
        if row is None or row[0] is None:
            return LeaseState(None, False)
        live = row[1] > self._now()
        return LeaseState(str(row[0]) if live else None, not live)

    def _now(self) -> float:
        raise NotImplementedError

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Committed messages ``[start:stop]`` (Python slice semantics) in order."""
        def read(conn: sqlite3.Connection) -> list[Any]:
            lo, hi = start, stop
            if lo < 0 or (hi is not None and hi < 0):
                n = conn.execute("SELECT count(*) FROM messages WHERE job_id = ?", (job_id,)).fetchone()[0]
                lo, hi, _ = slice(start, stop).indices(n)
            return conn.execute("SELECT body FROM messages WHERE job_id = ? AND pos >= ? AND pos < ? ORDER BY pos",
                                (job_id, _count(lo), _SQL_INT_MAX if hi is None else _count(hi))).fetchall()

        rows = self._db.read(read, f"reading the transcript of job {job_id!r}")
        return [_json(job_id, r[0], "transcript message") for r in rows]

    def logs(self, job_id: str) -> list[LogEntry]:
        rows = self._db.read(lambda c: c.execute("SELECT body FROM logs WHERE job_id = ? ORDER BY pos",
                                                 (job_id,)).fetchall(), f"reading the logs of job {job_id!r}")
        try:
            return [LogEntry.model_validate_json(r[0]) for r in rows]
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored log entry of job {job_id!r} does not parse: {exc}") from exc

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Committed events after the cursor ``after`` (a part number), in order."""
        start = position(after, "event cursor")
        rows = self._db.read(lambda c: c.execute(
            "SELECT seq, body FROM parts WHERE job_id = ? AND durable = 1 AND seq > ? ORDER BY seq LIMIT ?",
            (job_id, start, _count(limit))).fetchall(), f"reading the events of job {job_id!r}")
        return _events(job_id, rows)

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, before the cursor ``before`` (a part number)."""
        stop = position(before, "event cursor") if before is not None else _SQL_INT_MAX
        rows = self._db.read(lambda c: c.execute(
            "SELECT seq, body FROM parts WHERE job_id = ? AND durable = 1 AND seq < ? ORDER BY seq DESC LIMIT ?",
            (job_id, stop, _count(limit))).fetchall(), f"reading the events of job {job_id!r}")
        return _events(job_id, rows)

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """The ``limit`` log entries before the last ``skip``, oldest first, and how many there are."""
        def read(conn: sqlite3.Connection) -> tuple[list[Any], int]:
            # Positions run 0, 1, 2, ... (writes.append): the last one tells how many, from the key, no count.
            top = conn.execute("SELECT max(pos) FROM logs WHERE job_id = ?", (job_id,)).fetchone()[0]
            total = 0 if top is None else int(top) + 1
            stop = max(0, total - max(0, skip))
            rows = conn.execute("SELECT body FROM logs WHERE job_id = ? AND pos >= ? AND pos < ? ORDER BY pos",
                                (job_id, max(0, stop - _count(limit)), stop)).fetchall()
            return rows, int(total)

        rows, total = self._db.read(read, f"reading the logs of job {job_id!r}")
        try:
            return [LogEntry.model_validate_json(r[0]) for r in rows], total
        except ValidationError as exc:
            raise CorruptRecordError(f"a stored log entry of job {job_id!r} does not parse: {exc}") from exc

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor; waits up to ``block`` seconds for one (woken at once by this process's
        writes, and looking again every few milliseconds for other processes')."""
        start = position(after, "stream cursor")
        deadline = time.monotonic() + (block or 0.0)
        while True:
            seen = self._wakeup.count
            rows, known = self._live(job_id, start, limit)
            left = deadline - time.monotonic()
            if rows or not known or left <= 0:
                return _events(job_id, rows)
            self._wakeup.wait(seen, left)

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """:meth:`read_live` for ``async`` code: the wait is a future (no thread), woken by this process's
        writes within milliseconds and by other processes' within a poll (see :mod:`adapters.sqlite.alive`)."""
        start = position(after, "stream cursor")
        deadline = time.monotonic() + (block or 0.0)
        followers = self._wakeup.followers(self._heads)
        while True:
            rows, known = self._live(job_id, start, limit)  # on the loop's thread: a WAL read never waits
            left = deadline - time.monotonic()
            if rows or not known or left <= 0:
                return _events(job_id, rows)
            woken = followers.add(job_id, start)
            try:
                await wait_on(woken, left)
            finally:
                followers.discard(job_id, woken)

    def _live(self, job_id: str, start: int, limit: int) -> tuple[list[Any], bool]:
        """The parts after ``start`` (rows), and whether the job exists; one read transaction."""
        return self._db.read(lambda c: _live_rows(c, job_id, start, limit),
                             f"reading the live stream of job {job_id!r}")

    def _heads(self, job_ids: list[str]) -> dict[str, int]:
        """The highest part number of each of ``job_ids`` that exists (0 without parts)."""
        def read(conn: sqlite3.Connection) -> dict[str, int]:
            out: dict[str, int] = {}
            for lo in range(0, len(job_ids), _HEADS_CHUNK):
                chunk = job_ids[lo : lo + _HEADS_CHUNK]
                marks = ",".join("?" * len(chunk))
                out.update((r[0], r[1] or 0) for r in conn.execute(
                    f"SELECT job_id, (SELECT max(seq) FROM parts WHERE parts.job_id = jobs.job_id) FROM jobs "
                    f"WHERE job_id IN ({marks})", chunk))
            return out

        return self._db.read(read, "reading the heads of the followed live streams")

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting in the job's inbox, in the order they were sent."""
        if count <= 0:
            return []
        rows = self._db.read(lambda c: c.execute("SELECT body FROM inbox WHERE job_id = ? ORDER BY pos LIMIT ?",
                                                 (job_id, _count(count))).fetchall(),
                             f"reading the inbox of job {job_id!r}")
        return [_json(job_id, r[0], "inbox message") for r in rows]

    # --- indexes ---------------------------------------------------------------------------
    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Ids of running jobs due at ``now``, earliest first (ties by id)."""
        rows = self._db.read(lambda c: c.execute(
            "SELECT job_id FROM jobs WHERE due_at IS NOT NULL AND due_at <= ? ORDER BY due_at, job_id LIMIT ?",
            (now, _count(limit))).fetchall(), "reading the due index")
        return [r[0] for r in rows]

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first."""
        return [job_id for _, job_id in self.finished_page(before, limit=limit)]

    def finished_page(self, before: float, *, after: FinishedEntry | None = None,
                      limit: int = 1000) -> list[FinishedEntry]:
        """``(finish time, id)`` of jobs finished by ``before``, oldest first, after the cursor ``after``."""
        start = (-math.inf, "") if after is None else (float(after[0]), str(after[1]))
        rows = self._db.read(lambda c: c.execute(
            "SELECT finished_at, job_id FROM jobs WHERE finished_at IS NOT NULL AND finished_at <= ? "
            "AND (finished_at, job_id) > (?, ?) ORDER BY finished_at, job_id LIMIT ?",
            (before, *start, _count(limit))).fetchall(), "reading the finished index")
        return [(float(t), str(j)) for t, j in rows]

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Jobs (optionally in ``status``) newest ``updated_at`` first (ties: id), after the cursor ``before``."""
        cursor = parse_cursor(before)
        where: list[str] = []
        args: list[object] = []
        if status is not None:
            where.append("status = ?")
            args.append(JobStatus(status).value)
        if cursor is not None:
            where.append("(updated_at, job_id) < (?, ?)")
            args.extend(cursor)
        sql = (f"SELECT {RECORD_COLUMNS} FROM jobs {'WHERE ' + ' AND '.join(where) if where else ''} "
               "ORDER BY updated_at DESC, job_id DESC LIMIT ?")

        def read(conn: sqlite3.Connection) -> list[JobRecord]:
            out = []
            for row in conn.execute(sql, (*args, _count(limit))).fetchall():
                try:
                    out.append(load_record(conn, row, None))
                except CorruptRecordError as exc:  # one bad record never hides the others
                    logger.error("job %s: unreadable record skipped: %s", row[0], exc)
            return out

        return self._db.read(read, "listing jobs")

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs (in ``status``), from the index: no record is read."""
        sql, args = "SELECT count(*) FROM jobs", cast(tuple[str, ...], ())
        if status is not None:
            sql, args = "SELECT count(*) FROM jobs WHERE status = ?", (JobStatus(status).value,)
        return int(self._db.read(lambda c: c.execute(sql, args).fetchone()[0], "counting jobs"))

    def reindex(self) -> int:
        """The listing indexes are columns of the records' own rows, never behind: how many jobs there are."""
        return self.count_jobs()


def _live_rows(conn: sqlite3.Connection, job_id: str, start: int, limit: int) -> tuple[list[Any], bool]:
    rows = conn.execute("SELECT seq, body FROM parts WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                        (job_id, start, _count(limit))).fetchall()
    if rows:
        return rows, True
    return rows, conn.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None
