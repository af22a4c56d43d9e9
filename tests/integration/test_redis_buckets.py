"""The bucketed key layout (what Redis Cluster needs) on a plain redis-server: slots, layout guard, readers.

The storage contract suite runs every Storage rule on this layout too
(``redis-buckets`` in tests/contract/conftest.py); these tests pin what it
cannot see: which keys share a slot, and that two layouts never mix.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.crc import key_slot

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.keys import KeyLayout, layout_key
from pipelines import App, Done, Next, Phase, PhaseContext
from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import JobRecord, JobStatus

pytestmark = pytest.mark.redis


@pytest.fixture
def storage(redis_url: str) -> Iterator[RedisStorage]:
    s = RedisStorage.from_url(redis_url, prefix="bk", buckets=8)
    yield s
    s.close()


def test_every_key_a_script_touches_shares_the_jobs_slot(storage: RedisStorage) -> None:
    # The keys of one commit: the job's own and its bucket's indexes, all on one slot (no CROSSSLOT).
    slots_seen = set()
    for n in range(40):
        keys = storage.conn.all_keys(f"job-{n}")
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, keys
        slots_seen |= slots
    assert len(slots_seen) == 8  # forty jobs use every bucket


def test_jobs_spread_over_the_buckets_the_same_way_in_every_process() -> None:
    layout = KeyLayout("bk", 8)
    counts = [0] * 8
    for n in range(8000):
        counts[layout.bucket(f"job-{n}")] += 1
    assert min(counts) > 800 and max(counts) < 1200  # about 1,000 each
    # CRC-32, not Python's salted hash(): these are fixed for ever (stored data depends on them).
    assert [layout.bucket(j) for j in ("a", "job-1", "x:y.z")] == [3, 7, 7]


@pytest.mark.parametrize("buckets", [-1, True, 1.5, 4097, "8"])
def test_a_bad_bucket_count_is_refused_by_name(buckets: object) -> None:
    with pytest.raises(ConfigurationError, match="buckets must be an int from 0"):
        KeyLayout("bk", buckets)  # type: ignore[arg-type]


def test_a_storage_with_another_layout_refuses_to_write_the_same_prefix(redis_url: str,
                                                                        storage: RedisStorage) -> None:
    storage.create_job(JobRecord(job_id="a", status=JobStatus.IDLE))
    # A prefix first written by this version records the newest record format beside its buckets.
    assert redis.Redis.from_url(redis_url).get(layout_key("bk")) == b"buckets=8 records=3"
    for buckets in (0, 4):
        other = RedisStorage.from_url(redis_url, prefix="bk", buckets=buckets)
        with pytest.raises(ConfigurationError, match="written with buckets=8 records=3, this storage uses buckets="):
            other.create_job(JobRecord(job_id="b", status=JobStatus.IDLE))
        with pytest.raises(ConfigurationError, match="every process on one prefix must use the same buckets"):
            other.acquire_lease("a", "w", 30)
        other.close()
    assert storage.get_job("b") is None  # nothing half written
    # The same count on the same prefix is fine; so is another prefix with its own layout.
    same = RedisStorage.from_url(redis_url, prefix="bk", buckets=8)
    same.create_job(JobRecord(job_id="b", status=JobStatus.IDLE))
    flat = RedisStorage.from_url(redis_url, prefix="flat")
    flat.create_job(JobRecord(job_id="b", status=JobStatus.IDLE))
    same.close()
    flat.close()


def test_the_global_index_names_are_refused_on_a_bucketed_storage(storage: RedisStorage) -> None:
    with pytest.raises(ConfigurationError, match="8 buckets"):
        _ = storage.due_key


def count(ctx: PhaseContext) -> Next | Done:
    n = int(ctx.state["n"]) + 1
    return Done(result=n) if n >= 3 else Next("count", state={"n": n})


def test_a_pipeline_runs_to_the_end_on_the_bucketed_layout(storage: RedisStorage) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"count": [Phase("count", count)]})
    for n in range(12):
        app.run_pipeline("count", job_id=f"run-{n}", initial_state={"n": 0})
    app.drain()
    assert {r.status for r in storage.list_jobs()} == {JobStatus.COMPLETE}
    assert storage.count_jobs(JobStatus.COMPLETE) == 12 and storage.due_jobs(1e12) == []
    assert sorted(r.job_id for r in storage.list_jobs()) == sorted(f"run-{n}" for n in range(12))
    assert len(storage.finished_jobs(1e12)) == 12
    app.delete("run-0")
    assert storage.get_job("run-0") is None and storage.count_jobs() == 11 and len(storage.finished_jobs(1e12)) == 11


def test_a_reader_with_another_layout_is_refused_not_shown_empty_indexes(redis_url: str,
                                                                        storage: RedisStorage) -> None:
    storage.create_job(JobRecord(job_id="a", status=JobStatus.IDLE))
    other = RedisStorage.from_url(redis_url, prefix="bk", buckets=0)
    # The sweep (due jobs), listings, counts and gc of another layout would silently find nothing.
    for read in (lambda: other.due_jobs(1e12), lambda: other.list_jobs(), lambda: other.count_jobs(),
                 lambda: other.finished_jobs(1e12)):
        with pytest.raises(ConfigurationError, match="written with buckets=8 records=3, this storage uses buckets=0"):
            read()
    other.close()
    assert [r.job_id for r in storage.list_jobs()] == ["a"]  # the right layout reads them


def test_a_bucketed_layout_is_not_recorded_over_jobs_written_without_buckets(redis_url: str) -> None:
    flat = RedisStorage.from_url(redis_url, prefix="old")
    flat.client.delete(layout_key("old"))  # as written before the layout was recorded
    flat.create_job(JobRecord(job_id="a", status=JobStatus.IDLE))
    flat.client.delete(layout_key("old"))
    bucketed = RedisStorage.from_url(redis_url, prefix="old", buckets=8)
    with pytest.raises(ConfigurationError, match="holds jobs written without buckets"):
        bucketed.create_job(JobRecord(job_id="b", status=JobStatus.IDLE))
    assert bucketed.client.get(layout_key("old")) is None and flat.get_job("b") is None
    assert flat.get_job("a") is not None
    flat.close()
    bucketed.close()


def test_the_layout_checked_before_any_write_is_recorded_and_another_refused(redis_url: str) -> None:
    fresh = RedisStorage.from_url(redis_url, prefix="early", buckets=8)
    fresh.conn.check_layout(None)  # what `pipelines worker` does before it takes a job
    assert fresh.client.get(layout_key("early")) == b"buckets=8 records=3"
    fresh.conn.check_layout(None)  # once per storage: no second round trip, no error
    other = RedisStorage.from_url(redis_url, prefix="early", buckets=0)
    with pytest.raises(ConfigurationError, match="written with buckets=8 records=3, this storage uses buckets=0"):
        other.conn.check_layout(None)
    with pytest.raises(ConfigurationError, match="every process on one prefix must use the same buckets"):
        other.create_job(JobRecord(job_id="b", status=JobStatus.IDLE))
    assert fresh.get_job("b") is None
    fresh.close()
    other.close()
