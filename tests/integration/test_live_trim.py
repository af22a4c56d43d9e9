"""The live stream keeps the run in flight; readers get what it no longer holds from the durable events.

On a real redis-server: a running job's live stream holds every part of its
run (a client resuming the run's message from a cursor is rebuilt from them)
and the commit that starts the next run drops the earlier ones, every event
has one id in both streams, and a reader from any cursor (the start, a
trimmed text delta, a part the stream still holds) gets every committed event
once, in order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage
from adapters.redis.archive import entry_key
from adapters.redis.values import _text
from adapters.rq import RQScheduler
from pipelines import Agent, App, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Event
from pipelines.streams import turn_texts
from pipelines.testing import ScriptedModel, call, reply
from tests.streaming_helpers import committed_texts, followed_texts_match, run_to_the_end

pytestmark = pytest.mark.redis

TURNS = 6
TEXT = "Looking that order up in the warehouse system, one moment please. "
EPHEMERAL = ("attempt_started", "text_delta")


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def _answer(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "tool")
    return "All checked." if done >= TURNS - 1 else reply(TEXT * 2, call("lookup", order=f"A-{done}"))


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    storage = RedisStorage.from_url(redis_url, prefix="trim", live_ttl=120)
    # A queue nothing consumes: each test advances the job itself.
    yield App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="trim-test"),
              agents=[Agent(name="a", model=ScriptedModel(_answer), tools=[lookup], max_turns=TURNS + 1)])
    storage.close()


def _storage(app: App) -> RedisStorage:
    assert isinstance(app.storage, RedisStorage)
    return app.storage


def _ids(parts: list[Event]) -> list[str]:
    return [p.id for p in parts]


def _follow_whole_run(app: App, job_id: str) -> list[Event]:
    """Every part, read by a follower blocked on the live stream while another thread runs the job."""
    stream = app.stream(job_id, timeout=60)
    parts = [next(stream)]  # job_started: the follower now waits in XREAD
    worker = threading.Thread(target=run_to_the_end, args=(app, job_id))
    worker.start()
    parts.extend(stream)
    worker.join(30)
    return parts


def _next_runs(app: App, job_id: str) -> None:
    """Continue the finished conversation twice (commits that start a run: job_continued), each to its end.

    The live stream keeps the run in flight and the one before: the first run's parts are gone after.
    """
    for text in ("and the next ones?", "and the last ones?"):
        app.run_agent("a", job_id=job_id, user=text)
        run_to_the_end(app, job_id)


def test_a_jobs_live_stream_holds_its_run_and_the_one_before(app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="t1", messages=["check the orders"])
    live = _storage(app).keys("t1").live
    lengths = []
    for _ in range(TURNS - 1):
        app.advance("t1")
        lengths.append(r.xlen(live))
    assert app.get("t1").status.value == "running"
    # About 7 parts a turn (attempt_started, a text delta or two, 5 events): the run's turns all stay.
    assert lengths == sorted(lengths) and lengths[-1] >= lengths[0] + 5 * (TURNS - 2)
    first = turn_texts(_storage(app).read_live("t1"))
    assert sorted(first) == list(range(1, TURNS)) and first[1] == committed_texts(app, "t1")[1]
    run_to_the_end(app, "t1")
    whole = r.xlen(live)
    # The continue's commit starts a run: the run before stays (a client may still be resuming its message).
    app.run_agent("a", job_id="t1", user="and the next ones?")
    assert r.xlen(live) == whole + 1 and _text(r.xrange(live, count=1)[0][0]) == _storage(app).events("t1")[0].id
    run_to_the_end(app, "t1")
    app.run_agent("a", job_id="t1", user="and the last ones?")  # a third run: the first one's parts go
    kept = [_text(i) for i, _ in r.xrange(live)]
    second, third = [e.id for e in _storage(app).events("t1") if e.type == "job_continued"]
    assert kept[0] == second and kept[-1] == third
    assert r.hget(_storage(app).keys("t1").record, "lrun") == kept[-1].encode()  # where the next cut goes
    assert r.hget(_storage(app).keys("t1").record, "lcut") == kept[-1].encode()  # the stream shares the events' ids


def test_every_event_has_the_same_id_in_the_durable_and_the_live_stream(app: App) -> None:
    app.run_agent("a", job_id="t2", messages=["check the orders"])
    followed = _follow_whole_run(app, "t2")
    durable = _storage(app).events("t2")
    assert [p for p in followed if p.type not in EPHEMERAL] == durable
    # Each turn's text the follower read as it came (all of them, unless it fell a whole turn behind).
    assert followed_texts_match(app, "t2", followed)


def test_a_replay_from_the_start_gets_each_committed_event_once_and_the_last_turns_text(app: App) -> None:
    app.run_agent("a", job_id="t3", messages=["check the orders"])
    for _ in range(3):
        app.advance("t3")
    running = list(app.stream("t3", follow=False))
    assert [p for p in running if p.type not in EPHEMERAL] == _storage(app).events("t3")
    run_to_the_end(app, "t3")
    replay = list(app.stream("t3"))
    assert [p for p in replay if p.type not in EPHEMERAL] == _storage(app).events("t3")
    assert _ids(replay) == sorted(_ids(replay), key=entry_key)
    # Every turn's text: the run is the job's only one.
    assert turn_texts(replay) == committed_texts(app, "t3")
    # Two more runs: the first one's deltas are gone (the transcript holds their text), the later ones' are there.
    _next_runs(app, "t3")
    again = list(app.stream("t3"))
    assert [p for p in again if p.type not in EPHEMERAL] == _storage(app).events("t3")
    texts, committed = turn_texts(again), committed_texts(app, "t3")
    assert min(texts) > TURNS and texts == {t: committed[t] for t in texts}


def test_resuming_from_any_cursor_a_follower_was_given_misses_no_event_and_repeats_none(app: App) -> None:
    app.run_agent("a", job_id="t4", messages=["check the orders"])
    followed = _follow_whole_run(app, "t4")
    _next_runs(app, "t4")  # the first run's parts leave the live stream
    durable = _storage(app).events("t4")
    trimmed = [p for p in followed if p.type == "text_delta"]
    assert trimmed, "the run streamed text"
    assert not {p.id for p in trimmed} & {p.id for p in _storage(app).read_live("t4")}
    for part in followed:
        rest = list(app.stream("t4", after=part.id))
        after = entry_key(part.id)
        assert [p for p in rest if p.type not in EPHEMERAL] == [e for e in durable if entry_key(e.id) > after]
        assert all(entry_key(p.id) > after for p in rest)
        assert len(set(_ids(rest))) == len(rest)


def test_a_page_of_the_replay_ends_where_the_next_one_starts(app: App) -> None:
    app.run_agent("a", job_id="t5", messages=["check the orders"])
    run_to_the_end(app, "t5")
    whole = _storage(app).read_live("t5")
    pages: list[Event] = []
    cursor = None
    while True:
        page = _storage(app).read_live("t5", after=cursor, limit=4)
        if not page:
            break
        assert len(page) <= 4
        pages.extend(page)
        cursor = page[-1].id
    assert pages == whole


def test_a_live_stream_made_anew_below_the_durable_streams_last_id_still_shares_ids(app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="t6", messages=["check the orders"])
    k = _storage(app).keys("t6")
    # The durable stream's last id an hour ahead of the server clock (as after the clock stepped back),
    # and no live stream: the next commit's live ids would fall below the durable stream's.
    ahead = f"{int(time.time() * 1000) + 3_600_000}-0"
    r.xadd(k.events, {"e": "x"}, id=ahead)
    r.xdel(k.events, ahead)
    r.delete(k.live)
    app.advance("t6")
    new = [e for e in _storage(app).events("t6") if entry_key(e.id) > entry_key(ahead)]
    assert new and new[0].type == "turn_started"
    live = [p for p in _storage(app).read_live("t6") if p.type not in EPHEMERAL]
    assert live[-len(new):] == new


def test_a_turn_whose_parts_overflow_the_streams_bound_still_replays_its_job_from_the_start(
        app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="t7", messages=["check the orders"])
    app.advance("t7")
    storage = _storage(app)
    # More parts than the live stream's MAXLEN (~10,000) in one turn: its front, events included, is trimmed.
    parts = [Event(timestamp=time.time(), type="text_delta", turn=2, data={"attempt": "x", "text": "."})
             for _ in range(10_500)]
    for i in range(0, len(parts), 500):
        storage.publish("t7", parts[i:i + 500])
    assert r.xlen(storage.keys("t7").live) < 10_600
    durable = storage.events("t7")
    replay: list[Event] = []
    cursor = None
    while page := storage.read_live("t7", after=cursor):
        replay.extend(page)
        cursor = page[-1].id
    assert [p for p in replay if p.type not in EPHEMERAL] == durable
    assert replay[0].type == "job_started"


def test_a_blocking_read_from_a_trimmed_cursor_gets_what_a_plain_read_gets(app: App) -> None:
    app.run_agent("a", job_id="t8", messages=["check the orders"])
    followed = _follow_whole_run(app, "t8")
    _next_runs(app, "t8")  # the first run's parts leave the live stream
    early = next(p for p in followed if p.type == "text_delta" and p.turn == 1)
    storage = _storage(app)
    waited = storage.read_live("t8", after=early.id, block=1.0)
    assert waited == storage.read_live("t8", after=early.id)
    assert waited[0].type == "turn_started" and waited[0].turn == 1  # from the durable events: no delta of turn 1


def test_a_malformed_cursor_given_to_the_storage_itself_is_a_clear_error(app: App) -> None:
    app.run_agent("a", job_id="t9", messages=["check the orders"])
    for bad in ("abc", "1-2-3", "-5", "1-x", "1_0-0", " 12"):
        with pytest.raises(InvalidInputError, match="cursor"):
            _storage(app).read_live("t9", after=bad)


def test_a_blocking_read_after_the_servers_scripts_were_flushed_still_reads_and_waits(app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="t10", messages=["check the orders"])
    app.advance("t10")
    storage = _storage(app)
    everything = storage.read_live("t10")
    r.script_flush()  # a restarted Redis: EVALSHA answers NOSCRIPT until the script is loaded again
    assert storage.read_live("t10", after=everything[2].id, block=1.0) == everything[3:]
    r.script_flush()
    started = time.monotonic()
    assert storage.read_live("t10", after=everything[-1].id, block=0.3) == []  # nothing new: it waited
    assert time.monotonic() - started >= 0.25


def test_a_follower_never_a_whole_turn_behind_gets_every_turns_text(app: App) -> None:
    app.run_agent("a", job_id="t11", messages=["check the orders"])
    parts: list[Event] = []
    while app.get("t11").status.value == "running":
        app.advance("t11")  # one commit, then the follower reads what it brought: never two commits behind
        parts.extend(app.stream("t11", after=parts[-1].id if parts else None, follow=False))
    assert turn_texts(parts) == committed_texts(app, "t11") and len(committed_texts(app, "t11")) == TURNS
    assert [p for p in parts if p.type not in EPHEMERAL] == _storage(app).events("t11")


def test_a_live_stream_written_before_ids_were_shared_replays_each_event_once_after_two_commits(
        app: App, r: redis.Redis) -> None:
    app.run_agent("a", job_id="t12", messages=["check the orders"])
    app.advance("t12")
    storage, k = _storage(app), _storage(app).keys("t12")
    # As an earlier version wrote it: each event's live copy under an id of its own, and no cut beside the record.
    entries = r.xrange(k.live)
    r.delete(k.live)
    r.hdel(k.record, "lcut")
    for entry_id, fields in entries:
        ms, _, seq = entry_id.decode().partition("-")
        r.xadd(k.live, fields, id=f"{ms}-{int(seq) + 7}")
    old = [p for p in storage.read_live("t12") if p.type not in EPHEMERAL]
    assert [p.type for p in old] == [e.type for e in storage.events("t12")]
    assert not {p.id for p in old} & {e.id for e in storage.events("t12")}  # no id shared
    app.advance("t12")  # the first commit of this version cuts what the one before wrote
    replay = [p for p in storage.read_live("t12") if p.type not in EPHEMERAL]
    assert replay == storage.events("t12")
