"""The listing indexes on a real Redis: jobs stored before they existed, ``reindex``, leftovers.

The contract suite (tests/contract) covers the listing itself on every
adapter; here are the Redis-only paths: the fallback scan while jobs are
missing from the index, the migration, and its fence against commits.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.redis import RedisStorage
from adapters.redis.scripts import index_position
from pipelines.engine.models import Checkpoint, Commit, JobRecord, JobStatus

pytestmark = pytest.mark.redis


def record(job_id: str, when: float, status: JobStatus = JobStatus.RUNNING, version: int = 1) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={}, due_at=when)
    return JobRecord(job_id=job_id, status=status, checkpoint=cp, version=version, updated_at=when)


@pytest.fixture
def storage(redis_url: str) -> Iterator[RedisStorage]:
    s = RedisStorage.from_url(redis_url, prefix=f"li{uuid.uuid4().hex[:6]}")
    yield s
    s.close()


def ids(storage: RedisStorage, **kw: Any) -> list[str]:
    return [r.job_id for r in storage.list_jobs(**kw)]


def forget_the_index(storage: RedisStorage) -> None:
    """What a database written before the listing indexes looks like: records, job set, no index keys."""
    storage.client.delete(*storage.listing_keys)


def test_jobs_stored_before_the_index_are_listed_by_a_scan_until_reindex(
    storage: RedisStorage, caplog: pytest.LogCaptureFixture
) -> None:
    for n in range(5):
        storage.create_job(record(f"j{n}", float(n), JobStatus.ERROR if n % 2 else JobStatus.COMPLETE))
    forget_the_index(storage)
    assert storage.unindexed() == 5
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        assert ids(storage) == ["j4", "j3", "j2", "j1", "j0"]  # the same listing, read from every record
    assert "pipelines reindex" in caplog.text and "5 jobs are not in the listing index" in caplog.text
    assert ids(storage, status=JobStatus.ERROR, limit=1) == ["j3"]
    assert storage.count_jobs(status=JobStatus.COMPLETE) == 3 and storage.count_jobs() == 5

    assert storage.reindex() == 5
    assert storage.unindexed() == 0
    assert storage.client.zcard(storage.listing_keys[0]) == 5
    assert ids(storage, status=JobStatus.ERROR) == ["j3", "j1"]
    assert storage.count_jobs(status=JobStatus.COMPLETE) == 3 and storage.reindex() == 5  # idempotent


def test_reindex_never_overwrites_what_a_commit_indexed_since_the_record_was_read(storage: RedisStorage) -> None:
    old = record("j1", 1.0)
    storage.create_job(old)
    forget_the_index(storage)
    done = old.model_copy(update={"version": 2, "status": JobStatus.COMPLETE, "updated_at": 5.0})
    storage.commit(Commit(job_id="j1", expected_version=1, token=uuid.uuid4().hex, record=done))
    # A reindex that read the record at version 1 (running) comes after that commit.
    keys = [storage.keys("j1").record, *storage.listing_keys]
    reply = storage.scripts.reindex(keys=keys, args=["j1", "1", index_position(JobStatus.RUNNING), "1.0"])
    assert reply == b"moved"
    assert ids(storage, status=JobStatus.RUNNING) == [] and ids(storage, status=JobStatus.COMPLETE) == ["j1"]
    assert storage.client.zscore(storage.listing_keys[0], "j1") == 5.0


def test_entries_of_records_deleted_by_hand_are_skipped_then_dropped_by_reindex(storage: RedisStorage) -> None:
    for n in range(5):
        storage.create_job(record(f"j{n}", float(n)))
    storage.client.delete(storage.keys("j4").record, storage.keys("j3").record)
    assert ids(storage, limit=2) == ["j2", "j1"]  # a full page all the same
    assert storage.count_jobs() == 5  # counted from the index: the leftovers too, until reindex
    assert storage.reindex() == 3
    assert storage.count_jobs() == 3 and storage.count_jobs(status=JobStatus.RUNNING) == 3
    assert ids(storage) == ["j2", "j1", "j0"]


def test_a_listing_reads_only_its_page(storage: RedisStorage) -> None:
    for n in range(300):
        storage.create_job(record(f"j{n:03d}", float(n), JobStatus.COMPLETE))
    before = storage.client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
    assert ids(storage, limit=10) == [f"j{n:03d}" for n in range(299, 289, -1)]
    after = storage.client.info("commandstats")["cmdstat_hmget"]["calls"]
    assert after - before == 10  # one record read per listed job, not one per stored job
