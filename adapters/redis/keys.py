"""The key names of :class:`~adapters.redis.RedisStorage`: built here, and by the hot scripts from the same suffixes.

Two layouts share one shape. **Unbucketed** (``buckets=0``, a standalone
Redis or Sentinel; the layout every earlier version wrote)::

    <prefix>:{<job>}:record ... <prefix>:{<job>}:inbox   one job's keys, hash tag {<job>}
    <prefix>:due  <prefix>:jobs  <prefix>:finished       the global indexes
    <prefix>:updated  <prefix>:status:<status>

**Bucketed** (``buckets=N``, required on Redis Cluster): each job belongs to
bucket ``crc32(job id) % N``, and its keys and that bucket's indexes share
the hash tag ``{<prefix>.b<n>}``, so each script touches one slot::

    <prefix>:{<prefix>.b<n>}:job:<job>:record ...       one job's keys
    <prefix>:{<prefix>.b<n>}:due  ...:jobs  ...:finished ...:updated ...:status:<status>

Readers of an index (the sweep, retention, the listing, counts) walk every
bucket, so their cost grows with the number of buckets, not of jobs. The
bucket count is part of the data: :data:`layout_key` records it and a
storage built with another count refuses to run (a job would be looked up
in the wrong bucket and never found by the sweep).

What each key holds (unbucketed names; bucketed ones hold the same)::

    <prefix>:{<job>}:record    hash  data (record JSON; or base and dx: adapters.redis.record_format), version,
                                      token, jver, hist (turn history, one mark a line)
    <prefix>:{<job>}:messages  list  one JSON message per entry (append-only)
    <prefix>:{<job>}:logs      list  one JSON log entry per entry
    <prefix>:{<job>}:journal   hash  step key -> JSON result, valid while jver == version
    <prefix>:{<job>}:lease     str   owner token, SET NX PX (Redis expires it)
    <prefix>:{<job>}:events    stream the durable event log (written by commits)
    <prefix>:{<job>}:live      stream the live parts: every event again, plus text deltas
                                      (bounded; expires once the job is finished)
    <prefix>:due               zset  running job ids scored by due_at
    <prefix>:jobs              set   every job id
    <prefix>:finished          zset  finished job ids scored by the time they finished (retention)
    <prefix>:updated           zset  every job id scored by updated_at (the listing, newest first)
    <prefix>:status:<status>   zset  the job ids in one status scored by updated_at (one key per status)
    <prefix>:layout            str   the layout written under this prefix (``buckets=<n>``, then `` records=2``
                                      once records are written as a delta: adapters.redis.record_format)
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import JobStatus, validate_job_id

__all__ = ["IndexKeys", "JobKeys", "KeyLayout", "check_prefix", "finished_key", "index_keys", "index_suffixes",
           "job_keys", "job_suffixes", "layout_key", "listing_keys"]

_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")
#: The most buckets a layout may have: every index read walks them all.
MAX_BUCKETS = 4096


def check_prefix(prefix: object, what: str = "key prefix") -> str:
    """Return ``prefix`` if it is 1+ of ``[A-Za-z0-9._:-]``, else raise :class:`ConfigurationError`."""
    if not isinstance(prefix, str) or not prefix or not set(prefix) <= _PREFIX_CHARS:
        # A brace in the prefix would become the hash tag of every key.
        raise ConfigurationError(f"{what} must be 1+ of [A-Za-z0-9._:-], got {prefix!r}")
    return prefix


class JobKeys(NamedTuple):
    """The Redis keys of one job; all share one hash tag (one cluster slot)."""

    record: str
    messages: str
    logs: str
    journal: str
    lease: str
    events: str  # a stream: XADD per event, the entry id is the reader's cursor
    live: str  # a stream: the events again plus ephemeral parts (text deltas); expires when finished
    inbox: str  # a list: messages sent to the job (app.send), taken by its next turn


class IndexKeys(NamedTuple):
    """The indexes a job's scripts write: the global ones, or its bucket's (same hash tag as the job)."""

    due: str  # zset: running job ids scored by due_at
    jobs: str  # set: every job id
    finished: str  # zset: finished job ids scored by when they finished (retention)
    listing: tuple[str, ...]  # zsets scored by updated_at: every job, then one per status


def _job_keys(base: str) -> JobKeys:
    return JobKeys(f"{base}:record", f"{base}:messages", f"{base}:logs", f"{base}:journal", f"{base}:lease",
                   f"{base}:events", f"{base}:live", f"{base}:inbox")


def _index_keys(base: str) -> IndexKeys:
    listing = (f"{base}:updated", *(f"{base}:status:{s.value}" for s in JobStatus))
    return IndexKeys(f"{base}:due", f"{base}:jobs", f"{base}:finished", listing)


def job_suffixes() -> JobKeys:
    """What each of a job's keys adds to the job's base (``:record`` ...): the scripts name keys from it too."""
    return _job_keys("")


def index_suffixes() -> IndexKeys:
    """What each index key adds to its base (``:due`` ...): the scripts name keys from it too."""
    return _index_keys("")


def job_keys(prefix: str, job_id: str) -> JobKeys:
    """The unbucketed keys of ``job_id`` under ``prefix``. The id is validated: no brace can escape the tag."""
    return _job_keys(f"{prefix}:{{{validate_job_id(job_id)}}}")


def index_keys(prefix: str) -> tuple[str, str]:
    """The unbucketed global keys under ``prefix``: the due index (zset) and the set of all job ids.

    Not hash-tagged: they index every job. The scripts touch them together
    with one job's keys, which is fine on a standalone server or Sentinel but
    a CROSSSLOT error on Redis Cluster (which needs ``buckets``).
    """
    return f"{prefix}:due", f"{prefix}:jobs"


def finished_key(prefix: str) -> str:
    """The unbucketed index of finished jobs under ``prefix`` (zset: job id -> when it finished)."""
    return f"{prefix}:finished"


def listing_keys(prefix: str) -> list[str]:
    """The unbucketed listing indexes, in the scripts' order: every job, then one per status (zsets)."""
    return list(_index_keys(prefix).listing)


def layout_key(prefix: str) -> str:
    """The string key recording the layout (``buckets=<n>``, and the record format) written under ``prefix``."""
    return f"{prefix}:layout"


class KeyLayout:
    """Where the keys of ``prefix`` live: global indexes (``buckets=0``) or ``buckets`` hash-tagged buckets."""

    def __init__(self, prefix: str, buckets: int = 0) -> None:
        self.prefix = check_prefix(prefix)
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not 0 <= buckets <= MAX_BUCKETS:
            raise ConfigurationError(f"buckets must be an int from 0 (no buckets) to {MAX_BUCKETS}, got {buckets!r}")
        self.buckets = buckets
        bases = [prefix] if not buckets else [self._bucket_base(n) for n in range(buckets)]
        #: Every index set, one per bucket (one in all when unbucketed).
        self.indexes: tuple[IndexKeys, ...] = tuple(_index_keys(b) for b in bases)

    def _bucket_base(self, n: int) -> str:
        return f"{self.prefix}:{{{self.prefix}.b{n}}}"

    def bucket(self, job_id: str) -> int:
        """The bucket of ``job_id`` (0 when unbucketed): CRC-32 of the id, the same in every process."""
        return zlib.crc32(validate_job_id(job_id).encode()) % self.buckets if self.buckets else 0

    def job(self, job_id: str) -> JobKeys:
        """The keys of ``job_id`` (validated)."""
        if not self.buckets:
            return job_keys(self.prefix, job_id)
        return _job_keys(f"{self._bucket_base(self.bucket(job_id))}:job:{job_id}")

    def indexes_of(self, job_id: str) -> IndexKeys:
        """The indexes ``job_id``'s scripts write (its bucket's)."""
        return self.indexes[self.bucket(job_id)]

    @property
    def description(self) -> str:
        """What :func:`layout_key` holds for this layout."""
        return f"buckets={self.buckets}"
