"""Async followers hold no thread while they wait: many idle ones, and an active one that misses nothing.

``app.astream`` on memory (a future the publisher resolves), on an SQLite file
(futures one watcher per event loop resolves), and on a real Redis (one
multiplexed ``XREAD BLOCK`` per event loop) and a Redis Cluster.
The loop's default executor is replaced by one that counts the calls running
in it, and is large enough that a follower holding a thread would show.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.base import AsyncLiveStore, Storage
from adapters.local import LocalScheduler
from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from adapters.sqlite import SQLiteStorage
from pipelines import Agent, App, streams, tool
from pipelines.engine.errors import CorruptRecordError
from pipelines.engine.models import Event
from pipelines.testing import ScriptedModel, call, reply
from tests.streaming_helpers import followed_texts_match, run_to_the_end

IDLE = 100  # more than one XREAD names (adapters.redis.live_async._KEYS): the keys are split over several
TEXT = "Order A-1 left the warehouse yesterday and should arrive within two days. " * 3


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


class Paced(ScriptedModel):
    """Streams its text in small pieces a few milliseconds apart, as a provider does (several batches a turn)."""

    def complete(self, request: Any) -> Any:
        if request.on_delta is not None:
            deliver = request.on_delta

            def paced(text: str) -> None:
                time.sleep(0.003)
                deliver(text)

            request = dataclasses.replace(request, on_delta=paced)
        return super().complete(request)


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """A default executor that records the most calls it ran at once (a follower holding a thread shows here)."""

    def __init__(self) -> None:
        super().__init__(max_workers=4 * IDLE)
        self.running = self.most = 0
        self._count = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        def counted() -> Any:
            with self._count:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                return fn(*args, **kwargs)
            finally:
                with self._count:
                    self.running -= 1
        return super().submit(counted)


def model() -> Paced:
    return Paced(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply("Checking.", call("lookup", order="A-1")))


def make_app(storage: Storage, scheduler: Any) -> App:
    return App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=model(), tools=[lookup])])


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("cluster", marks=pytest.mark.redis)])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    """An App whose queue nothing consumes: the test advances the active job itself, in a plain thread."""
    if request.param == "memory":
        yield make_app(MemoryStorage(), MemoryScheduler())
        return
    if request.param == "sqlite":
        sqlite = SQLiteStorage(str(tmp_path / "followers.db"))
        yield make_app(sqlite, LocalScheduler(workers=0))
        sqlite.close()
        return
    if request.param == "redis":
        storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="afollow")
        scheduler = RQScheduler.for_storage(storage, queue="afollow-test")
    else:  # the jobs on the cluster, the (unused) queue on a plain Redis, as RQ requires
        storage = RedisStorage.from_url(request.getfixturevalue("redis_cluster_url"), prefix="afollow",
                                        cluster=True)
        queue_redis = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        request.addfinalizer(queue_redis.close)
        scheduler = RQScheduler.for_storage(storage, queue="afollow-test", connection=queue_redis)
    yield make_app(storage, scheduler)
    storage.close()


def in_order(parts: list[Event]) -> bool:
    keys = [tuple(int(x) for x in p.id.split("-")) for p in parts]
    return keys == sorted(set(keys))


async def follow_idle_and_active(app: App) -> tuple[CountingExecutor, int, list[Event], list[list[Event]]]:
    """``IDLE`` followers of jobs nobody advances, then one of a job a thread runs to its end.

    Returns the executor, how many threads the idle followers added (looking at their jobs' statuses over
    and over meanwhile), the active follower's parts, and what each idle follower received.
    """
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    threads = threading.active_count()
    idle: list[list[Event]] = [[] for _ in range(IDLE)]
    first = [asyncio.Event() for _ in range(IDLE)]

    async def follow_idle(i: int) -> None:
        async for part in app.astream(f"idle-{i}"):
            idle[i].append(part)
            first[i].set()

    tasks = [asyncio.create_task(follow_idle(i)) for i in range(IDLE)]
    try:
        for got in first:
            await got.wait()
        await asyncio.sleep(1.0)  # every idle follower waits, and has looked at its job's status a few times
        added = threading.active_count() - threads
        worker = threading.Thread(target=run_to_the_end, args=(app, "active"))
        active: list[Event] = []
        async for part in app.astream("active", timeout=60):
            active.append(part)
            if len(active) == 1:
                worker.start()  # the follower is in its wait when the first text is published
        worker.join(30)
        return executor, added, active, idle
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        executor.shutdown(wait=False)


def test_idle_async_followers_hold_no_thread_and_an_active_one_receives_every_part_in_order(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(app.storage, AsyncLiveStore)
    # Waits end every 0.2 s instead of 30: each idle follower looks at its job's status many times meanwhile,
    # all of them at once, as followers that connected together do.
    monkeypatch.setattr(streams, "_AWAIT", 0.2)
    for i in range(IDLE):
        app.run_agent("a", job_id=f"idle-{i}", messages=["where is A-1?"])
    app.run_agent("a", job_id="active", messages=["where is A-1?"])

    executor, added, active, idle = asyncio.run(follow_idle_and_active(app))

    # A hundred followers waited through a whole streamed job and no thread was started per follower: their status
    # reads share two threads, and the default executor ran at most one call at a time (on Redis, the durable
    # events of a follower that fell a whole turn behind), and that only after they settled.
    assert executor.most <= 1, executor.most
    assert added <= 2, added
    assert all([p.type for p in parts] == ["job_started"] for parts in idle)
    # The active follower got every part once, in order: the committed events exactly, and each turn's text.
    assert active[-1].type == "job_finished" and in_order(active)
    committed = [p.model_dump(exclude={"id"}) for p in active if p.type not in ("attempt_started", "text_delta")]
    assert committed == [e.model_dump(exclude={"id"}) for e in app.storage.events("active")]
    assert followed_texts_match(app, "active", active)
    assert sum(p.type == "text_delta" for p in active) >= 4  # the text came in several batches while followed
    if isinstance(app.storage, MemoryStorage):  # memory keeps every part: the sync reader sees the same list
        assert active == list(app.stream("active", follow=False))


@pytest.fixture
def redis_app(redis_url: str) -> Iterator[App]:
    """A standalone Redis whose XREAD rounds block for a minute: only CLIENT UNBLOCK ends one early."""
    storage = RedisStorage.from_url(redis_url, prefix="aring")
    storage.max_block = 60.0
    yield make_app(storage, RQScheduler.for_storage(storage, queue="aring-test"))
    storage.close()


def delta(text: str) -> Event:
    return Event(timestamp=time.time(), type="text_delta", turn=1, data={"text": text, "attempt": "x"})


async def last_id(storage: RedisStorage, job_id: str) -> str:
    return (await storage.aread_live(job_id))[-1].id


@pytest.mark.redis
def test_a_follower_that_joins_while_the_xread_blocks_on_other_keys_gets_its_first_part(redis_app: App) -> None:
    storage = redis_app.storage
    assert isinstance(storage, RedisStorage)
    for job in ("quiet", "late"):
        redis_app.run_agent("a", job_id=job, messages=["hi"])

    async def main() -> tuple[list[Event], bool]:
        quiet = asyncio.create_task(storage.aread_live("quiet", after=await last_id(storage, "quiet"), block=60))
        await asyncio.sleep(0.2)  # the loop's XREAD now blocks on "quiet" alone, for up to a minute
        late = asyncio.create_task(storage.aread_live("late", after=await last_id(storage, "late"), block=60))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(storage.publish, "late", [delta("hello")])
        # Without the interruption this waits out the first XREAD's minute.
        parts = await asyncio.wait_for(late, 20)
        still_waiting = not quiet.done()
        quiet.cancel()
        return parts, still_waiting

    parts, still_waiting = asyncio.run(main())
    assert [p.data["text"] for p in parts] == ["hello"]
    assert still_waiting  # interrupting the XREAD woke nobody else: the other follower waits on


@pytest.mark.redis
def test_a_live_key_of_another_type_fails_its_own_follower_and_not_the_others_sharing_the_xread(
        redis_app: App, redis_url: str) -> None:
    storage = redis_app.storage
    assert isinstance(storage, RedisStorage)
    for job in ("good", "bad"):
        redis_app.run_agent("a", job_id=job, messages=["hi"])

    async def main() -> tuple[list[Event], BaseException | None]:
        good = asyncio.create_task(storage.aread_live("good", after=await last_id(storage, "good"), block=60))
        bad_after = await last_id(storage, "bad")
        client = redis.Redis.from_url(redis_url)
        client.delete(storage.keys("bad").live)
        client.set(storage.keys("bad").live, "not a stream")  # one XREAD names both keys: WRONGTYPE for all
        client.close()
        bad = asyncio.create_task(storage.aread_live("bad", after=bad_after, block=60))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(storage.publish, "good", [delta("still here")])
        parts = await asyncio.wait_for(good, 20)
        failure = (await asyncio.gather(asyncio.wait_for(bad, 20), return_exceptions=True))[0]
        return parts, failure if isinstance(failure, BaseException) else None

    parts, failure = asyncio.run(main())
    assert isinstance(failure, CorruptRecordError) and "live" in str(failure)
    assert [p.data["text"] for p in parts] == ["still here"]


@pytest.mark.redis
def test_busy_streams_followed_in_one_loop_cost_no_client_unblock_per_batch_of_text(redis_app: App,
                                                                                    redis_url: str) -> None:
    # Three streams each get a part every 20 ms, each followed in one event loop: every reply of the shared
    # XREAD ends its round while the other followers are still reading. A follower back from its read must be
    # covered by the XREAD in flight (or answered at once), not interrupt it: CLIENT UNBLOCK is for a key
    # that was never named, not a cost per batch of text (it was ~0.16 a part).
    storage = redis_app.storage
    assert isinstance(storage, RedisStorage)
    jobs = ["busy-0", "busy-1", "busy-2"]
    for job in jobs:
        redis_app.run_agent("a", job_id=job, messages=["hi"])
    stats = redis.Redis.from_url(redis_url)

    def unblocks() -> int:
        return int(stats.info("commandstats").get("cmdstat_client|unblock", {}).get("calls", 0))

    def publish(job: str, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            storage.publish(job, [delta(f"{job}:{n}")])
            n += 1
            time.sleep(0.02)

    async def follow(job: str, stop: asyncio.Event, texts: list[str]) -> None:
        after = await last_id(storage, job)
        while not stop.is_set():
            parts = await storage.aread_live(job, after=after, block=1.0)
            if parts:
                after = parts[-1].id
                texts += [p.data["text"] for p in parts]

    async def main() -> tuple[dict[str, list[str]], int]:
        stop, texts = asyncio.Event(), {job: [] for job in jobs}
        followers = [asyncio.create_task(follow(job, stop, texts[job])) for job in jobs]
        await asyncio.sleep(0.3)  # every follower waits: the XREAD names every key
        before, done = unblocks(), threading.Event()
        publishers = [threading.Thread(target=publish, args=(job, done)) for job in jobs]
        for t in publishers:
            t.start()
        await asyncio.sleep(2.0)
        done.set()
        for t in publishers:
            await asyncio.to_thread(t.join)
        await asyncio.sleep(0.3)
        rung = unblocks() - before
        stop.set()
        await asyncio.gather(*followers)
        return texts, rung

    texts, rung = asyncio.run(main())
    stats.close()
    for job in jobs:  # each follower read its stream's parts in order, none missed, none twice
        assert texts[job] == [f"{job}:{n}" for n in range(len(texts[job]))] and len(texts[job]) >= 40, texts[job][:5]
    assert rung <= 2, f"{rung} CLIENT UNBLOCKs for {sum(map(len, texts.values()))} parts"


def test_a_follower_behind_an_entry_the_group_saw_is_answered_at_once_but_once_per_cursor() -> None:
    from adapters.redis import live_async

    class Blocked:  # an XREAD connection whose read never returns: only add() itself can answer
        async def client_id(self) -> int:
            return 1

        async def xread(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.Event().wait()

    async def main() -> tuple[bool, bool, bool]:
        group = live_async._Group(lambda: Blocked(), None, 60.0)  # type: ignore[arg-type,return-value]
        first = group.add("live", "0-0")
        group._wake({"live": [("5-0", {})]})  # an entry the XREAD returned: it wakes the first follower
        # A second follower had read up to 3-0 when the entry came: it is answered without a round.
        behind = group.add("live", "3-0")
        again = group.add("live", "3-0")  # its read found nothing after all (the stream went): it waits for real
        ahead = group.add("live", "5-0")
        await asyncio.sleep(0.05)
        answers = first.done() and behind.done(), again.done(), ahead.done()
        if group._task is not None:
            group._task.cancel()
        return answers

    assert asyncio.run(main()) == (True, False, False)
