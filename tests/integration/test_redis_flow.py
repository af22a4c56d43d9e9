"""Flow control on a real Redis: the scripts agree with the memory twin, and an App defers over its limits."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory.flow import DEADLINE_BASE, PLACE_BASE
from adapters.redis import RedisStorage
from adapters.redis.flow import RedisFlowStore
from pipelines import Agent, App, JobStatus, RateLimit, tool
from pipelines.engine.errors import MAX_RETRY_AFTER_SECONDS, InvalidInputError
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.redis


@pytest.fixture(params=["redis", "redis-cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[RedisFlowStore]:
    # Every flow script touches one key, so it runs on a Redis Cluster as is.
    if request.param == "redis-cluster":
        storage = RedisStorage.from_url(request.getfixturevalue("redis_cluster_url"), prefix="fl", cluster=True)
    else:
        storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="fl")
    yield storage.flow_store()
    storage.close()


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
    storage.close()


# --- issue 30: every outside number bounded; a slot lives with its lease -------------------------------
def test_the_block_script_refuses_an_endless_block_before_it_writes(store: RedisFlowStore) -> None:
    for bad in ("inf", "nan", "-1", "1e9"):
        with pytest.raises(InvalidInputError, match="out of range; nothing was written"):
            store._run(store._block, store.rate_key("m"), [bad], "blocking model 'm'")  # past the Python check
        with pytest.raises(InvalidInputError, match="a model's block must be seconds"):
            store.block_rate("m", float(bad), now=0.0)
    assert store.client.exists(store.rate_key("m")) == 0
    assert store.take_rate("m", rpm=6000.0, tpm=None, burst=1.0, tokens=1, now=0.0) == 0.0


def test_an_endless_block_written_before_the_bounds_ends_at_the_maximum(store: RedisFlowStore) -> None:
    store.client.hset(store.rate_key("m"), mapping={"b": "inf"})  # what BLOCK_RATE wrote for Retry-After: inf
    wait = store.take_rate("m", rpm=6000.0, tpm=None, burst=1.0, tokens=1, now=0.0)
    assert MAX_RETRY_AFTER_SECONDS - 5 < wait <= MAX_RETRY_AFTER_SECONDS
    assert 0 < store.client.pttl(store.rate_key("m")) <= (MAX_RETRY_AFTER_SECONDS + 120) * 1000  # it will end


def test_a_slot_is_renewed_only_while_it_is_held(store: RedisFlowStore) -> None:
    assert store.take_slot("k", "a", limit=1, ttl=0.3, now=0.0) == 0.0
    assert store.renew_slot("k", "a", ttl=30.0, now=0.0) is True
    time.sleep(0.35)  # past the slot's first expiry: renewed, it is still a's
    assert store.take_slot("k", "b", limit=1, ttl=30.0, now=0.0) > 0  # b waits in the key's line
    assert store.slots("k", 0.0) == ["a"] and store.line("k", 0.0) == ["b"]
    a_expiry = store.client.zscore(store.slots_key("k"), "a")
    assert a_expiry is not None and a_expiry - time.time() > 29  # the renewal's 30 s, not the first 0.3 s
    assert store.client.pttl(store.slots_key("k")) > 29_000  # the key lives as long as its longest slot
    store.release_slot("k", "a")
    assert store.renew_slot("k", "a", ttl=30.0, now=0.0) is False  # a renewal after the release brings nothing back
    assert store.slots("k", 0.0) == []
    with pytest.raises(InvalidInputError, match="a concurrency slot's ttl"):
        store.renew_slot("k", "a", ttl=math.inf, now=0.0)


def slot_app(redis_url: str, lease: float, long_tool: Any) -> tuple[App, RedisStorage]:
    from adapters.memory import MemoryScheduler

    storage = RedisStorage.from_url(redis_url, prefix="fs")
    long_agent = Agent(name="long", model=ScriptedModel([reply("working", call("long_tool")), reply("done")]),
                       tools=[long_tool], stream=False)
    quick = Agent(name="quick", model=ScriptedModel(lambda m: "done"), stream=False)
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"k": 1},
              lease_seconds=lease, agents=[long_agent, quick])
    return app, storage


def test_a_tool_longer_than_the_slot_keeps_a_second_job_of_its_key_out_on_redis(redis_url: str) -> None:
    seen: list[AdvanceResult] = []

    @tool
    def long_tool() -> str:
        """Run past the slot's first expiry (1.5 x lease), then see whether another job of the key may run."""
        time.sleep(2.2)
        seen.append(app.advance("b"))
        return "ok"

    app, storage = slot_app(redis_url, 1.0, long_tool)
    app.run_agent("long", job_id="a", user="go", concurrency_key="k")
    app.run_agent("quick", job_id="b", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.ADVANCED
    assert seen == [AdvanceResult.DEFERRED]  # the lease keeper renewed a's slot with its lease
    assert storage.flow_store().slots("k", 0.0) == []
    storage.close()


def test_a_lost_lease_gives_its_slot_back_on_redis(redis_url: str) -> None:
    held: list[list[str]] = []

    @tool
    def long_tool() -> str:
        """Lose the lease (another worker's now), then watch the slot: it goes at the keeper's next pass."""
        store = storage.flow_store()
        storage.client.set(storage.keys("a").lease, "another-worker")
        deadline = time.monotonic() + 3.0  # the slot's own expiry is 4.5 s away
        while store.slots("k", 0.0) and time.monotonic() < deadline:
            time.sleep(0.05)
        held.append(store.slots("k", 0.0))
        return "ok"

    app, storage = slot_app(redis_url, 3.0, long_tool)
    app.run_agent("long", job_id="a", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.STALE
    assert held == [[]]
    storage.close()


def test_a_place_in_the_line_whose_job_stopped_asking_lapses_on_redis(store: RedisFlowStore) -> None:
    assert store.take_slot("k", "a", limit=1, ttl=30.0, now=0.0) == 0.0
    store.release_slot("k", "a")
    # A job that asked and was then deleted: its place runs out like a dead worker's slot.
    sec = store.client.time()[0]
    store.client.zadd(store.slots_key("k"), {"?gone": PLACE_BASE + sec, "!gone": DEADLINE_BASE + sec + 1.5})
    assert store.line("k", 0.0) == ["gone"]
    assert 0 < store.take_slot("k", "c", limit=1, ttl=30.0, now=0.0) <= 0.5  # behind it: asks again soon
    assert store.line("k", 0.0) == ["gone", "c"]
    time.sleep(1.6)
    assert store.take_slot("k", "c", limit=1, ttl=30.0, now=0.0) == 0.0
    assert store.line("k", 0.0) == [] and store.slots("k", 0.0) == ["c"]


def test_a_deferred_turn_is_not_sent_again_by_every_sweep(redis_url: str) -> None:
    from adapters.rq import RQScheduler

    class Limited(ScriptedModel):
        model = "slow-model"

    storage = RedisStorage.from_url(redis_url, prefix="dp")
    scheduler = RQScheduler.for_storage(storage, queue="dpq", app="tests.nowhere:app")
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="a", model=Limited(lambda m: "ok"), stream=False)],
              rate_limits=[RateLimit(model="slow-model", rpm=1)])  # one call a minute

    def work_queue() -> None:  # a worker: run what is queued now
        while scheduler.queue.job_ids:
            rq_id = scheduler.queue.job_ids[0]
            scheduler.queue.remove(rq_id)
            app.advance(scheduler.fetch(rq_id).args[0])

    app.run_agent("a", job_id="first", user="hi")
    app.run_agent("a", job_id="second", user="hi")
    work_queue()
    assert app.get("second").status is JobStatus.RUNNING  # type: ignore[union-attr]  # deferred ~60 s
    for _ in range(10):  # ten sweeps, as a worker makes in 20 s: the deferred job is not overdue
        app.requeue_overdue(grace=0)
        work_queue()
    waiting = [i for i in scheduler.queue.scheduled_job_registry.get_job_ids() if "second" in i]
    assert len(waiting) == 1  # one retry, not one more chain of retries per sweep
    assert storage.due_jobs(time.time() + 30) == []  # due when the budget is back, not now
    storage.close()
