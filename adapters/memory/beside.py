"""What :class:`~adapters.memory.MemoryStorage` keeps beside a job's record, outside its version fence: a
pause or cancel request, the usage of attempts fenced off after paying, and what their model answered;
and a deferred turn's later place in the due index.

A base class of the storage, sharing its jobs and its lock; none of these writes touches the record or its
version, so a turn in flight still commits.
"""

from __future__ import annotations

import json
import threading

from adapters.base import FENCED_KEPT
from adapters.memory.job import Job
from pipelines.engine.models import JSONValue, Usage, dump_json

__all__ = ["BesideRecord"]


class BesideRecord:
    """Control requests, dropped usage and fenced-off answers, written under the storage's lock."""

    _jobs: dict[str, Job]
    _lock: threading.RLock
    _due: dict[str, float]  # running job id -> due_at (the storage's due index)

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                _count_dropped(job, usage, token)

    def add_fenced_answer(self, job_id: str, usage: Usage, entry: JSONValue, *, token: str) -> None:
        # Stored as checked text, as the other storages do: a later change to the caller's dict is not the stored one.
        line = dump_json(entry, f"the answer of a fenced-off attempt of job {job_id!r}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and _count_dropped(job, usage, token):
                job.fenced = [*job.fenced, line][-FENCED_KEPT:]

    def fenced_answers(self, job_id: str) -> list[JSONValue]:
        with self._lock:
            job = self._jobs.get(job_id)
            lines = [] if job is None else list(job.fenced)
        return [json.loads(line) for line in lines]

    def request_control(self, job_id: str, request: str | None) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return False
            if not (request == "pause" and job.control == "cancel"):  # a pause never replaces a cancel
                job.control = request
            return True

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            due = self._due.get(job_id)
            if job is None or job.version != version or due is None or due_at <= due:
                return False
            self._due[job_id] = due_at
            return True


def _count_dropped(job: Job, usage: Usage, token: str) -> bool:
    """Add ``usage`` to the job's dropped usage, once per ``token``; ``False`` for a re-sent call."""
    if job.dropped_token == token:
        return False
    job.dropped = job.dropped + usage
    job.dropped_token = token
    return True
