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
        storage.close()


@pytest.mark.parametrize("prefix", ["p", "a.b:c-d_e", "x:"])
def test_a_script_sent_two_keys_reads_the_jobs_id_from_them_and_the_storage_sends_it_empty(
        client: redis.Redis, redis_url: str, prefix: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix=prefix)
    conn = storage.conn
    try:
        for order, at in ((naming.COMMIT_KEYS, 1), (naming.LOAD_KEYS, 3)):
            read_id = naming.naming_fn(order, job_arg=at) + f"\nreturn ARGV[{at}]"
            for job_id in IDS:
                keys = conn.script_keys(job_id, order)
                assert len(keys) == 2 and conn.job_arg(job_id, keys) == ""
                args = ["a", "b", "c"]
                args[at - 1] = ""
                assert client.eval(read_id, 2, *keys, *args) == job_id
                args[at - 1] = "given"  # an id sent is kept (never with two keys: the check is cheap)
                assert client.eval(read_id, 2, *keys, *args) == "given"
        with pytest.raises(ValueError, match="due index"):
            naming.naming_fn(naming.STEP_KEYS, job_arg=1)
    finally:
        storage.close()


def test_the_job_ids_a_storage_does_not_send_are_the_ones_its_scripts_index_and_clean_up(
        client: redis.Redis, redis_url: str) -> None:
    # Ids holding the separators the script strips: the index entries, the leftovers and the delete find them.
    storage = RedisStorage.from_url(redis_url, prefix="jid")

    def first(ctx: PhaseContext[Any]) -> Next:
        return Next("second", state={"n": 1})

    def second(ctx: PhaseContext[Any]) -> Done:
        return Done(result=ctx.state["n"] + 1)

    app = App(storage=storage, scheduler=MemoryScheduler(),
              pipelines={"p": [Phase("first", first), Phase("second", second)]})
    try:
        for job_id in IDS:
            app.run_pipeline("p", job_id=job_id, initial_state={})
        app.drain()
        assert sorted(r.job_id for r in storage.list_jobs(status=JobStatus.COMPLETE)) == sorted(IDS)
        assert set(client.zrange(storage.finished_key, 0, -1)) == set(IDS)
        gone, deleted = IDS[1], IDS[6]
        client.delete(storage.keys(gone).record)  # deleted by hand: a load finds its leftovers by its id
        assert storage.acquire_lease(gone, "w", 5) is None
        assert client.exists(storage.keys(gone).messages, storage.keys(gone).events) == 0
        assert gone not in client.zrange(storage.finished_key, 0, -1)
        assert storage.delete_job(deleted) is True and storage.get_job(deleted) is None
        assert set(client.zrange(storage.finished_key, 0, -1)) == set(IDS) - {gone, deleted}
        assert {r.job_id for r in storage.list_jobs()} == set(IDS) - {gone, deleted}
    finally:
        storage.close()


def test_commit_keys_end_with_every_listing_index_as_the_scripts_count_them(redis_url: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="o")
    try:
        every = storage.conn.all_keys("j")
        assert every[0] == "o:{j}:record" and every[6] == "o:due"
        assert every[-len(JobStatus) - 1:] == ["o:updated", *(f"o:status:{s.value}" for s in JobStatus)]
    finally:
        storage.close()


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
        storage.close()
