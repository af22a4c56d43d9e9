"""Blob stores for large values (:class:`~pipelines.engine.blobs.BlobStore`): a directory, Redis, memory.

* :class:`DirectoryBlobStore` (the default for one machine, or a shared
  filesystem): ``<root>/job-<job id>/<name>``, written to a temporary file,
  fsynced and renamed into place, so a reader sees a whole blob or none.
* :class:`RedisBlobStore`: a string key per blob under the job's hash tag,
  ``<prefix>:{<job id>}:blob:<name>``, and a hash ``<prefix>:{<job id>}:blobs``
  of its names and when each was written (what ``delete_job`` removes); one
  transaction per put.
* :class:`MemoryBlobStore`: a dict, for tests.

S3-compatible object storage: :class:`adapters.blobs_s3.S3BlobStore` (its own
module, so only its users import its client library).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipelines.engine.blobs import check_blob_name
from pipelines.engine.errors import ConfigurationError, StorageError
from pipelines.engine.models import validate_job_id

__all__ = ["DirectoryBlobStore", "MemoryBlobStore", "RedisBlobStore"]

_DIR_PREFIX = "job-"  # never a bare path component, whatever ids a future alphabet allows


class MemoryBlobStore:
    """Blobs in a dict (tests, the offline demo)."""

    def __init__(self) -> None:
        self._blobs: dict[str, dict[str, bytes]] = {}
        self._written: dict[str, float] = {}  # job id -> when its last blob was written
        self._lock = threading.Lock()
        self.puts = 0  # writes, for tests

    def put(self, job_id: str, name: str, data: bytes) -> None:
        """Store ``data`` (see :class:`~pipelines.engine.blobs.BlobStore`)."""
        validate_job_id(job_id)
        check_blob_name(name)
        with self._lock:
            self._blobs.setdefault(job_id, {})[name] = bytes(data)
            self._written[job_id] = time.time()
            self.puts += 1

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        with self._lock:
            return self._blobs.get(job_id, {}).get(name)

    def delete_job(self, job_id: str) -> int:
        """Remove the job's blobs."""
        with self._lock:
            self._written.pop(job_id, None)
            return len(self._blobs.pop(job_id, {}))

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs that have blobs, none written in the last ``older_than`` seconds."""
        cut = time.time() - older_than
        with self._lock:
            return iter(sorted(j for j, t in self._written.items() if t <= cut))


class DirectoryBlobStore:
    """Blobs as files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(f"cannot use {str(self.root)!r} as a blob directory: {exc}") from exc

    def _dir(self, job_id: str) -> Path:
        return self.root / (_DIR_PREFIX + validate_job_id(job_id))

    def put(self, job_id: str, name: str, data: bytes) -> None:
        """Write ``data`` whole or not at all (temporary file, fsync, rename); a no-op if it is there."""
        path = self._dir(job_id) / check_blob_name(name)
        if path.exists():
            # Named by its content: the same bytes. Touch it, so the orphan sweep (by age) never takes
            # a blob that a create retried after a crash is about to reference again.
            os.utime(path)
            os.utime(path.parent)
            return
        try:
            path.parent.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise StorageError(f"cannot write blob {name} of job {job_id!r}: {exc}") from exc

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        try:
            return (self._dir(job_id) / check_blob_name(name)).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read blob {name} of job {job_id!r}: {exc}") from exc

    def delete_job(self, job_id: str) -> int:
        """Remove the job's directory (left-over temporary files of a crashed put too)."""
        folder = self._dir(job_id)
        removed = 0
        try:
            for path in folder.iterdir():
                path.unlink(missing_ok=True)
                removed += not path.name.startswith(".tmp-")
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete the blobs of job {job_id!r}: {exc}") from exc
        return removed

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs that have a blob directory not written to (its mtime) in the last ``older_than`` seconds."""
        cut = time.time() - older_than
        for path in sorted(self.root.iterdir()):
            if path.is_dir() and path.name.startswith(_DIR_PREFIX) and path.stat().st_mtime <= cut:
                yield path.name[len(_DIR_PREFIX):]


class RedisBlobStore:
    """Blobs as Redis strings beside the job's keys (same hash tag: one cluster slot per job)."""

    def __init__(self, client: Any, *, prefix: str = "pipelines") -> None:
        from adapters.redis import check_prefix  # the same rule as the storage's keys

        self.client = client
        self.prefix = check_prefix(prefix)

    def _base(self, job_id: str) -> str:
        return f"{self.prefix}:{{{validate_job_id(job_id)}}}"

    def put(self, job_id: str, name: str, data: bytes) -> None:
        """``SET`` the blob and add its name to the job's set, in one transaction (idempotent)."""
        base = self._base(job_id)
        check_blob_name(name)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(f"{base}:blob:{name}", data)
        pipe.hset(f"{base}:blobs", name, repr(time.time()))
        pipe.execute()

    def get(self, job_id: str, name: str) -> bytes | None:
        """The stored bytes, or ``None``."""
        value = self.client.get(f"{self._base(job_id)}:blob:{check_blob_name(name)}")
        return None if value is None else bytes(value)

    def delete_job(self, job_id: str) -> int:
        """Delete every blob the job's set names, and the set, in one transaction.

        The set is WATCHed while its names are read: a blob put in between
        (a stale worker offloading a value) makes the transaction run again
        with it, so no blob outlives its set unnamed (it would never be found).
        """
        base = self._base(job_id)
        removed = 0

        def delete(pipe: Any) -> None:
            nonlocal removed
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in pipe.hkeys(f"{base}:blobs")]
            self._between_read_and_delete(job_id)
            keys = [f"{base}:blob:{check_blob_name(n)}" for n in names]
            pipe.multi()
            pipe.delete(*keys, f"{base}:blobs")
            removed = len(keys)

        self.client.transaction(delete, f"{base}:blobs")
        return removed

    def _between_read_and_delete(self, job_id: str) -> None:
        """A seam for the tests: runs between reading the names and deleting them."""

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs with blobs, none written in the last ``older_than`` seconds (``SCAN``: Redis is not blocked)."""
        head, tail = f"{self.prefix}:{{", "}:blobs"
        cut = time.time() - older_than
        for key in self.client.scan_iter(match=f"{self.prefix}:*:blobs", count=1000):
            text = key.decode() if isinstance(key, bytes) else str(key)
            if not (text.startswith(head) and text.endswith(tail)):
                continue
            written = [float(v) for v in self.client.hvals(key)]
            if written and max(written) <= cut:
                yield text[len(head):-len(tail)]
