"""Flow control on a real Redis: the scripts agree with the memory twin, and an App defers over its limits."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from adapters.redis import RedisStorage
from adapters.redis_flow import RedisFlowStore
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", "redis-cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[RedisFlowStore]:
    # Every flow script touches one key, so it runs on a Redis Cluster as is.
    if request.param == "redis-cluster":
        storage = RedisStorage.from_url(request.getfixturevalue("redis_cluster_url"), prefix="fl", cluster=True)
    else:
        storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="fl")
    yield storage.flow_store()
    storage.client.close()


def test_the_rate_bucket_grants_its_burst_then_says_how_long_to_wait(store: RedisFlowStore) -> None:
    limit = dict(rpm=120.0, tpm=None, burst=1.0)  # 2 a second, a bucket of 2
    assert store.take_rate("m", **limit, tokens=1, now=0.0) == 0.0  # type: ignore[arg-type]
    assert store.take_rate("m", **limit, tokens=1, now=0.0) == 0.0  # type: ignore[arg-type]
    wait = store.take_rate("m", **limit, tokens=1, now=0.0)  # type: ignore[arg-type]
    assert 0.0 < wait <= 0.5 + 1e-3  # one request refills in half a second


def test_a_block_refuses_every_take_until_it_ends(store: RedisFlowStore) -> None:
    store.block_rate("m", 30.0, now=0.0)
    wait = store.take_rate("m", rpm=6000.0, tpm=None, burst=1.0, tokens=1, now=0.0)
    assert 29.0 < wait <= 30.0
    assert store.take_rate("other", rpm=6000.0, tpm=None, burst=1.0, tokens=1, now=0.0) == 0.0


def test_token_corrections_put_the_bucket_in_debt(store: RedisFlowStore) -> None:
    limit = dict(rpm=None, tpm=600.0, burst=1.0)  # 10 tokens a second, a bucket of 10
    assert store.take_rate("m", **limit, tokens=5, now=0.0) == 0.0  # type: ignore[arg-type]
    store.adjust_rate("m", 20)  # the call used 25, not 5
    wait = store.take_rate("m", **limit, tokens=5, now=0.0)  # type: ignore[arg-type]
    assert 1.9 < wait <= 2.0


def test_slots_hold_at_most_the_limit_and_expire_with_their_lease(store: RedisFlowStore) -> None:
    assert store.take_slot("k", "a", limit=2, ttl=0.3, now=0.0) == 0.0
    assert store.take_slot("k", "b", limit=2, ttl=30.0, now=0.0) == 0.0
    assert store.take_slot("k", "a", limit=2, ttl=0.3, now=0.0) == 0.0  # a holder renews its own slot
    wait = store.take_slot("k", "c", limit=2, ttl=30.0, now=0.0)
    assert 0.0 < wait <= 0.3
    assert store.slots("k", 0.0) == ["a", "b"]
    store.release_slot("k", "b")
    assert store.take_slot("k", "c", limit=2, ttl=30.0, now=0.0) == 0.0
    time.sleep(0.35)  # a's worker died: its slot's lease runs out (by the server's clock)
    assert store.take_slot("k", "d", limit=2, ttl=30.0, now=0.0) == 0.0
    assert store.slots("k", 0.0) == ["c", "d"]


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def test_an_app_on_redis_defers_a_turn_over_its_concurrency_limit(redis_url: str) -> None:
    from adapters.memory import MemoryScheduler

    storage = RedisStorage.from_url(redis_url, prefix="fa")
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"t-": 1},
              agents=[Agent(name="w", model=ScriptedModel(lambda m: "done"), tools=[noop], stream=False)])
    store = storage.flow_store()
    store.take_slot("t-1", "elsewhere", limit=1, ttl=30.0, now=0.0)
    app.run_agent("w", job_id="j", user="go", concurrency_key="t-1")
    assert app.advance("j") is AdvanceResult.DEFERRED
    record = storage.get_job("j")
    assert record is not None and record.status is JobStatus.RUNNING and record.version == 1
    store.release_slot("t-1", "elsewhere")
    assert app.advance("j") is AdvanceResult.COMPLETED
    assert store.slots("t-1", 0.0) == []
    storage.client.close()
