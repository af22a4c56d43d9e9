"""Record format 3 on Redis: the record delta and every stream entry stored compact (adapters.redis.compact).

A prefix written by the previous version (format 2) moves in two steps, as format 2 came: this version
first writes format 2 there beside processes of that version, then ``upgrade_record_format`` has
processes started afterwards write format 3, while ones started before go on with format 2, and both
advance the same job. Whatever wrote it, every reader of this version reads the same record and events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage, upgrade_record_format
from adapters.redis.compact import widen
from adapters.redis.keys import layout_key
from adapters.redis.values import _dump_parts
from pipelines import App
from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, JobStatus, LogEntry, dump_json
from tests.integration.test_redis_record_format import TURNS, _app, _finish, _record, _same_run, _storage

pytestmark = pytest.mark.redis

# A user's text holding the table's runs, characters JSON escapes, and non-ASCII.
HOSTILE = '{"turn": "turn" ,"tool":"\x01\x1f\t\n" é 中 🙂 {"checkpoint":{"next_phase":",\"due_at\":'


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _raw_events(app: App, job_id: str) -> list[str]:
    storage = _storage(app)
    return [f[b"e"].decode() for _, f in storage.client.xrange(storage.keys(job_id).events)]


def _plain(text: str) -> bool:
    """Whether a stored text is JSON as written (formats 1 and 2), not compact."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _seen(app: App, job_id: str) -> list[tuple[str, Any]]:
    """The job's events as a reader sees them, without what differs between two runs (times, attempt ids)."""
    return [(e.type, {k: v for k, v in e.data.items() if k != "attempt"}) for e in app.storage.events(job_id)]


def test_a_format_2_prefix_moves_to_format_3_in_two_steps_with_both_writers_on_one_job(
        redis_url: str, client: redis.Redis) -> None:
    client.set(layout_key("m23"), "buckets=0 records=2")  # written by the version before format 3
    clock = MemoryScheduler()  # one clock for the two processes
    step1 = _app(redis_url, "m23", clock)  # step 1: this version, beside the earlier one, writes format 2
    step1.run_agent("a", job_id="j", messages=["count"])
    step1.advance("j")
    step1.advance("j")
    dx = _storage(step1).client.hget(_storage(step1).keys("j").record, "dx")
    assert dx is not None and _plain(dx.decode())
    assert all(_plain(e) for e in _raw_events(step1, "j"))  # what the earlier version's readers parse
    admin = RedisStorage.from_url(redis_url, prefix="m23")
    assert upgrade_record_format(admin) is True and upgrade_record_format(admin) is False
    admin.close()
    assert client.get(layout_key("m23")) == b"buckets=0 records=3"
    step2 = _app(redis_url, "m23", clock)  # started after the upgrade: format 3
    for turn in range(TURNS + 2):
        app = (step2, step1)[turn % 2]
        if app.get("j").status is not JobStatus.RUNNING:
            break
        app.advance("j")
        storage = _storage(app)
        dx = storage.client.hget(storage.keys("j").record, "dx")
        assert dx is None or _plain(dx.decode()) is (app is step1)
        # The turn's last event as its writer stored it (a finished job's events move to its archive).
        last = storage.client.xrevrange(storage.keys("j").live, count=1)
        assert _plain(last[0][1][b"e"].decode()) is (app is step1)
        # Whatever wrote it last, every reader sees the record and the events that commit made.
        assert _record(step1) == _record(step2)
        assert step1.storage.events("j") == step2.storage.events("j")
        assert step1.storage.read_live("j") == step2.storage.read_live("j")
    assert app.get("j").status is JobStatus.COMPLETE
    fresh = _app(redis_url, "m23ref")  # the same workload on a fresh prefix (format 3 from the start)
    fresh.run_agent("a", job_id="j", messages=["count"])
    fresh.advance("j")
    assert _raw_events(fresh, "j") and not any(_plain(e) for e in _raw_events(fresh, "j"))
    _finish(fresh, "j")
    _same_run(_record(step2), _record(fresh))
    assert step1.messages("j") == fresh.messages("j")
    assert _seen(step1, "j") == _seen(fresh, "j")
    for app in (step1, step2, fresh):
        _storage(app).close()


def test_what_format_3_stores_is_compact_and_reads_back_as_written(redis_url: str, client: redis.Redis) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="c3")
    keys = storage.keys("w")
    events = [Event(timestamp=1.5, type="tool_call", turn=1, phase="turn", data={"call_id": HOSTILE, "tool": "add"}),
              Event(timestamp=1.6, type="model_response", turn=1, phase="turn",
                    data={"finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 4, "model": HOSTILE}),
              Event(timestamp=1.7, type="text_delta", turn=1, phase="turn", data={"attempt": "a", "text": HOSTILE}),
              Event(timestamp=1.8, type="something_else", phase=HOSTILE, data={"x": [HOSTILE, None, 1.5]})]
    cp = Checkpoint[Any](next_phase="turn", state={"turn": 1, "note": HOSTILE}, version=1, due_at=100.0)
    rec = JobRecord(job_id="w", status=JobStatus.RUNNING, checkpoint=cp, version=1)
    storage.create_job(rec, messages=[{"role": "user", "content": HOSTILE}], events=events[:1])
    rec = storage.acquire_lease("w", "o", 30)
    assert rec is not None and rec.checkpoint is not None
    value = {"message": {"role": "assistant", "content": HOSTILE + " long enough to go as a slice " * 4}}
    delta = Event(timestamp=1.9, type="text_delta", turn=2, phase="turn",
                  data={"attempt": "b", "text": value["message"]["content"]})
    # The streamed text goes as a slice of the journaled value, between compact JSON; the other parts whole.
    storage.record_step_and_publish("w", version=1, owner="o", key="model", value=value, parts=[delta, *events])
    storage.publish("w", events[2:])
    live = [*events[:1], delta, *events, *events[2:]]
    assert [e.model_dump(exclude={"id"}) for e in storage.read_live("w")] == \
        [e.model_dump(exclude={"id"}) for e in live]
    _compact_as(client, keys.live, live)
    new = rec.model_copy(update={"version": 2, "checkpoint": rec.checkpoint.model_copy(
        update={"version": 2, "state": {"turn": 2, "x": HOSTILE}})})
    storage.commit(Commit(job_id="w", expected_version=1, owner="o", token="t2", record=new, release_lease=False,
                          logs=[LogEntry(timestamp=2.0, phase="turn", message=HOSTILE)], events=events))
    rec = storage.get_job("w")
    assert rec is not None and rec.checkpoint is not None
    newer = rec.model_copy(update={"version": 3, "checkpoint": rec.checkpoint.model_copy(
        update={"version": 3, "state": {"turn": 3, "y": HOSTILE}})})
    storage.commit(Commit(job_id="w", expected_version=2, owner="o", token="t3", record=newer, events=events[1:2]))

    durable = [*events[:1], *events, *events[1:2]]
    assert [e.model_dump(exclude={"id"}) for e in storage.events("w")] == \
        [e.model_dump(exclude={"id"}) for e in durable]
    _compact_as(client, keys.events, durable)
    dx = (client.hget(keys.record, "dx") or b"").decode()
    assert not _plain(dx) and json.loads(widen(dx))["checkpoint"]["state"] == {"turn": 3, "y": HOSTILE}
    fresh = RedisStorage.from_url(redis_url, prefix="c3")  # holds nothing of the job: parses what is stored
    assert fresh.get_job("w") == storage.get_job("w") and fresh.get_job("w") is not None
    assert storage.messages("w") == [{"role": "user", "content": HOSTILE}]
    assert [e.message for e in storage.logs("w")] == [HOSTILE]
    assert client.lrange(keys.messages, 0, -1) == [dump_json({"role": "user", "content": HOSTILE}, "m").encode()]
    assert storage.archive_events("w") is False  # still running: nothing archived
    for s in (storage, fresh):
        s.close()


def _compact_as(client: redis.Redis, key: str, events: list[Event]) -> None:
    """The stream at ``key`` holds ``events`` compact: widened, the JSON a format-2 storage writes, and shorter."""
    stored = [f[b"e"].decode() for _, f in client.xrange(key)]
    assert [widen(s) for s in stored] == _dump_parts(events)
    assert sum(map(len, stored)) < sum(map(len, _dump_parts(events)))


def test_a_prefix_in_a_format_this_version_does_not_know_is_refused_naming_a_newer_version(
        redis_url: str, client: redis.Redis) -> None:
    client.set(layout_key("future"), "buckets=0 records=4")
    storage = RedisStorage.from_url(redis_url, prefix="future")
    newer = r"record format this version does not know \(buckets=0 records=4\): a newer version wrote them"
    with pytest.raises(ConfigurationError, match=newer):
        storage.conn.check_layout(None)  # a worker's start, a first write
    with pytest.raises(ConfigurationError, match=newer):
        storage.list_jobs()  # a first index read
    with pytest.raises(ConfigurationError, match=newer):
        upgrade_record_format(storage)  # never moved back
    assert client.get(layout_key("future")) == b"buckets=0 records=4"
    storage.close()


@pytest.mark.parametrize(("layout", "compact"), [("buckets=0 records=2", False), (None, True)])
def test_a_journaled_model_answer_is_compact_after_its_message_and_a_commit_still_cuts_the_message_from_it(
        redis_url: str, client: redis.Redis, layout: str | None, compact: bool) -> None:
    prefix = f"ans{int(compact)}"
    if layout:
        client.set(layout_key(prefix), layout)  # a format-2 prefix journals the answer whole
    storage = RedisStorage.from_url(redis_url, prefix=prefix)
    keys = storage.keys("w")
    cp = Checkpoint[Any](next_phase="turn", state={"turn": 1}, version=1, due_at=100.0)
    storage.create_job(JobRecord(job_id="w", status=JobStatus.RUNNING, checkpoint=cp, version=1))
    rec = storage.acquire_lease("w", "o", 30)
    assert rec is not None and rec.checkpoint is not None
    message = {"role": "assistant", "content": HOSTILE + " long enough to go as a slice " * 4}
    value = {"message": message, "finish_reason": "stop", "model": HOSTILE,
             "usage": {"prompt_tokens": 390, "completion_tokens": 51, "model_calls": 1},
             "request": {"messages": 16, "tools": ["add"]}}
    storage.record_step_and_publish("w", version=1, owner="o", key="model", value=value, parts=[])
    stored = (client.hget(keys.journal, "model") or b"").decode()
    assert _plain(stored) is not compact and stored.startswith('{"message":' + dump_json(message, "m"))
    assert widen(stored) == dump_json(value, "v")
    # A worker that takes the job over after a crash reads the answer as it was journaled.
    fresh = RedisStorage.from_url(redis_url, prefix=prefix)
    got = fresh.get_job("w")
    assert got is not None and got.checkpoint is not None and got.checkpoint.journal == {"model": value}
    sent: list[Any] = []
    inner = storage.conn.run

    def spy(script: Any, keys: Any, args: Any, what: str, **kw: Any) -> Any:
        sent.extend(args)
        return inner(script, keys, args, what, **kw)

    storage.conn.run = spy  # type: ignore[method-assign]
    new = rec.model_copy(update={"version": 2, "checkpoint": rec.checkpoint.model_copy(update={"version": 2})})
    storage.commit(Commit(job_id="w", expected_version=1, owner="o", token="t2", record=new,
                          append_messages=[message]))
    # The assistant message went as a slice of the compact answer, and is stored as it was written.
    assert dump_json(message, "m") not in sent and any(str(a).startswith("=12 ") for a in sent)
    assert client.lrange(keys.messages, 0, -1) == [dump_json(message, "m").encode()]
    assert fresh.messages("w") == [message]
    for s in (storage, fresh):
        s.close()
