"""``OffloadingStorage``: any :class:`~adapters.base.Storage` with large values kept in a blob store.

Wrap the storage once, where the App is built (workers build the same App)::

    storage = OffloadingStorage(RedisStorage.from_url(url), DirectoryBlobStore("/var/lib/app/blobs"))
    app = App(storage=storage, scheduler=...)

Transcript messages, inbox messages and journaled step results over
``threshold`` bytes of JSON are written to the blob store *before* the write
that references them (see :mod:`pipelines.engine.blobs`); every read hands
back the original values, so the model, ``app.messages``, the CLI and the web
page see full content. Deleting a job (``app.delete``, retention) deletes its
blobs after the job. A crash can leave two kinds of unreferenced blobs: a
blob written for a turn that never committed (it stays under its job, which
a re-run refers to again by the same name, and goes with the job), and the
blobs of a job deleted or never created because the process died between
the two writes: :meth:`OffloadingStorage.collect_orphans` removes those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapters.base import Storage
from pipelines.engine import writer
from pipelines.engine.blobs import DEFAULT_MAX_BLOB_BYTES, DEFAULT_THRESHOLD, BlobStore, Offloader, is_reference
from pipelines.engine.capabilities import Feature, features_of
from pipelines.engine.errors import ConfigurationError, PipelineError, StaleVersionError
from pipelines.engine.models import Commit, CommitReply, Event, JobRecord, JobStatus, JSONValue, LogEntry, Message

__all__ = ["OffloadingStorage", "OrphanSweep"]

logger = logging.getLogger("pipelines")


@dataclass(frozen=True)
class OrphanSweep:
    """What :meth:`OffloadingStorage.collect_orphans` did.

    ``removed``: the jobs whose blobs it deleted; ``failed``: job id -> why
    its blobs could not be deleted (each also logged; the sweep went on).
    """

    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class OffloadingStorage:
    """``storage`` with values over ``threshold`` bytes of JSON stored once in ``blobs`` (see the module docstring).

    ``max_blob_bytes`` is the per-blob limit (default 64 MiB); values kept
    inline stay under ``pipelines.engine.models.MAX_VALUE_BYTES``. Methods
    the wrapped storage has beyond the port (``finished_jobs``,
    ``flow_store``, ...) are passed through.
    """

    def __init__(self, storage: Storage, blobs: BlobStore, *, threshold: int = DEFAULT_THRESHOLD,
                 max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> None:
        if not isinstance(storage, Storage):
            raise ConfigurationError(f"storage must implement adapters.base.Storage, got {type(storage).__name__}")
        self.inner = storage
        #: The wrapped storage's features: what this wrapper does not define itself it passes through.
        # (And a last step before the commit: the wrapped storage's own way, or record_step.)
        self.features = features_of(storage) | {Feature.STEP_BEFORE_COMMIT}
        self.blobs = blobs
        self.offloader = Offloader(blobs, threshold=threshold, max_blob_bytes=max_blob_bytes)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class does not define: the wrapped storage's extras.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # --- writes: blobs first, then the write that references them ----------------------------
    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Create the job with its large initial messages offloaded."""
        packed = self.offloader.pack_messages(record.job_id, messages, "a transcript message")
        self.inner.create_job(record, messages=packed, logs=logs, events=events)

    def _check_lease(self, job_id: str, owner: str | None, what: str) -> None:
        """Before a worker's blobs are written: refuse a write the storage would refuse for its lease anyway.

        A worker whose job was deleted under it (or whose lease ran out) would
        otherwise put its large values back under a job that is gone, where
        only the orphan sweep would find them. One read, and only for a write
        that has a blob; a delete landing between it and the put is the
        sweep's (:meth:`collect_orphans`).
        """
        if owner is not None and self.inner.lease_owner(job_id) != owner:
            raise StaleVersionError(f"job {job_id!r}: this worker no longer holds its lease (the job was deleted, "
                                    f"or the lease expired); {what}, its large values not stored")

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` with its large appended messages offloaded (written before the commit)."""
        if commit.append_messages:
            encoded = self.offloader.encode_messages(commit.job_id, commit.append_messages, "a transcript message")
            if any(data is not None for _, data in encoded):
                self._check_lease(commit.job_id, commit.owner, f"commit expected {commit.expected_version}")
            commit = commit.model_copy(update={"append_messages": self.offloader.put_blobs(commit.job_id, encoded)})
        return self.inner.commit(commit)

    def _pack_step(self, job_id: str, version: int, owner: str | None, key: str, value: JSONValue) -> JSONValue:
        stored, data = self.offloader.encode(job_id, value, f"result of step {key!r}")
        if data is not None:
            self._check_lease(job_id, owner, f"step {key!r} at version {version} not recorded")
            self.offloader.put_blobs(job_id, [(stored, data)])
        return stored

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal a step result, a large one as a reference."""
        stored = self._pack_step(job_id, version, owner, key, value)
        self.inner.record_step(job_id, version=version, owner=owner, key=key, value=stored)

    def record_step_before_commit(self, job_id: str, *, version: int, owner: str | None, key: str,
                                  value: JSONValue, parts: Sequence[Event] = (),
                                  on_refused: Callable[[], None] | None = None) -> None:
        """Journal a phase's last step before its commit (a large one as a reference), as the wrapped storage can."""
        stored = self._pack_step(job_id, version, owner, key, value)
        writer.record_step(self.inner, job_id, version=version, owner=owner, key=key, value=stored, parts=parts,
                           before_commit=True, on_refused=on_refused)

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal a step result (a large one as a reference) and publish ``parts`` with it."""
        stored = self._pack_step(job_id, version, owner, key, value)
        writer.record_step(self.inner, job_id, version=version, owner=owner, key=key, value=stored, parts=parts)

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Send messages to the job's inbox, large ones as references."""
        return self.inner.send(job_id, self.offloader.pack_messages(job_id, messages, "a message sent to the job"))

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Passed through."""
        return self.inner.request_control(job_id, request)

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        """Passed through."""
        return self.inner.postpone(job_id, version=version, due_at=due_at)

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Delete the job, then its blobs (a crash between the two leaves orphans: :meth:`collect_orphans`)."""
        if if_version is None:
            deleted = self.inner.delete_job(job_id)
        else:
            deleted = self.inner.delete_job(job_id, if_version=if_version)  # type: ignore[call-arg]
        self.blobs.delete_job(job_id)
        return deleted

    def collect_orphans(self, *, older_than: float = 3600.0) -> OrphanSweep:
        """Delete the blobs of jobs that do not exist (a crash between a blob and its job's create or delete).

        Only jobs whose blobs are all older than ``older_than`` seconds: a job
        being created right now has written its blobs but not yet its record.
        A job whose blobs cannot be deleted (a link planted in a directory
        store, a folder it did not write) is logged and reported in
        :attr:`OrphanSweep.failed`; the sweep goes on with the others.
        """
        sweep = OrphanSweep()
        for job_id in list(self.blobs.job_ids(older_than)):
            try:
                if self.inner.get_job(job_id) is None:
                    self.blobs.delete_job(job_id)
                    sweep.removed.append(job_id)
            except PipelineError as exc:  # one undeletable job must not keep the sweep from every later one
                logger.error("blob orphan sweep: cannot delete the blobs of job %s: %s", job_id, exc)
                sweep.failed[job_id] = str(exc)
        return sweep

    # --- reads: references resolved -----------------------------------------------------------
    def _resolved(self, record: JobRecord | None) -> JobRecord | None:
        cp = None if record is None else record.checkpoint
        if record is None or cp is None or not any(map(is_reference, cp.journal.values())):
            return record
        journal = {k: self.offloader.unpack(record.job_id, v) for k, v in cp.journal.items()}
        return record.model_copy(update={"checkpoint": cp.model_copy(update={"journal": journal})})

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record, its journal's references resolved."""
        return self._resolved(self.inner.get_job(job_id))

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the lease; the record with its journal's references resolved."""
        return self._resolved(self.inner.acquire_lease(job_id, owner, ttl))

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[Message]:
        """Committed messages, each as it was written (references resolved)."""
        return self.offloader.unpack_all(job_id, self.inner.messages(job_id, start, stop))

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """Waiting messages, references resolved."""
        return self.offloader.unpack_all(job_id, self.inner.inbox(job_id, count))

    # --- passed through -------------------------------------------------------------------------
    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        """Passed through."""
        return self.inner.renew_lease(job_id, owner, ttl)

    def release_lease(self, job_id: str, owner: str) -> None:
        """Passed through."""
        self.inner.release_lease(job_id, owner)

    def lease_owner(self, job_id: str) -> str | None:
        """Passed through."""
        return self.inner.lease_owner(job_id)

    def logs(self, job_id: str) -> list[LogEntry]:
        """Passed through."""
        return self.inner.logs(job_id)

    def events(self, job_id: str, *, after: str | None = None, limit: int = 1000) -> list[Event]:
        """Passed through."""
        return self.inner.events(job_id, after=after, limit=limit)

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Passed through."""
        self.inner.publish(job_id, parts)

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Passed through."""
        return self.inner.read_live(job_id, after=after, limit=limit, block=block)

    def due_jobs(self, now: float, *, limit: int = 1000) -> list[str]:
        """Passed through."""
        return self.inner.due_jobs(now, limit=limit)

    def list_jobs(self, *, status: JobStatus | None = None, limit: int = 1000, **more: Any) -> list[JobRecord]:
        """Passed through, with any options the wrapped storage's listing has (journals are not resolved)."""
        return self.inner.list_jobs(status=status, limit=limit, **more)
