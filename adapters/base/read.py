"""The readers' side of storage: transcripts, logs, events and their cursors, the live stream, listings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Event, JobRecord, JobStatus, LogEntry, Message, validate_job_id

__all__ = ["HistoryStore", "RecentHistory", "LiveStore", "AsyncLiveStore", "JobIndex", "CountingIndex", "ReadStore",
           "page_cursor", "parse_cursor"]


@runtime_checkable
class HistoryStore(Protocol):
    """What a job committed, read back: transcript, human log, events."""

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Committed transcript messages ``[start:stop]`` in order."""
        ...

    def logs(self, job_id: str) -> list[LogEntry]:
        """The job's log entries in the order they were committed."""
        ...

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Committed events in order, each with its ``id``; only those after the cursor ``after``."""
        ...


@runtime_checkable
class RecentHistory(Protocol):
    """A storage that reads a job's history from its end (a capability: memory, Redis and SQLite have it).

    A page shows a long job's latest events and log lines, a page at a time,
    at the cost of that page: not the whole history read to show its end.
    """

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, each with its ``id``; only those before the cursor ``before``."""
        ...

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """Up to ``limit`` log entries that come before the job's last ``skip`` (oldest first), and how many
        entries the job has."""
        ...


@runtime_checkable
class LiveStore(Protocol):
    """The live stream of a job: every committed event again, plus ephemeral parts a worker publishes.

    Text deltas are published outside any commit (the committed transcript
    stays the truth); a reader follows parts from a cursor, across turns,
    workers and crashes, and blocks on the storage for new ones (no polling).
    """

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts (``text_delta``, ``attempt_started``); nothing for an unknown job."""
        ...

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor ``after``, each with its ``id``; waits up to ``block`` seconds for one."""
        ...


@runtime_checkable
class AsyncLiveStore(Protocol):
    """A storage whose live stream ``async`` code reads without a thread (a capability: memory and Redis have it).

    ``aread_live`` is :meth:`LiveStore.read_live` for an event loop: the same
    parts, cursors and errors, but its wait holds no thread (a future the
    publisher resolves, or one ``XREAD BLOCK`` per event loop shared by every
    follower in it), so a thousand idle SSE clients cost no worker of the
    default executor. ``app.astream`` uses it; for a storage without it each
    read runs ``read_live`` in a thread.
    """

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """``read_live`` for ``async`` code: waits up to ``block`` seconds without holding a thread."""
        ...


@runtime_checkable
class JobIndex(Protocol):
    """Finding jobs: what is due (I7), and listings for people."""

    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Ids of running jobs whose ``due_at <= now``, earliest first."""
        ...

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Up to ``limit`` jobs, optionally only those in ``status``, newest ``updated_at`` first (ties: id).

        ``before`` is :func:`page_cursor` of the last job of the previous page:
        the listing goes on after it, whatever moved since (a job updated
        meanwhile moves to the front, it does not shift the pages).
        """
        ...


@runtime_checkable
class CountingIndex(Protocol):
    """A :class:`JobIndex` that counts jobs from its listing indexes (memory and Redis do).

    A port of its own, so a storage written before it (or a wrapper) is still a :class:`Storage`.
    """

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs there are (in ``status``), from the index: no record is read."""
        ...

    def reindex(self) -> int:
        """Put jobs written before the listing indexes existed into them; how many were (re)indexed."""
        ...


@runtime_checkable
class ReadStore(HistoryStore, JobIndex, Protocol):
    """What readers need (the App's read model, the web page, the CLI): transcripts, logs, events with their
    cursors, the live stream, listings."""

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor ``after``, each with its ``id``; waits up to ``block`` seconds for one."""
        ...


# --- listing cursors ----------------------------------------------------------------------------
def page_cursor(record: JobRecord) -> str:
    """The cursor after ``record`` in a newest-first listing: ``list_jobs(before=page_cursor(last))``."""
    return f"{record.updated_at!r}/{record.job_id}"


def parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    """``(updated_at, job_id)`` of a :func:`page_cursor`; ``InvalidInputError`` naming what is wrong."""
    if cursor is None:
        return None
    when, sep, job_id = cursor.partition("/") if isinstance(cursor, str) else ("", "", "")
    try:
        updated = float(when)
        validate_job_id(job_id)
    except (ValueError, InvalidInputError):
        updated = math.nan
    if not sep or not math.isfinite(updated):
        raise InvalidInputError(f"bad listing cursor {str(cursor)[:80]!r}: expected <updated_at>/<job id> "
                                "(from page_cursor)")
    return updated, job_id
