"""RedisStorage's stored format: what each version writes, and that records written earlier still read.

Every change of the format keeps reading the one before it; a job written by
an earlier version is rewritten in the new format by its next commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.record_format import stored_text
from pipelines import Agent, App, tool
from pipelines.engine.transitions import HISTORY_LIMIT
from pipelines.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.redis

TURNS = HISTORY_LIMIT + 8  # long enough for the history to drop its oldest marks


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def _answer(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    return "done" if done >= TURNS - 1 else reply(f"turn {done}", call("add", a=done, b=1))


def _agent() -> Agent:
    return Agent(name="a", model=ScriptedModel(_answer), tools=[add], max_turns=TURNS + 1)


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    storage = RedisStorage.from_url(redis_url, prefix="fmt")
    yield App(storage=storage, scheduler=MemoryScheduler(), agents=[_agent()])
    storage.close()


def _advance(app: App, job_id: str, turns: int) -> None:
    for _ in range(turns):
        if app.get(job_id).status.value != "running":
            return
        app.advance(job_id)


def _storage(app: App) -> RedisStorage:
    assert isinstance(app.storage, RedisStorage)
    return app.storage


def _to_v1(r: redis.Redis, storage: RedisStorage, job_id: str) -> None:
    """Rewrite a job's record hash as versions before the ``hist`` field wrote it: history inside ``data``."""
    rec = storage.get_job(job_id)
    assert rec is not None
    key = storage.keys(job_id).record
    r.hset(key, "data", rec.model_dump_json(exclude_defaults=True))
    r.hdel(key, "hist", "base", "dx")  # and record format 1, the only one those versions wrote


def _stored(r: redis.Redis, key: str) -> Any:
    """The record JSON a record hash holds, in either record format (adapters.redis.record_format)."""
    return json.loads(stored_text(*r.hmget(key, ["data", "base", "dx"])) or "")


def test_the_history_is_kept_beside_the_record_one_mark_a_line(app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="h1", messages=["count"])
    _advance(app, "h1", TURNS + 2)
    storage = _storage(app)
    rec = storage.get_job("h1")
    assert rec is not None and rec.status.value == "complete"
    assert len(rec.history) == HISTORY_LIMIT and rec.history[-1].next_phase is None
    raw = r.hgetall(storage.keys("h1").record)
    assert "history" not in _stored(r, storage.keys("h1").record)
    lines = raw[b"hist"].decode().split("\n")
    assert [json.loads(line)[0] for line in lines] == [m.phases_done for m in rec.history]
    # Another storage (no remembered history) reads the same record.
    other = RedisStorage.from_url(_url(storage), prefix="fmt")
    assert other.get_job("h1") == rec


def _url(storage: RedisStorage) -> str:
    kw = storage.client.get_connection_kwargs()
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


def test_a_record_written_with_its_history_inside_still_reads_and_its_next_commit_moves_it(
        app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="h2", messages=["count"])
    _advance(app, "h2", 5)
    storage = _storage(app)
    before = storage.get_job("h2")
    assert before is not None and len(before.history) == 6
    _to_v1(r, storage, "h2")
    assert r.hget(storage.keys("h2").record, "hist") is None
    fresh = RedisStorage.from_url(_url(storage), prefix="fmt")
    assert fresh.get_job("h2") == before
    app2 = App(storage=fresh, scheduler=MemoryScheduler(), agents=[_agent()])
    _advance(app2, "h2", 1)
    after = fresh.get_job("h2")
    assert after is not None and after.history[:6] == before.history and len(after.history) == 7
    assert "history" not in _stored(r, storage.keys("h2").record)
    assert len((r.hget(storage.keys("h2").record, "hist") or b"").split(b"\n")) == 7
    _advance(app2, "h2", TURNS)
    assert fresh.get_job("h2") == storage.get_job("h2")


def test_a_history_delta_from_a_record_that_changed_meanwhile_is_sent_whole(
        app: App, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    app.run_agent("a", job_id="h3", messages=["count"])
    _advance(app, "h3", 3)
    storage = _storage(app)
    rec = storage.get_job("h3")
    assert rec is not None
    real = storage.acquire_lease

    def stale_base(*args: Any, **kwargs: Any) -> Any:
        # As if the record hash changed after the adapter remembered its history (a recreated job).
        got = real(*args, **kwargs)
        storage.records.bases["h3"] = storage.records.bases["h3"]._replace(token="not-the-stored-one")
        return got

    monkeypatch.setattr(storage, "acquire_lease", stale_base)
    _advance(app, "h3", 1)
    after = storage.get_job("h3")
    assert after is not None and after.history[:4] == rec.history and len(after.history) == 5
    assert len((r.hget(storage.keys("h3").record, "hist") or b"").split(b"\n")) == 5


def test_events_are_stored_as_compact_arrays_and_earlier_object_entries_still_read(
        app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="e1", messages=["count"])
    _advance(app, "e1", 2)
    storage = _storage(app)
    events = storage.events("e1")
    live = storage.read_live("e1")
    assert [e.type for e in events][:2] == ["job_started", "turn_started"]
    key = storage.keys("e1").events
    stored = [fields[b"e"] for _, fields in r.xrange(key)]
    assert all(s.startswith(b"[") for s in stored)
    # What versions before the compact encoding wrote: one JSON object per entry, in both streams.
    for k in (key, storage.keys("e1").live):
        r.xadd(k, {"e": '{"timestamp":5.5,"type":"job_paused","turn":2,"phase":"turn","data":{"by":"ops"}}'})
        r.xadd(k, {"e": '{"timestamp":6.0,"type":"something_new"}'})
    again = storage.events("e1")
    assert again[:len(events)] == events
    assert [(e.timestamp, e.type, e.turn, e.phase, e.data) for e in again[len(events):]] == [
        (5.5, "job_paused", 2, "turn", {"by": "ops"}), (6.0, "something_new", None, None, {})]
    assert storage.read_live("e1")[:len(live)] == live


def test_format_3_texts_as_this_version_stores_them_read_the_same_in_every_later_one(app: App, r: redis.Redis) -> None:
    # Record format 3 (adapters.redis.compact), written out byte for byte: a later version must read these as
    # they are (its run table may only grow, with a new format).
    app.run_agent("a", job_id="e3", messages=["count"])
    storage = _storage(app)
    before = storage.events("e3")
    r.xadd(storage.keys("e3").events, {"e": b'[7.5,4,3,\x12,\x1d10,12]}]'})
    r.xadd(storage.keys("e3").events, {"e": b'[7.25,2,3,\x12,\x1ac1"\x1badd"}]'})
    got = [(e.timestamp, e.type, e.turn, e.phase, e.data) for e in storage.events("e3")[len(before):]]
    assert got == [(7.5, "turn_committed", 3, "turn", {"messages": [10, 12]}),
                   (7.25, "tool_call", 3, "turn", {"call_id": "c1", "tool": "add"})]
    dx = b'\x01turn\x02\x1e3}\x039.5}\x084\x0c7\x0e2\x0f3}}'
    merged = json.loads(stored_text(None, b'{"job_id":"e3","pipeline":"a"}', dx) or "")
    assert merged == {"job_id": "e3", "pipeline": "a", "version": 4,
                      "checkpoint": {"next_phase": "turn", "state": {"turn": 3}, "due_at": 9.5},
                      "usage": {"prompt_tokens": 7, "completion_tokens": 2, "model_calls": 3}}


def test_an_event_of_a_type_the_table_does_not_know_and_odd_values_round_trip(app: App) -> None:
    from pipelines.engine.models import Event

    storage = _storage(app)
    app.run_agent("a", job_id="e2", messages=["count"])
    parts = [Event(timestamp=1.25, type="custom_kind", phase=None, turn=7, data={"x": [1, {"y": "é\n"}]}),
             Event(timestamp=2.0, type="text_delta", turn=None, phase="p", data={}),
             Event(timestamp=3.0, type="tool_call")]
    storage.publish("e2", parts)
    got = storage.read_live("e2")[-3:]
    assert [e.model_copy(update={"id": ""}) for e in got] == parts


def test_a_record_without_its_status_place_is_moved_out_of_every_other_index_and_gets_one(
        app: App, r: redis.Redis) -> None:
    from adapters.redis.scripts import INDEX_ROLES
    from pipelines import JobStatus

    app.run_agent("a", job_id="s1", messages=["count"])
    storage = _storage(app)
    key = storage.keys("s1").record
    assert r.hget(key, "st") == b"running"
    r.hdel(key, "st")  # as a record written before 'st' existed
    listing = dict(zip(INDEX_ROLES, storage.listing_keys, strict=True))
    r.zadd(listing["status_paused"], {"s1": 1.0})  # even a stray entry goes: every index is touched once
    _advance(app, "s1", TURNS + 2)
    assert app.get("s1").status is JobStatus.COMPLETE
    # A name this code does not know (another version's status): every index is touched, as without 'st'.
    r.hset(key, "st", "some_future_status")
    r.zadd(listing["status_error"], {"s1": 1.0})
    app.send("s1", ["again"])
    _advance(app, "s1", TURNS + 2)
    where = [role for role, k in listing.items() if role != "updated" and r.zscore(k, "s1") is not None]
    assert where == ["status_complete"] and r.hget(key, "st") == b"complete"


def test_the_history_base_is_kept_while_the_job_runs_and_forgotten_when_it_finishes(app: App) -> None:
    storage = _storage(app)
    app.run_agent("a", job_id="b1", messages=["count"])
    assert "b1" not in storage.records.bases  # a create: the next turn's load remembers it
    app.advance("b1")  # a turn through the queue: the lease is released with the commit, the history kept
    assert storage.records.bases["b1"].token == storage.client.hget(storage.keys("b1").record, "token").decode()
    assert storage.records.bases_bytes == sum(b.size for b in storage.records.bases.values())
    kept = App(storage=storage, scheduler=MemoryScheduler(), agents=[_agent()], continue_for=30)
    kept.advance("b1")  # under continue_for: every later turn commits from the remembered base
    assert kept.get("b1").status.value == "complete" and "b1" not in storage.records.bases


def test_a_load_parses_only_the_marks_added_since_this_storage_last_saw_the_history(
        app: App, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine.models import TurnMark

    parsed: list[str] = []
    plain = TurnMark.model_validate_json
    monkeypatch.setattr(TurnMark, "model_validate_json", lambda line: parsed.append(line) or plain(line))
    storage = _storage(app)
    app.run_agent("a", job_id="k1", messages=["count"])
    _advance(app, "k1", HISTORY_LIMIT + 3)  # the history is full: each commit drops a mark and adds one
    parsed.clear()
    app.advance("k1")  # a queued turn: its load finds the history this storage committed
    assert parsed == []
    # Another process moves the job on two turns: this storage parses only their two marks.
    other = App(storage=RedisStorage.from_url(redis_url, prefix="fmt"), scheduler=MemoryScheduler(),
                agents=[_agent()])
    _advance(other, "k1", 2)
    loaded = storage.acquire_lease("k1", "me", 30)
    assert loaded is not None and len(parsed) == 2
    storage.release_lease("k1", "me")
    fresh = RedisStorage.from_url(redis_url, prefix="fmt").get_job("k1")
    assert fresh is not None and loaded.history == fresh.history and len(loaded.history) == HISTORY_LIMIT
    assert loaded.model_dump() == fresh.model_dump()


def test_a_history_rewritten_elsewhere_is_parsed_whole_and_reads_the_same(app: App, redis_url: str) -> None:
    storage = _storage(app)
    app.run_agent("a", job_id="k2", messages=["count"])
    _advance(app, "k2", 5)
    assert storage.get_job("k2") is not None and "k2" in storage.records.bases
    # A full retry elsewhere rewrites the job: its history starts again from the first turn.
    other = App(storage=RedisStorage.from_url(redis_url, prefix="fmt"), scheduler=MemoryScheduler(),
                agents=[_agent()])
    other.cancel("k2")
    other.retry("k2", mode="full")
    _advance(other, "k2", 2)
    mine, fresh = storage.get_job("k2"), RedisStorage.from_url(redis_url, prefix="fmt").get_job("k2")
    assert mine is not None and fresh is not None
    assert mine.history == fresh.history and mine.model_dump() == fresh.model_dump()
