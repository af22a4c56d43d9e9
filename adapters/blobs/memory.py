"""``MemoryBlobStore``: blobs in a dict, for tests and the offline demo."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from pipelines.engine.blobs import check_blob_name
from pipelines.engine.models import validate_job_id

__all__ = ["MemoryBlobStore"]


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
        validate_job_id(job_id)  # refused like every other store: a bad id or name is an error, not a miss
        check_blob_name(name)
        with self._lock:
            return self._blobs.get(job_id, {}).get(name)

    def delete_job(self, job_id: str) -> int:
        """Remove the job's blobs."""
        validate_job_id(job_id)
        with self._lock:
            self._written.pop(job_id, None)
            return len(self._blobs.pop(job_id, {}))

    def job_ids(self, older_than: float = 0.0) -> Iterator[str]:
        """Jobs that have blobs, none written in the last ``older_than`` seconds."""
        cut = time.time() - older_than
        with self._lock:
            return iter(sorted(j for j, t in self._written.items() if t <= cut))
