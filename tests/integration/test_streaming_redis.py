"""The live stream on real Redis: blocking reads, resuming, expiry of a finished job's live part."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.testing import ScriptedModel, call, reply
from tests.streaming_helpers import followed_texts_match, run_to_the_end

pytestmark = pytest.mark.redis

TEXT = "Order A-1 left the warehouse yesterday and should arrive in two days. " * 4


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    storage = RedisStorage.from_url(redis_url, prefix="stream", live_ttl=120)
    model = ScriptedModel(lambda msgs: TEXT if msgs[-1]["role"] == "tool" else reply("Checking.", call(
        "lookup", order="A-1")))
    # A queue nothing consumes: the test advances the job itself, from another thread.
    yield App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="stream-test"),
              agents=[Agent(name="a", model=model, tools=[lookup])])
    storage.close()


def test_a_follower_blocked_on_redis_receives_every_part_and_the_texts_match_the_transcript(app: App) -> None:
    app.run_agent("a", job_id="s1", messages=["where is A-1?"])
    worker = threading.Thread(target=run_to_the_end, args=(app, "s1"))
    parts: list[Any] = []
    stream = app.stream("s1", timeout=30)
    parts.append(next(stream))  # job_started; the follower now blocks in XREAD
    worker.start()
    parts.extend(stream)
    worker.join(10)
    assert parts[-1].type == "job_finished"
    assert followed_texts_match(app, "s1", parts)
    assert [p for p in parts if p.type not in ("attempt_started", "text_delta")] == app.storage.events("s1")
    assert [p.id for p in parts] == sorted({p.id for p in parts}, key=lambda i: tuple(map(int, i.split("-"))))


def test_resuming_from_any_cursor_misses_nothing_and_repeats_nothing(app: App) -> None:
    app.run_agent("a", job_id="s2", messages=["where is A-1?"])
    run_to_the_end(app, "s2")
    everything = list(app.stream("s2"))
    for cut in range(1, len(everything)):
        rest = list(app.stream("s2", after=everything[cut - 1].id))
        assert [p.id for p in everything[:cut] + rest] == [p.id for p in everything]


def test_a_finished_jobs_live_part_expires_and_its_durable_events_are_replayed(app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="s3", messages=["where is A-1?"])
    assert r.pttl(app.storage.keys("s3").live) == -1  # a running job's live stream is kept  # type: ignore[attr-defined]
    run_to_the_end(app, "s3")
    live_key = app.storage.keys("s3").live  # type: ignore[attr-defined]
    assert 0 < r.pttl(live_key) <= 120_000
    everything = list(app.stream("s3"))
    middle = next(p for p in everything if p.type == "turn_committed" and p.turn == 1)
    r.delete(live_key)  # what the expiry does
    replayed = list(app.stream("s3", after=middle.id))
    durable_after = [p.type for p in everything[everything.index(middle) + 1:] if p.type not in (
        "text_delta", "attempt_started")]
    assert [p.type for p in replayed] == durable_after  # no delta any more, no event twice
    assert app.get("s3").status.value == "complete"


def test_a_malformed_cursor_is_a_clear_error(app: App) -> None:
    app.run_agent("a", job_id="s4", messages=["hi"])
    for bad in ("abc", "1-2-3", "-5", "1-"):
        with pytest.raises(InvalidInputError, match="cursor"):
            list(app.stream("s4", after=bad, follow=False))
