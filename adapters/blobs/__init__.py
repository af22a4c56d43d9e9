"""Blob stores for large values (:class:`~pipelines.engine.blobs.BlobStore`): a directory, Redis, memory.

* :class:`DirectoryBlobStore` (the default for one machine, or a shared
  filesystem): ``<root>/job-<job id>/<name>``, written to a temporary file,
  fsynced and renamed into place, so a reader sees a whole blob or none. It
  never follows a link out of its root: a symbolic link planted at a job's
  folder or at a blob is refused (:class:`~pipelines.engine.errors.CorruptRecordError`), so a delete
  cannot remove, nor a put write, anything outside the root.
* :class:`RedisBlobStore`: a string key per blob under the job's hash tag,
  ``<prefix>:{<job id>}:blob:<name>``, and a hash ``<prefix>:{<job id>}:blobs``
  of its names and when each was written (what ``delete_job`` removes); one
  transaction per put.
* :class:`MemoryBlobStore`: a dict, for tests.

S3-compatible object storage: :class:`adapters.blobs.s3.S3BlobStore` (its own
module, so only its users import its client library).
"""

from adapters.blobs.directory import DirectoryBlobStore
from adapters.blobs.memory import MemoryBlobStore
from adapters.blobs.redis import RedisBlobStore

__all__ = ["DirectoryBlobStore", "MemoryBlobStore", "RedisBlobStore"]
