"""A finished job's events move from their stream into one compressed field and read the same (redis_archive)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis import archive as redis_archive
from adapters.redis.library import LIBRARY
from adapters.redis.writes import _commit_reply
from pipelines import Agent, App, tool
from pipelines.engine.errors import CorruptRecordError, InvalidInputError, StorageError
from pipelines.testing import ScriptedModel, call, reply
from tests.redis_spy import spy_commands

pytestmark = pytest.mark.redis

TURNS = 12


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def _answer(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    last_user = [m for m in msgs if m["role"] == "user"][-1]["content"]
    if last_user == "again":  # a continued conversation: one more tool turn, then done
        return "done again" if msgs[-1]["role"] == "tool" else reply("once more", call("add", a=done, b=1))
    return "done" if done >= TURNS - 1 else reply(f"turn {done}", call("add", a=done, b=1))


@pytest.fixture(params=["redis_url", "redis_cluster_url"])
def storage(request: pytest.FixtureRequest) -> Iterator[RedisStorage]:
    url = request.getfixturevalue(request.param)
    s = RedisStorage.from_url(url, prefix="arch", cluster=request.param == "redis_cluster_url")
    yield s
    s.close()


def _app(storage: RedisStorage) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(_answer), tools=[add], max_turns=TURNS + 4)])


def _run(app: App, job_id: str, *messages: str) -> None:
    app.run_agent("a", job_id=job_id, messages=list(messages))
    app.drain()


def _plain(url_storage: RedisStorage) -> RedisStorage:
    """The same data through a storage that does not archive (to see the events as a stream held them)."""
    return RedisStorage(url_storage.client, prefix="arch", buckets=url_storage.layout.buckets, archive_events=False)


def test_a_finished_jobs_events_move_into_the_record_and_read_the_same(storage: RedisStorage) -> None:
    kept = _plain(storage)
    app = _app(kept)
    _run(app, "j1", "count")
    assert app.get("j1").status.value == "complete"
    k = storage.keys("j1")
    before = storage.events("j1")
    stream_bytes = storage.client.memory_usage(k.events, samples=0)
    assert storage.client.xlen(k.events) == len(before) > 4 * TURNS
    assert storage.archive_events("j1") is True
    # The stream is empty but kept (its last id orders later events); the archive is a fraction of it.
    assert storage.client.xlen(k.events) == 0 and storage.client.exists(k.events)
    blob = storage.client.hget(k.record, redis_archive.ARCHIVE_FIELD)
    assert blob and len(blob) * 4 < stream_bytes
    assert storage.events("j1") == before
    # Every cursor pages exactly as before.
    for cut in range(len(before)):
        assert storage.events("j1", after=before[cut].id, limit=3) == before[cut + 1:cut + 4]
    assert storage.archive_events("j1") is False  # nothing left in the stream to move
    assert storage.delete_job("j1") and not storage.client.exists(k.record)


def test_a_commit_that_finishes_a_job_archives_it_and_a_continued_job_reads_old_and_new(
        storage: RedisStorage) -> None:
    app = _app(storage)
    _run(app, "j2", "count")
    k = storage.keys("j2")
    first = storage.events("j2")
    assert storage.client.xlen(k.events) == 0 and first[-1].type == "job_finished"
    app.send("j2", ["again"])  # continues the finished conversation
    app.drain()
    assert app.get("j2").status.value == "complete"
    everything = storage.events("j2")
    assert everything[:len(first)] == first and len(everything) > len(first)
    ids = [redis_archive.entry_key(e.id) for e in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # one order across archive and stream
    assert storage.client.xlen(k.events) == 0  # finished again: archived again, old and new together
    assert [e.id for e in storage.events("j2", after=first[-1].id)] == [e.id for e in everything[len(first):]]


def test_the_commit_that_finishes_a_job_reads_what_its_archive_needs(redis_url: str) -> None:
    # The archive packs what the finishing commit handed back: no read of its own, one ARCHIVE call.
    storage = RedisStorage.from_url(redis_url, prefix="arch-one")
    sent: list[tuple[Any, ...]] = []

    def spy(send: Any, *args: Any) -> Any:
        sent.append(args)
        return send(*args)

    spy_commands(storage, spy)
    _run(_app(storage), "j", "count")
    names = [(str(a[0]).upper(), a[1]) for a in sent if len(a) > 1]
    assert ("EVALSHA", storage.conn.scripts.events.sha) not in names  # the events script, by its SHA
    assert names.count(("FCALL", LIBRARY.names["a"])) == 1
    assert storage.client.xlen(storage.keys("j").events) == 0
    everything = storage.events("j")
    twin = RedisStorage(storage.client, prefix="arch-twin", archive_events=False)  # the same job, not archived
    _run(_app(twin), "j", "count")
    assert [(e.type, e.turn) for e in everything] == [(e.type, e.turn) for e in twin.events("j")]
    assert everything[0].type == "job_started" and everything[-1].type == "job_finished"
    plain = RedisStorage(storage.client, prefix="arch-one", archive_events=False)
    assert plain.events("j") == everything  # read back from the archive alone: every event, same ids
    storage.close()


def test_a_commit_reply_is_its_status_or_the_status_with_the_archives_read() -> None:
    assert _commit_reply(b"ok::0") == ("ok::0", None)
    assert _commit_reply([b"ok::0", b"", []]) == ("ok::0", (b"", []))
    with pytest.raises(StorageError, match="a list of 2 items"):
        _commit_reply([b"ok::0", b""])


def test_a_running_job_or_a_stream_that_moved_is_not_archived(storage: RedisStorage) -> None:
    app = _app(storage)
    app.run_agent("a", job_id="j3", messages=["count"])
    app.advance("j3")
    k = storage.keys("j3")
    n = storage.client.xlen(k.events)
    assert storage.archive_events("j3") is False  # running: its next turn would add events at any time
    assert storage.client.xlen(k.events) == n and not storage.client.hexists(k.record, redis_archive.ARCHIVE_FIELD)
    app.drain()
    # Finished, but archived by someone who read the stream before its last event: nothing written.
    _run(_app(_plain(storage)), "j4", "count")
    k4 = storage.keys("j4")
    entries = storage.client.xrange(k4.events)
    stale = redis_archive.pack([(e[0].decode(), e[1][b"e"].decode()) for e in entries[:-1]])
    reply_ = storage.conn.run(storage.scripts.archive, [k4.record, k4.events, storage.layout.indexes_of("j4").finished],
                          ["j4", entries[-2][0].decode(), "0", stale], "test")
    assert reply_ in (b"moved", "moved")
    assert storage.client.xlen(k4.events) == len(entries)
    assert not storage.client.hexists(k4.record, redis_archive.ARCHIVE_FIELD)


def test_a_live_reader_of_a_finished_job_gets_the_archived_events_once_the_live_stream_is_gone(
        storage: RedisStorage) -> None:
    app = _app(storage)
    _run(app, "j5", "count")
    durable = storage.events("j5")
    live = storage.read_live("j5")
    storage.client.delete(storage.keys("j5").live)  # as when live_ttl has run out
    assert storage.read_live("j5") == durable
    # A cursor from the live stream (a text delta's id) still places the reader.
    delta = next(p for p in live if p.type == "text_delta")
    rest = storage.read_live("j5", after=delta.id)
    assert rest == [e for e in durable if redis_archive.entry_key(e.id) > redis_archive.entry_key(delta.id)]


def test_a_corrupt_archive_or_a_bad_cursor_is_a_clear_error(storage: RedisStorage) -> None:
    app = _app(storage)
    _run(app, "j6", "count")
    with pytest.raises(InvalidInputError, match="cursor"):
        storage.events("j6", after="not-an-id")
    storage.client.hset(storage.keys("j6").record, redis_archive.ARCHIVE_FIELD, "not base64 zlib!")
    with pytest.raises(CorruptRecordError, match="archived events of job 'j6'"):
        storage.events("j6")


def test_archiving_can_be_turned_off(storage: RedisStorage) -> None:
    kept = _plain(storage)
    app = _app(kept)
    _run(app, "j7", "count")
    assert kept.client.xlen(kept.keys("j7").events) > 0
    assert not kept.client.hexists(kept.keys("j7").record, redis_archive.ARCHIVE_FIELD)


def test_pack_and_unpack_round_trip_and_merge_orders_by_id() -> None:
    entries = [("1-0", '[1.0,0,1,"t"]'), ("1-1", '[1.5,6,1,"t",{"text":"a\\tb\\nc"}]'), ("12-0", "[2.0,8]")]
    assert redis_archive.unpack(redis_archive.pack(entries)) == entries
    assert redis_archive.unpack("") == []
    stream = [("13-0", "[3.0,0]")]
    assert redis_archive.merge(entries, stream, None, 10) == [*entries, *stream]
    assert redis_archive.merge(entries, stream, "1-1", 10) == [entries[2], *stream]
    assert redis_archive.merge(entries, stream, "2-5", 1) == [entries[2]]  # 12-0 > 2-5: numbers, not text
    with pytest.raises(ValueError):
        redis_archive.unpack("eJwLSS0uUShJLS4BAB9SBDw=")  # zlib text without an id column


def test_a_reader_past_the_archive_is_not_sent_it(storage: RedisStorage) -> None:
    app = _app(storage)
    _run(app, "j8", "count")
    events = storage.events("j8")
    k = storage.keys("j8")
    last = events[-1].id

    def script_reply(cursor: str) -> Any:
        start = f"({cursor}" if cursor else "-"
        return storage.conn.run(storage.scripts.events, [k.record, k.events], [start, "10", cursor], "test",
                                write=False)

    assert script_reply(last)[0] in (b"", "")  # a follower at the end: nothing of the archive travels
    assert script_reply(events[-2].id)[0]  # one before its end: the archive is needed, and sent
    assert script_reply("")[0]
    assert storage.events("j8", after=last) == [] and storage.events("j8", after=events[-2].id) == events[-1:]
