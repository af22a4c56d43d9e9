"""``MemoryStorage``: the :class:`~adapters.base.Storage` port in process memory, for tests and the offline demo.

It keeps everything as JSON text, so what Redis would reject is rejected here
too, and it is thread-safe (one lock). The record a commit stored is kept as
the object too, handed to the next lease unparsed, as a Redis worker's warm
load does (:class:`~adapters.memory.job.Job`). Its scheduler twin is
:class:`~adapters.memory.MemoryScheduler` (:mod:`adapters.memory.scheduler`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import ValidationError

from adapters.base import INBOX_OPEN, Feature, FinishedEntry, LeaseState, parse_cursor
from adapters.live_wakeup import LoopWakeups
from adapters.memory.beside import BesideRecord
from adapters.memory.history import NO_HISTORY, dump_apart, stored_dict
from adapters.memory.job import Job, check_inbox, checked_record
from adapters.memory.listing import SortedIndex
from adapters.memory.reads import HistoryReads
from pipelines.engine.errors import (
    CorruptRecordError,
    InvalidInputError,
    JobConflictError,
    StaleVersionError,
)
from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    Message,
    TurnMark,
    as_stored,
    check_messages,
    dump_events,
    dump_json,
    dump_logs,
    validate_job_id,
)

__all__ = ["MemoryStorage"]

_FINISHED = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)


class MemoryStorage(BesideRecord, HistoryReads):
    """The :class:`~adapters.base.Storage` port in process memory.

    ``clock`` times leases (default: ``time.monotonic``); pass a
    :class:`VirtualClock` to expire leases in a test without sleeping.
    """

    #: What it can do beyond the port, declared once (checked by pipelines.engine.capabilities; the contract
    #: suite checks the declaration against the methods).
    features: ClassVar[frozenset[Feature]] = frozenset({
        Feature.STEP_AND_PUBLISH, Feature.ASYNC_LIVE, Feature.COUNTS, Feature.RETENTION, Feature.FLOW,
        Feature.RECENT, Feature.LEASE_HISTORY, Feature.FENCED_ANSWERS})

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._jobs: dict[str, Job] = {}
        self._due: dict[str, float] = {}
        self._finished: dict[str, float] = {}  # finished job id -> when it finished (retention reads it)
        # The listing indexes: job id -> updated_at, per status (the "all jobs" one is self._updated).
        self._updated = SortedIndex()
        self._by_status: dict[JobStatus, SortedIndex] = {s: SortedIndex() for s in JobStatus}
        self._status: dict[str, JobStatus] = {}  # which of _by_status holds each job (a commit moves it from there)
        self._lock = threading.RLock()
        self._published = threading.Condition(self._lock)  # wakes readers following a live stream
        self._live_waiters = LoopWakeups()  # and async ones, in their own loops (no thread held per follower)
        self._clock = clock or time.monotonic
        self.writes = 0  # commits + journal writes, for tests and benchmarks
        self.bytes_written = 0

    # --- helpers -------------------------------------------------------------
    def _lease_live(self, job: Job) -> bool:
        return job.lease_owner is not None and job.lease_expires > self._clock()

    def _held_by(self, job: Job, owner: str) -> bool:
        return self._lease_live(job) and job.lease_owner == owner

    def _load(self, job_id: str, job: Job, *, warm: bool = False) -> JobRecord:
        """The job's record with what is kept beside it; ``warm``: the very record its last commit stored.

        Only the engine's lease takes it warm: readers get a record of their own, parsed from the text.
        """
        rec = job.stored if warm else None
        if rec is None:
            try:
                rec = JobRecord.model_validate_json(job.record)
            except ValidationError as exc:
                raise CorruptRecordError(f"stored record of job {job_id!r} does not parse: {exc}") from exc
            if job.history.marks:
                # The engine's lease shares the frozen marks (like the Redis adapter's warm load: its commit
                # then checks only the marks it adds); a reader gets its own, parsed, since a mark's state
                # is a dict it could change (and a fork would start from it).
                rec.history = (list(job.history.marks) if warm else
                               [TurnMark.model_validate_json(line) for line in job.history.lines])
        if rec.checkpoint is not None and job.journal and job.journal_version == rec.version:
            journal = {k: json.loads(v) for k, v in job.journal.items()}
            rec = rec.model_copy(update={"checkpoint": rec.checkpoint.model_copy(update={"journal": journal})})
        if job.control is not None or job.inbox or job.dropped.model_calls or job.interrupted or rec.interrupted:
            rec = rec.model_copy(update={"control": job.control, "inbox": len(job.inbox), "dropped": job.dropped,
                                         "interrupted": job.interrupted})
        return rec

    # --- Storage -------------------------------------------------------------
    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        validate_job_id(record.job_id)
        text, history, _ = dump_apart(record, NO_HISTORY, f"the record of job {record.job_id!r}")
        msgs = [dump_json(m, "a transcript message") for m in messages]
        log_lines = dump_logs(logs)
        event_lines = dump_events(events)
        with self._lock:
            if record.job_id in self._jobs:
                raise JobConflictError(f"job {record.job_id!r} already exists")
            self._jobs[record.job_id] = Job(text=text, history=history, messages=msgs, logs=log_lines,
                                             events=event_lines, live=list(event_lines), version=record.version)
            self._published.notify_all()
            self._live_waiters.notify(record.job_id)
            self._set_due(record)
            self._set_listed(record.job_id, record)
            self.writes += 1
            self.bytes_written += len(text) + sum(map(len, (*history.lines, *msgs, *log_lines)))

    def _set_due(self, record: JobRecord) -> None:
        if record.status is JobStatus.RUNNING and record.checkpoint is not None:
            self._due[record.job_id] = record.checkpoint.due_at
        else:
            self._due.pop(record.job_id, None)
        # The finished index moves with the status, under the same lock as the write (as Redis's commit script).
        if record.status in _FINISHED:
            self._finished[record.job_id] = record.updated_at
        else:
            self._finished.pop(record.job_id, None)

    def _set_listed(self, job_id: str, record: JobRecord | None) -> None:
        """Move ``job_id`` to ``record``'s status index (out of all of them for ``None``); under the lock."""
        was = self._status.pop(job_id, None)
        if was is not None and (record is None or was is not record.status):
            self._by_status[was].pop(job_id, None)
        if record is not None:
            self._by_status[record.status][job_id] = record.updated_at
            self._status[job_id] = record.status
        if record is None:
            self._updated.pop(job_id, None)
        else:
            self._updated[job_id] = record.updated_at

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else self._load(job_id, job)

    def commit(self, commit: Commit) -> CommitReply:
        # Serialise before taking the lock: a value JSON cannot carry fails
        # here, with nothing written (I1).
        # The marks held now, read without the lock: the lines of the marks a commit keeps are those of
        # the very objects, whichever record held them, so a commit landing meanwhile changes nothing.
        text, history, added = checked_record(commit.record, self._jobs.get(commit.job_id))
        msgs = [dump_json(m, "a transcript message") for m in commit.append_messages]
        log_lines = dump_logs(commit.logs)
        event_lines = dump_events(commit.events)
        with self._lock:
            job = self._jobs.get(commit.job_id)
            if job is None:
                raise StaleVersionError(f"job {commit.job_id!r} no longer exists")
            if job.token == commit.token and job.version == commit.record.version:
                return CommitReply(job.control, len(job.inbox))  # applied already: a retry of the same commit
            if job.version != commit.expected_version:
                raise StaleVersionError(
                    f"job {commit.job_id!r} is at version {job.version}, commit expected {commit.expected_version}"
                )
            # A worker commits only while it holds the lease: a free lease
            # means it expired, or the job was deleted and re-created under
            # the same id, where version numbers alone could match again.
            if commit.owner is not None and not self._held_by(job, commit.owner):
                raise StaleVersionError(
                    f"job {commit.job_id!r} is leased by another worker; commit expected {commit.expected_version}"
                    if self._lease_live(job) else f"job {commit.job_id!r}: no worker holds its lease (this "
                    f"worker's lease expired); commit expected {commit.expected_version}")
            check_inbox(job, commit)
            if commit.truncate_messages_to is not None:
                del job.messages[commit.truncate_messages_to :]
            job.messages.extend(msgs)
            job.logs.extend(log_lines)
            job.events.extend(event_lines)
            job.live.extend(event_lines)
            if event_lines:
                self._published.notify_all()
                self._live_waiters.notify(commit.job_id)
            job.text = text
            job.stored = as_stored(commit.record)
            job.history = history
            job.version = commit.record.version
            job.token = commit.token
            if commit.keep_journal:
                job.journal_version = commit.record.version
            else:
                job.journal.clear()
                job.journal_version = commit.record.version
            if (commit.release_lease and commit.owner is not None) or not self._lease_live(job):
                job.lease_owner = None  # let go, or lapsed before this commit: not the next turn's interruption
            if commit.clear_control:
                job.control = None
            del job.inbox[: commit.take_inbox]
            self._set_due(commit.record)
            self._set_listed(commit.job_id, commit.record)
            self.writes += 1
            self.bytes_written += added + sum(map(len, msgs)) + sum(map(len, log_lines))
            return CommitReply(job.control, len(job.inbox))

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        lines = [dump_json(m, "a message sent to the job") for m in check_messages(messages, "messages sent")]
        if not lines:
            raise InvalidInputError("send needs at least one message")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            # The status is read under the same lock as the append: a run cannot end in between.
            status = self._status.get(job_id)
            if status not in INBOX_OPEN:
                raise JobConflictError(f"job {job_id!r} is {status.value if status else 'unreadable'}: "
                                       "its inbox takes no messages (nothing appended)")
            job.inbox.extend(lines)
            return len(job.inbox)

    def inbox(self, job_id: str, count: int) -> list[Message]:
        with self._lock:
            job = self._jobs.get(job_id)
            lines = [] if job is None or count <= 0 else job.inbox[:count]
        return [json.loads(line) for line in lines]

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal a step, then publish ``parts`` to the live stream (only if the step was journaled)."""
        self.record_step(job_id, version=version, owner=owner, key=key, value=value)
        self.publish(job_id, parts)

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        text = dump_json(value, f"result of step {key!r}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.version != version:
                raise StaleVersionError(f"job {job_id!r} moved on from version {version}; step {key!r} not recorded")
            if owner is not None and not self._held_by(job, owner):
                raise StaleVersionError(
                    f"job {job_id!r} is leased by another worker; step {key!r} at version {version} not recorded"
                    if self._lease_live(job) else f"job {job_id!r}: no worker holds its lease (this worker's "
                    f"lease expired); step {key!r} at version {version} not recorded")
            if job.journal_version != version:
                job.journal.clear()
                job.journal_version = version
            job.journal[key] = text
            self.writes += 1
            self.bytes_written += len(key) + len(text)

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or (self._lease_live(job) and job.lease_owner != owner):
                return None
            if job.lease_owner is not None and not self._lease_live(job):
                job.lease_lapsed()  # ran out, not let go: its holder died or stalled mid-turn
            job.lease_owner = owner
            job.lease_expires = self._clock() + ttl
            return self._load(job_id, job, warm=True)

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.lease_owner != owner or not self._lease_live(job):
                return False
            job.lease_expires = self._clock() + ttl
            return True

    def release_lease(self, job_id: str, owner: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.lease_owner == owner:
                job.lease_owner = None

    def lease_owner(self, job_id: str) -> str | None:
        return self.lease_state(job_id).owner

    def lease_state(self, job_id: str) -> LeaseState:
        """A lease let go clears its owner; one that ran out keeps it, past its expiry."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.lease_owner is None:
                return LeaseState(None, False)
            live = self._lease_live(job)
            return LeaseState(job.lease_owner if live else None, not live)

    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        with self._lock:
            due = sorted((t, j) for j, t in self._due.items() if t <= now)
        return [j for _, j in due[:limit]]

    def _readable(self, job_id: str, job: Job) -> JobRecord | None:
        """The record, or ``None`` (logged, naming the job) when it does not parse: a listing shows the rest."""
        try:
            return self._load(job_id, job)
        except CorruptRecordError as exc:
            logging.getLogger("pipelines").error("job %s: unreadable record skipped: %s", job_id, exc)
            return None

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000,
                  before: str | None = None) -> list[JobRecord]:
        """Jobs (optionally in ``status``) newest ``updated_at`` first, after the cursor ``before``."""
        cursor = parse_cursor(before)
        out: list[JobRecord] = []
        with self._lock:
            index = self._updated if status is None else self._by_status[status]
            for job_id in index.newest(cursor):  # sorted as it is kept: a page reads a page
                if len(out) >= limit:
                    break
                rec = self._readable(job_id, self._jobs[job_id])
                if rec is not None:
                    out.append(rec)
        return out

    def count_jobs(self, status: JobStatus | None = None) -> int:
        """How many jobs (in ``status``), from the listing index."""
        with self._lock:
            return len(self._updated if status is None else self._by_status[status])

    def reindex(self) -> int:
        """Rebuild the listing indexes from the records (they never lag here); how many jobs were indexed."""
        with self._lock:
            self._updated.clear()
            self._status.clear()
            for index in self._by_status.values():
                index.clear()
            for job_id, job in self._jobs.items():
                rec = self._readable(job_id, job)
                if rec is not None:
                    self._set_listed(job_id, rec)
            return len(self._updated)

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Remove the job and its index entries; with ``if_version``, only if it is still at that version
        (else :class:`StaleVersionError`, nothing removed)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and if_version is not None and job.version != if_version:
                raise StaleVersionError(f"job {job_id!r} is at version {job.version}; delete expected {if_version}")
            self._due.pop(job_id, None)
            self._finished.pop(job_id, None)
            self._set_listed(job_id, None)
            return self._jobs.pop(job_id, None) is not None

    def finished_jobs(self, before: float, *, limit: int = 1000) -> list[str]:
        """Ids of jobs that finished (complete, error, cancelled) at or before ``before``, oldest first."""
        return [j for _, j in self.finished_page(before, limit=limit)]

    def finished_page(self, before: float, *, after: FinishedEntry | None = None, limit: int = 1000
                      ) -> list[FinishedEntry]:  # (finish time, id) of jobs finished by before, after the cursor
        with self._lock:
            done = sorted((t, j) for j, t in self._finished.items() if t <= before and (not after or (t, j) > after))
        return done[: max(0, limit)]

    def flow_store(self) -> Any:
        """The flow-control state beside this storage (a :class:`~adapters.memory.flow.MemoryFlowStore`)."""
        from adapters.memory.flow import MemoryFlowStore  # only apps with flow control load it

        with self._lock:
            store = self.__dict__.get("_flow")
            if store is None:
                store = self.__dict__["_flow"] = MemoryFlowStore()
            return store

    # --- extras for tests ----------------------------------------------------
    def inspect(self, job_id: str) -> dict[str, Any]:
        """Everything stored for ``job_id``, decoded: record, messages, logs, journal, lease, due."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return {}
            return {
                "record": stored_dict(job.record, job.history),
                "messages": [json.loads(m) for m in job.messages],
                "logs": [json.loads(line) for line in job.logs],
                "events": [json.loads(line) for line in job.events],
                "journal": {k: json.loads(v) for k, v in job.journal.items()},
                "lease_owner": job.lease_owner if self._lease_live(job) else None,
                "due_at": self._due.get(job_id),
            }
