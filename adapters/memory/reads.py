"""The read side of :class:`~adapters.memory.MemoryStorage` that reads one job's history: the transcript,
the log, the events (from the start or newest first) and the live stream (followed blocking or ``async``).

A base class of the storage, sharing its jobs and its lock: a read takes the lock for as long as it copies
the stored lines, then parses them outside it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

from adapters.live_wakeup import LoopWakeups, wait_on
from adapters.memory.job import Job, position
from pipelines.engine.models import Event, LogEntry, Message, dump_events

__all__ = ["HistoryReads"]


class HistoryReads:
    """One job's transcript, log, events and live stream, read from the storage's jobs under its lock."""

    _jobs: dict[str, Job]
    _lock: threading.RLock
    _published: threading.Condition
    _live_waiters: LoopWakeups

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        lines = dump_events(parts)
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and lines:
                job.live.extend(lines)
                self._published.notify_all()
                self._live_waiters.notify(job_id)

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor (ids are 1-based positions); waits up to ``block`` seconds (real time)."""
        start = position(after, "stream cursor")
        deadline = time.monotonic() + (block or 0.0)
        with self._lock:
            while True:
                job = self._jobs.get(job_id)
                lines = [] if job is None else job.live[start : start + max(0, limit)]
                left = deadline - time.monotonic()
                if lines or job is None or left <= 0:
                    break
                self._published.wait(left)
        return [Event.model_validate_json(line).model_copy(update={"id": str(start + i + 1)})
                for i, line in enumerate(lines)]

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """:meth:`read_live` for ``async`` code: the wait is a future the publisher resolves, no thread."""
        start = position(after, "stream cursor")
        deadline = time.monotonic() + (block or 0.0)
        while True:
            with self._lock:
                job = self._jobs.get(job_id)
                lines = [] if job is None else job.live[start : start + max(0, limit)]
                left = deadline - time.monotonic()
                if lines or job is None or left <= 0:
                    break
                # Registered under the lock that publish() holds: nothing lands between the look and the wait.
                woken = self._live_waiters.add(job_id)
            try:
                await wait_on(woken, left)
            finally:
                with self._lock:
                    self._live_waiters.discard(job_id, woken)
        return [Event.model_validate_json(line).model_copy(update={"id": str(start + i + 1)})
                for i, line in enumerate(lines)]

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        with self._lock:
            job = self._jobs.get(job_id)
            lines = [] if job is None else job.messages[start:stop]
        return [json.loads(m) for m in lines]

    def logs(self, job_id: str) -> list[LogEntry]:
        with self._lock:
            job = self._jobs.get(job_id)
            lines = [] if job is None else list(job.logs)
        return [LogEntry.model_validate_json(line) for line in lines]

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        start = position(after, "event cursor")
        with self._lock:
            job = self._jobs.get(job_id)
            lines = [] if job is None else job.events[start : start + max(0, limit)]
        return [Event.model_validate_json(line).model_copy(update={"id": str(start + i + 1)})
                for i, line in enumerate(lines)]

    def recent_events(self, job_id: str, *, before: str | None = None, limit: int = 100) -> list[Event]:
        """Committed events newest first, before the cursor ``before`` (ids are 1-based positions)."""
        with self._lock:
            job = self._jobs.get(job_id)
            events = [] if job is None else job.events
            stop = len(events) if before is None else min(len(events), position(before, "event cursor") - 1)
            start = max(0, stop - max(0, limit))
            lines = events[start:max(start, stop)]
        return [Event.model_validate_json(line).model_copy(update={"id": str(start + i + 1)})
                for i, line in reversed(list(enumerate(lines)))]

    def recent_logs(self, job_id: str, *, skip: int = 0, limit: int = 100) -> tuple[list[LogEntry], int]:
        """The ``limit`` log entries before the last ``skip``, oldest first, and how many there are."""
        with self._lock:
            job = self._jobs.get(job_id)
            logs = [] if job is None else job.logs
            stop = max(0, len(logs) - max(0, skip))
            lines, total = logs[max(0, stop - max(0, limit)):stop], len(logs)
        return [LogEntry.model_validate_json(line) for line in lines], total
