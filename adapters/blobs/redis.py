"""``RedisBlobStore``: blobs as Redis strings beside the job's keys (same hash tag: one cluster slot per job)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pipelines.engine.blobs import check_blob_name
from pipelines.engine.models import validate_job_id

__all__ = ["RedisBlobStore"]


class RedisBlobStore:
    """Blobs as Redis strings beside the job's keys (same hash tag: one cluster slot per job)."""

    def __init__(self, client: Any, *, prefix: str = "pipelines") -> None:
        from adapters.redis.keys import check_prefix  # the same rule as the storage's keys

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
