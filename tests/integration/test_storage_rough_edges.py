"""Two storage rough edges: why a late write was fenced off, and index entries of a record deleted by hand."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from pipelines import JobStatus
from pipelines.engine.errors import StaleVersionError
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, LogEntry

JOB = "job-1"
NO_HOLDER = "no worker holds its lease (this worker's lease expired)"
OTHER_HOLDER = "is leased by another worker"


def record(*, version: int = 1) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={"n": version}, version=version, due_at=100.0)
    return JobRecord(job_id=JOB, status=JobStatus.RUNNING, checkpoint=cp, version=version)


def next_commit(owner: str) -> Commit:
    return Commit(job_id=JOB, expected_version=1, owner=owner, token=uuid.uuid4().hex, record=record(version=2))


class Backend:
    """A storage plus a way to make its lease run out (the clock for memory, Redis's own expiry for Redis)."""

    def __init__(self, storage: Any, expire_lease: Callable[[], object]) -> None:
        self.storage = storage
        self.expire_lease = expire_lease


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        clock = VirtualClock(start=1_000_000.0)
        yield Backend(MemoryStorage(clock=clock), lambda: clock.advance(31))
        return
    request.applymarker(pytest.mark.redis)
    storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="rough")
    # Deleting the key is exactly what PX expiry does, without waiting for it.
    yield Backend(storage, lambda: storage.client.delete(storage.keys(JOB).lease))
    storage.close()


def test_a_late_commit_says_the_lease_expired_when_nobody_holds_it(backend: Backend) -> None:
    s = backend.storage
    s.create_job(record())
    assert s.acquire_lease(JOB, "w1", 30) is not None
    backend.expire_lease()
    with pytest.raises(StaleVersionError, match=NO_HOLDER.replace("(", r"\(").replace(")", r"\)")):
        s.commit(next_commit("w1"))
    with pytest.raises(StaleVersionError, match=r"lease expired\); step 'model' at version 1 not recorded"):
        s.record_step(JOB, version=1, owner="w1", key="model", value=1)
    rec = s.get_job(JOB)
    assert rec is not None and rec.version == 1 and rec.checkpoint.journal == {}


def test_a_late_commit_says_another_worker_holds_the_lease(backend: Backend) -> None:
    s = backend.storage
    s.create_job(record())
    assert s.acquire_lease(JOB, "w1", 30) is not None
    backend.expire_lease()
    assert s.acquire_lease(JOB, "w2", 30) is not None
    with pytest.raises(StaleVersionError, match=OTHER_HOLDER) as caught:
        s.commit(next_commit("w1"))
    assert "expired" not in str(caught.value)
    with pytest.raises(StaleVersionError, match=f"{OTHER_HOLDER}; step 'model' at version 1 not recorded"):
        s.record_step(JOB, version=1, owner="w1", key="model", value=1)
    s.commit(next_commit("w2"))  # the holder still commits
    rec = s.get_job(JOB)
    assert rec is not None and rec.version == 2


# --- a record deleted by hand mid-run ----------------------------------------------
@pytest.mark.redis
@pytest.mark.parametrize("read", ["get_job", "acquire_lease"])
def test_loading_a_record_deleted_by_hand_drops_it_from_the_indexes(redis_url: str, read: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="rough")
    r = redis.Redis.from_url(redis_url)
    storage.create_job(record())
    other = record().model_copy(update={"job_id": "job-2"})
    storage.create_job(other)
    r.delete(storage.keys(JOB).record)
    assert storage.due_jobs(1e12) == [JOB, "job-2"]  # the stale entry a sweep would see

    if read == "get_job":
        assert storage.get_job(JOB) is None
    else:
        assert storage.acquire_lease(JOB, "w1", 30) is None
        assert storage.lease_owner(JOB) is None  # no lease taken on a job that is gone

    assert storage.due_jobs(1e12) == ["job-2"]
    assert r.smembers(storage.jobs_key) == {b"job-2"}
    assert [j.job_id for j in storage.list_jobs()] == ["job-2"]
    storage.close()
    r.close()


def _job_keys(r: redis.Redis, job_id: str) -> list[str]:
    """Every key of ``job_id`` under ``rough``, unbucketed or bucketed."""
    return sorted(k.decode() for pattern in (f"rough:{{{job_id}}}:*", f"rough:*:job:{job_id}:*")
                  for k in r.scan_iter(match=pattern))


def _named_by_an_index(r: redis.Redis, job_id: str) -> list[str]:
    """The index keys under ``rough`` that still name ``job_id``."""
    named = []
    for key in r.scan_iter(match="rough:*"):
        kind = r.type(key).decode()
        if (kind == "zset" and r.zscore(key, job_id) is not None) or (kind == "set" and r.sismember(key, job_id)):
            named.append(key.decode())
    return sorted(named)


@pytest.mark.redis
@pytest.mark.parametrize("buckets", [0, 4])
@pytest.mark.parametrize("read", ["get_job", "acquire_lease"])
def test_a_job_whose_record_is_gone_loses_its_other_keys_too_said_once(
        redis_url: str, read: str, buckets: int, caplog: pytest.LogCaptureFixture) -> None:
    # Issue 30 (14): a job's records live and die together. Its events, live stream, logs, transcript,
    # journal and inbox used to stay for ever once its record was deleted by hand (or evicted).
    storage = RedisStorage.from_url(redis_url, prefix="rough", buckets=buckets)
    r = redis.Redis.from_url(redis_url)
    storage.create_job(record(), messages=[{"role": "user", "content": "hi"}],
                       logs=[LogEntry(timestamp=1.0, phase="a", level="info", message="started")],
                       events=[Event(timestamp=1.0, type="job_started")])
    storage.create_job(record().model_copy(update={"job_id": "job-2"}), messages=[{"role": "user", "content": "x"}])
    assert storage.acquire_lease(JOB, "w1", 30) is not None  # a worker mid-turn: journal, live parts, inbox
    storage.record_step(JOB, version=1, owner="w1", key="model", value={"text": "hel"})
    storage.publish(JOB, [Event(timestamp=2.0, type="text_delta", data={"text": "hel"})])
    assert storage.send(JOB, [{"role": "user", "content": "and then?"}]) == 1
    other_keys = _job_keys(r, "job-2")
    r.delete(storage.keys(JOB).record)

    with caplog.at_level(logging.WARNING, logger="pipelines"):
        for _ in range(2):  # the second read finds nothing left to remove: said once
            if read == "get_job":
                assert storage.get_job(JOB) is None
            else:
                assert storage.acquire_lease(JOB, "w2", 30) is None
    assert _job_keys(r, JOB) == []
    assert _named_by_an_index(r, JOB) == []
    gone = [rec.getMessage() for rec in caplog.records if JOB in rec.getMessage()]
    assert len(gone) == 1 and "record is gone" in gone[0] and "its due entry" in gone[0], gone
    # The other job kept everything.
    assert _job_keys(r, "job-2") == other_keys and storage.due_jobs(1e12) == ["job-2"]
    assert storage.count_jobs() == 1 and storage.count_jobs(JobStatus.RUNNING) == 1
    storage.close()
    r.close()


@pytest.mark.redis
def test_a_finished_job_whose_record_is_gone_leaves_the_finished_index(redis_url: str) -> None:
    # Retention reads the finished index: a stale entry there was read again by every gc.
    storage = RedisStorage.from_url(redis_url, prefix="rough")
    r = redis.Redis.from_url(redis_url)
    done = JobRecord(job_id=JOB, status=JobStatus.COMPLETE, version=1, updated_at=5.0)
    storage.create_job(done, events=[Event(timestamp=1.0, type="job_finished")])
    assert storage.finished_jobs(1e12) == [JOB]
    r.delete(storage.keys(JOB).record)
    assert storage.get_job(JOB) is None
    assert storage.finished_jobs(1e12) == [] and _job_keys(r, JOB) == [] and _named_by_an_index(r, JOB) == []
    storage.close()
    r.close()


@pytest.mark.redis
def test_a_job_created_again_meanwhile_is_not_taken_for_leftovers(redis_url: str) -> None:
    # LOAD saw no record; before the leftovers were deleted, the same id was created again: left whole.
    storage = RedisStorage.from_url(redis_url, prefix="rough")
    r = redis.Redis.from_url(redis_url)
    storage.create_job(record(), messages=[{"role": "user", "content": "old"}])
    r.delete(storage.keys(JOB).record)
    real = storage.records.delete_leftovers

    def recreated_first(job_id: str) -> None:
        storage.delete_job(job_id)
        storage.create_job(record(), messages=[{"role": "user", "content": "new"}])
        real(job_id)

    storage.records.delete_leftovers = recreated_first  # type: ignore[method-assign]
    assert storage.get_job(JOB) is None  # what the load saw
    rec = storage.get_job(JOB)
    assert rec is not None and storage.messages(JOB) == [{"role": "user", "content": "new"}]
    assert storage.due_jobs(1e12) == [JOB]
    storage.close()
    r.close()
