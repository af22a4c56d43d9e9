"""A job's scripts name their own KEYS on the layout without buckets (adapters.redis.scripts.naming).

A script sent only the record key (and the due index's) must name every other key exactly as
``adapters.redis.keys`` does, for any valid id and prefix (in both layouts: the Lua does not depend on
it); a layout with buckets (a Cluster's) is sent every key, and a script sent every key changes none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.scripts import naming
from pipelines import App, Done, Next, Phase, PhaseContext
from pipelines.engine.models import JobStatus

pytestmark = pytest.mark.redis

ORDERS = {"commit": naming.COMMIT_KEYS, "load": naming.LOAD_KEYS, "step": naming.STEP_KEYS}
IDS = ["a", "x:y.z-1", "J_" + "9" * 198, "...", "-:-", "record", "x:record:due", "due:record"]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.mark.parametrize("buckets", [0, 7])
@pytest.mark.parametrize("prefix", ["p", "a.b:c-d_e", "x:"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_a_script_sent_two_keys_names_every_other_as_the_adapter_does(client: redis.Redis, redis_url: str,
                                                                    buckets: int, prefix: str, order: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix=prefix, buckets=buckets)
    conn, roles = storage.conn, ORDERS[order]
    naming_only = naming.naming_fn(roles) + "\nreturn KEYS"
    try:
        for job_id in IDS:
            every = conn.ordered_keys(job_id, roles)
            short = [every[0], every[roles.index("due")]] if "due" in roles else [every[0]]
            # What the storage sends: the two keys without buckets, every key with them.
            assert conn.script_keys(job_id, roles) == (every if buckets else short)
            assert client.eval(naming_only, len(short), *short) == every
            # Sent every key (a Cluster), the script names none of them again.
            assert client.eval(naming_only, len(every), *every) == every
            # Nor when a Cluster's COMMIT names only three listing indexes (writes._pruned): 13 or 14 keys.
            if order == "commit":
                assert client.eval(naming_only, 13, *every[:13]) == every[:13]
    finally:
        storage.client.close()


def test_commit_keys_end_with_every_listing_index_as_the_scripts_count_them(redis_url: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="o")
    try:
        every = storage.conn.all_keys("j")
        assert every[0] == "o:{j}:record" and every[6] == "o:due"
        assert every[-len(JobStatus) - 1:] == ["o:updated", *(f"o:status:{s.value}" for s in JobStatus)]
    finally:
        storage.client.close()


def test_a_job_without_buckets_sends_two_key_names_a_script_at_most(redis_url: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # What the scripts are sent (the ids and key counts of every EVALSHA), and the job still runs whole.
    storage = RedisStorage.from_url(redis_url, prefix="t")
    scripts = storage.conn.scripts
    names = {id(scripts.create): "create", id(scripts.load): "load", id(scripts.step): "step",
             id(scripts.commit): "commit", id(scripts.delete): "delete"}
    sent: list[tuple[str, list[str]]] = []
    run = storage.conn.run

    def counting(script, keys, args, what, **kw):  # type: ignore[no-untyped-def]
        sent.append((names.get(id(script), "other"), list(keys)))
        return run(script, keys, args, what, **kw)

    monkeypatch.setattr(storage.conn, "run", counting)

    def count(ctx: PhaseContext[Any]) -> Next | Done:
        n = ctx.step("count", lambda: int(ctx.state["n"]) + 1)
        return Done(result=n) if n == 3 else Next("count", state={"n": n})

    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"count": [Phase("count", count)]})
    try:
        app.run_pipeline("count", job_id="j", initial_state={"n": 0})
        app.drain()
        assert storage.get_job("j").result == 3  # type: ignore[union-attr]
        assert storage.delete_job("j")
        two, one = ["t:{j}:record", "t:due"], ["t:{j}:record"]
        assert {name for name, _ in sent} >= {"create", "load", "step", "commit", "delete"}
        for name, keys in sent:
            if name != "other":
                assert keys == (one if name == "step" else two), (name, keys)
    finally:
        storage.client.close()
