"""Record formats 2 and 3 on Redis (adapters.redis.record_format): a commit sends the fields that changed.

And the two-step move of a prefix an earlier version wrote: this version first writes format 1
there, beside processes of that version; after ``upgrade_record_format`` new processes write the
newest format, processes started before go on with format 1, and both advance the same jobs.
Format 3's compact texts (and the move from format 2): tests/integration/test_redis_compact_format.py.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage, upgrade_record_format
from adapters.redis.compact import widen
from adapters.redis.keys import layout_key
from adapters.redis.record_format import stored_text
from pipelines import Agent, App
from pipelines.engine.errors import ConfigurationError, StorageUnavailableError
from pipelines.engine.models import Commit, JobRecord, JobStatus
from pipelines.testing import ScriptedModel, call, reply
from tests.apps.agent_app import add

pytestmark = pytest.mark.redis

TURNS = 8


def _answer(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    return "done" if done >= TURNS - 1 else reply(f"turn {done}", call("add", a=done, b=1))


def _app(url: str, prefix: str, scheduler: MemoryScheduler | None = None) -> App:
    return _app_on(RedisStorage.from_url(url, prefix=prefix), scheduler)


def _app_on(storage: RedisStorage, scheduler: MemoryScheduler | None = None) -> App:
    return App(storage=storage, scheduler=scheduler or MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(_answer), tools=[add], max_turns=TURNS + 1)])


@pytest.fixture
def apps(redis_url: str) -> Iterator[list[App]]:
    made: list[App] = []
    yield made
    for app in made:
        _storage(app).close()


def _storage(app: App) -> RedisStorage:
    assert isinstance(app.storage, RedisStorage)
    return app.storage


def _hash(app: App, job_id: str) -> dict[str, str]:
    raw = _storage(app).client.hgetall(_storage(app).keys(job_id).record)
    return {k.decode(): v.decode() for k, v in raw.items()}


def _record(app: App, job_id: str = "j") -> JobRecord:
    rec = _storage(app).get_job(job_id)
    assert rec is not None
    return rec


def _finish(app: App, job_id: str) -> None:
    for _ in range(TURNS + 2):
        if app.get(job_id).status is not JobStatus.RUNNING:
            return
        app.advance(job_id)


def _same_run(a: JobRecord, b: JobRecord) -> None:
    """Two runs of the same workload: the same record but for ids, tokens and times."""
    skip = {"job_id", "created_at", "updated_at", "checkpoint", "history", "options", "trace"}
    assert a.model_dump(exclude=skip) == b.model_dump(exclude=skip)
    assert (a.checkpoint is None) is (b.checkpoint is None)
    if a.checkpoint is not None and b.checkpoint is not None:
        assert (a.checkpoint.next_phase, a.checkpoint.state) == (b.checkpoint.next_phase, b.checkpoint.state)


def test_a_fresh_prefix_writes_a_base_and_then_only_the_fields_a_commit_changed(
        redis_url: str, apps: list[App]) -> None:
    app = _app(redis_url, "rf2")
    apps.append(app)
    assert _storage(app).client.get(layout_key("rf2")) is None
    app.run_agent("a", job_id="j", messages=["count"])
    for _ in range(3):
        app.advance("j")
    assert _storage(app).client.get(layout_key("rf2")) == b"buckets=0 records=3"
    held = _hash(app, "j")
    assert "data" not in held and {"base", "dx"} <= set(held)
    delta = json.loads(widen(held["dx"]))  # compact in format 3
    # What a turn changes; not what it never does (ids, the initial state, options, creation time). The
    # scheduler's virtual clock stands still here, so updated_at stays what the base holds.
    assert {"checkpoint", "version", "transcript_len", "usage", "phases_done"} <= set(delta)
    assert not {"job_id", "pipeline", "initial_state", "initial_phase", "created_at", "options"} & set(delta)
    assert len(held["dx"]) < len(held["base"])
    assert json.loads(held["base"])["version"] != delta["version"]  # the base is the older record
    # Read back by another storage (nothing remembered): the record as the last commit made it.
    other = RedisStorage.from_url(redis_url, prefix="rf2")
    got = other.get_job("j")
    assert got == _storage(app).get_job("j") and got is not None and got.version == delta["version"]
    other.close()
    _finish(app, "j")
    # The same workload written whole (a prefix of the versions before format 2) reads the same.
    old = _app(redis_url, "rf1")
    apps.append(old)
    _storage(old).client.set(layout_key("rf1"), "buckets=0")
    old.run_agent("a", job_id="j", messages=["count"])
    for _ in range(3):
        old.advance("j")
    # What a storage remembers of a job counts toward its bound, the record included (its two objects).
    held = _storage(old).records.bases["j"]
    assert held.record_bytes == len(_hash(old, "j")["data"])
    assert held.size == sum(map(len, held.lines)) + 2 * held.record_bytes
    _finish(old, "j")
    assert "data" in _hash(old, "j") and "base" not in _hash(old, "j")
    _same_run(_record(app), _record(old))
    assert app.messages("j") == old.messages("j")
    assert [m.model_dump(exclude={"committed_at"}) for m in _record(app).history] == \
           [m.model_dump(exclude={"committed_at"}) for m in _record(old).history]


def test_an_earlier_versions_prefix_moves_to_the_newest_format_in_two_steps_with_both_writers_on_one_job(
        redis_url: str, apps: list[App]) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(layout_key("mix"), "buckets=0")  # written by a version before format 2
    clock = MemoryScheduler()  # one clock for the two processes (due times are compared with it)
    step1 = _app(redis_url, "mix", clock)  # step 1: this version beside the earlier one writes what it reads
    apps.append(step1)
    step1.run_agent("a", job_id="j", messages=["count"])
    step1.advance("j")
    step1.advance("j")
    held = _hash(step1, "j")
    assert "data" in held and not {"base", "dx"} & set(held)
    assert client.get(layout_key("mix")) == b"buckets=0"
    # Step 2, once every process runs this version: later processes write the newest format.
    admin = RedisStorage.from_url(redis_url, prefix="mix")
    assert upgrade_record_format(admin) is True
    assert upgrade_record_format(admin) is False  # there already: nothing to do
    admin.close()
    assert client.get(layout_key("mix")) == b"buckets=0 records=3"
    step2 = _app(redis_url, "mix", clock)
    apps.append(step2)
    # step1 started before the upgrade and goes on with format 1 until restarted: they take turns.
    seen = []
    for turn in range(TURNS + 2):
        app = (step2, step1)[turn % 2]
        if app.get("j").status is not JobStatus.RUNNING:
            break
        app.advance("j")
        held = _hash(app, "j")
        seen.append("base" in held)
        assert ("data" in held) is (app is step1) and ("base" in held) is (app is step2)
        # Whatever wrote it last, every reader sees the record that commit made.
        assert _record(step1) == _record(step2)
    assert seen[:2] == [True, False] and app.get("j").status is JobStatus.COMPLETE
    whole = _app(redis_url, "mixref")
    apps.append(whole)
    whole.run_agent("a", job_id="j", messages=["count"])
    _finish(whole, "j")
    _same_run(_record(step2), _record(whole))
    assert step1.messages("j") == whole.messages("j")
    client.close()


def test_versions_before_the_newest_format_are_refused_by_its_prefix_not_left_to_misread_it(
        redis_url: str, apps: list[App]) -> None:
    app = _app(redis_url, "guard")
    apps.append(app)
    app.run_agent("a", job_id="j", messages=["count"])
    app.advance("j")
    app.advance("j")
    stored = _storage(app).client.get(layout_key("guard"))
    # An earlier version records "buckets=0" (or "buckets=0 records=2") and refuses to run on a prefix whose
    # layout key holds anything else; a format-3 record has no 'data' for its load to misread as the record.
    assert stored == b"buckets=0 records=3" and stored not in (b"buckets=0", b"buckets=0 records=2")
    assert "data" not in _hash(app, "j")
    # This version refuses other buckets whatever the format, and upgrading such a prefix too.
    other = RedisStorage.from_url(redis_url, prefix="guard", buckets=4)
    with pytest.raises(ConfigurationError, match="written with buckets=0 records=3, this storage uses buckets=4"):
        other.conn.check_layout(None)
    with pytest.raises(ConfigurationError, match="nothing was upgraded"):
        upgrade_record_format(other)
    assert _storage(app).client.get(layout_key("guard")) == b"buckets=0 records=3"
    other.close()


def _commit(storage: RedisStorage, rec: JobRecord, owner: str, **update: Any) -> JobRecord:
    new = rec.model_copy(update={"version": rec.version + 1, **update})
    storage.commit(Commit(job_id=rec.job_id, expected_version=rec.version, owner=owner, token=uuid.uuid4().hex,
                          record=new, release_lease=False))
    return new


def test_a_field_back_at_its_default_is_written_in_the_delta_and_a_changed_base_gets_a_whole_write(
        redis_url: str) -> None:
    storage = RedisStorage.from_url(redis_url, prefix="dflt")
    storage.create_job(JobRecord(job_id="d", status=JobStatus.RUNNING, pipeline="p", options={"k": [1]}))
    rec = storage.acquire_lease("d", "w", 30)
    assert rec is not None
    rec = _commit(storage, rec, "w", error="boom", stop_reason="x", title="t")  # the first: whole, in 'base'
    key = storage.keys("d").record
    assert json.loads(storage.client.hget(key, "base") or b"")["error"] == "boom"
    rec = _commit(storage, rec, "w", error=None, title=None, result={"n": 1})  # back at the default
    delta = json.loads(widen((storage.client.hget(key, "dx") or b"").decode()))
    assert delta == {"version": 2, "error": None, "title": None, "result": {"n": 1}}
    rec = _commit(storage, rec, "w", title="t2")
    # What changed since the base stays in the delta: the base still holds the older values.
    assert json.loads(widen((storage.client.hget(key, "dx") or b"").decode())) == {
        "version": 3, "error": None, "title": "t2", "result": {"n": 1}}
    fresh = RedisStorage.from_url(redis_url, prefix="dflt")
    got = fresh.get_job("d")
    assert got is not None and (got.error, got.title, got.stop_reason, got.result) == (None, "t2", "x", {"n": 1})
    assert got.options == {"k": [1]} and got.version == rec.version
    # The record hash changed behind this storage's back (another writer's token): the delta is not
    # applied to a base it was not computed from; the commit writes the record whole instead.
    storage.client.hset(key, "token", "another-writers")
    rec = _commit(storage, rec, "w", error="again")
    held = {k.decode(): v for k, v in storage.client.hgetall(key).items()}
    assert "dx" not in held and json.loads(held["base"])["error"] == "again"
    assert fresh.get_job("d") == storage.get_job("d")
    stored = stored_text(held.get("data"), held.get("base"), held.get("dx"))
    assert stored is not None and json.loads(stored)["version"] == rec.version
    storage.close()
    fresh.close()


def test_a_commit_sent_again_after_its_reply_was_lost_leaves_the_next_delta_right(redis_url: str) -> None:
    # The first send lands as a delta and its reply is lost; sent again (as its docstring allows) it answers
    # 'applied'. The worker must not then take the record it sent whole for the hash's base: the next delta
    # would be computed against a base the hash does not hold, and drop what the lost-reply commit changed.
    storage = RedisStorage.from_url(redis_url, prefix=f"again{uuid.uuid4().hex[:6]}")
    storage.create_job(JobRecord(job_id="d", status=JobStatus.RUNNING, pipeline="p"))
    rec = storage.acquire_lease("d", "w", 30)
    assert rec is not None
    rec = _commit(storage, rec, "w", title="t1")  # whole, in 'base'
    new = rec.model_copy(update={"version": rec.version + 1, "title": "t2", "stop_reason": "s2"})
    again = Commit(job_id="d", expected_version=rec.version, owner="w", token=uuid.uuid4().hex, record=new,
                   release_lease=False)
    real = storage.conn.run

    def lose_reply(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)  # it ran: its reply is lost on the way
        storage.conn.run = real  # type: ignore[method-assign]
        raise StorageUnavailableError("connection reset by peer (the reply was lost)")

    storage.conn.run = lose_reply  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailableError):
        storage.commit(again)
    storage.commit(again)  # 'applied'
    last = _commit(storage, new, "w", error="e3")
    got = RedisStorage.from_url(redis_url, prefix=storage.conn.prefix).get_job("d")
    assert got is not None
    assert (got.title, got.stop_reason, got.error, got.version) == ("t2", "s2", "e3", last.version)
    assert storage.get_job("d") == got
    storage.close()


def test_the_cli_moves_the_apps_prefix_once_and_refuses_a_storage_without_formats(
        app: App, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.cli import main

    storage = _storage(app)
    storage.client.set(layout_key(storage.prefix), "buckets=0")  # as an earlier version recorded it
    out = io.StringIO()
    assert main(["upgrade-records", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    assert "format 3" in out.getvalue() and "started from now on" in out.getvalue()
    assert storage.client.get(layout_key(storage.prefix)) == b"buckets=0 records=3"
    out = io.StringIO()
    assert main(["upgrade-records", "--app", "tests.apps.redis_app:app"], out=out, err=io.StringIO()) == 0
    assert "already in record format 3" in out.getvalue()
    err = io.StringIO()
    assert main(["upgrade-records", "--app", "tests.apps.memory_app:app"], out=io.StringIO(), err=err) == 1
    assert "MemoryStorage has one record format" in err.getvalue()


def test_a_worker_is_not_sent_the_record_it_holds_nor_the_base_and_one_that_holds_neither_is(
        redis_url: str, apps: list[App], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = MemoryScheduler()
    warm, cold = _app(redis_url, "skip", clock), _app(redis_url, "skip", clock)
    apps.extend([warm, cold])
    warm.run_agent("a", job_id="j", messages=["count"])
    sent: dict[str, list[str]] = {"warm": [], "cold": []}  # what each load's reply held of the record

    def what(reply: list[Any]) -> str:
        data, base = (v.decode() if isinstance(v, bytes) else v for v in (reply[0], reply[7]))
        return "record held" if data == "=" else "base held" if base == "=" else "data" if data else "base"

    for name, app in (("warm", warm), ("cold", cold)):
        conn = _storage(app).conn
        inner = conn.run

        def spy(script: Any, keys: Any, args: Any, what_: str, *, write: bool = True, _inner: Any = inner,
                _name: str = name, _conn: Any = conn) -> Any:
            reply = _inner(script, keys, args, what_, write=write)
            if script is _conn.scripts.load and isinstance(reply, list):
                sent[_name].append(what(reply))
            return reply

        monkeypatch.setattr(conn, "run", spy)
    for _ in range(3):
        warm.advance("j")  # the first reads the create's 'data' and writes the base; then its own commits
    assert sent["warm"] == ["data", "record held", "record held"] and _storage(warm).records.warm_loads == 2
    assert _record(warm) == _record(cold)  # read-only loads (no owner): sent whole
    cold.advance("j")  # holds nothing of it: base and delta
    assert sent["cold"][-1] == "base"
    warm.advance("j")  # the record changed (cold's commit) but not its base, which warm wrote
    assert sent["warm"][-1] == "base held" and _record(warm) == _record(cold)
    cold.advance("j")
    _storage(cold).client.hset(_storage(cold).keys("j").record, "btok", "rewritten")  # as a later whole write
    warm.advance("j")
    assert sent["warm"][-1] == "base" and _record(warm) == _record(cold)
    _finish(warm, "j")
    assert _record(warm).status is JobStatus.COMPLETE


def _commit_keys_sent(app: App) -> list[int]:
    """Runs job 'j' to its end on ``app``: how many KEYS each commit was sent."""
    conn = _storage(app).conn
    inner, sent = conn.run, []

    def spy(script: Any, keys: Any, args: Any, what: str, *, write: bool = True) -> Any:
        if script is conn.scripts.commit:
            sent.append(len(keys))
        return inner(script, keys, args, what, write=write)

    conn.run = spy  # type: ignore[method-assign]
    try:
        app.run_agent("a", job_id="j", messages=["count"])
        _finish(app, "j")
    finally:
        del conn.run
    storage = _storage(app)
    assert storage.count_jobs(JobStatus.RUNNING) == 0 and storage.count_jobs(JobStatus.COMPLETE) == 1
    assert [r.job_id for r in storage.list_jobs(status=JobStatus.COMPLETE)] == ["j"]
    return sent


def test_a_commit_on_a_cluster_names_the_status_indexes_it_moves_the_job_between_and_they_end_right(
        redis_cluster_url: str) -> None:
    app = _app_on(RedisStorage.from_url(redis_cluster_url, prefix=f"ix{uuid.uuid4().hex[:8]}", cluster=True))
    try:
        sent = _commit_keys_sent(app)
    finally:
        _storage(app).close()
    # Every turn but the last keeps the job running: the all-jobs index and the running one; the last
    # moves it to complete: the two status indexes. (19 keys: every index, as for a job not held.)
    assert sent == [13] * (TURNS - 1) + [14]


def test_a_commit_without_buckets_names_two_keys_and_the_status_indexes_end_right(
        redis_url: str, apps: list[App]) -> None:
    app = _app(redis_url, "ix")
    apps.append(app)
    # The script names the rest (adapters.redis.scripts.naming) and touches only the two status indexes.
    assert _commit_keys_sent(app) == [2] * TURNS


def test_on_a_redis_cluster_a_prefix_moves_to_the_newest_format_in_two_steps_too(redis_cluster_url: str) -> None:
    prefix = f"rfc{uuid.uuid4().hex[:8]}"  # the cluster lives for the session: a prefix of this test's own
    clock = MemoryScheduler()
    first = _app_on(RedisStorage.from_url(redis_cluster_url, prefix=prefix, cluster=True), clock)
    storage = _storage(first)
    storage.client.set(layout_key(prefix), storage.layout.description)  # an earlier version's prefix
    first.run_agent("a", job_id="j", messages=["count"])
    first.advance("j")
    assert "data" in _hash(first, "j")
    assert upgrade_record_format(storage) is True
    assert storage.client.get(layout_key(prefix)) == f"{storage.layout.description} records=3".encode()
    later = _app_on(RedisStorage.from_url(redis_cluster_url, prefix=prefix, cluster=True), clock)
    later.advance("j")
    later.advance("j")
    held = _hash(later, "j")
    assert "base" in held and "dx" in held and "data" not in held
    _finish(later, "j")
    assert _record(later).status is JobStatus.COMPLETE and _record(first) == _record(later)
    assert len(later.messages("j")) == 2 * TURNS
    for app in (first, later):
        _storage(app).close()


def test_a_record_a_worker_is_not_sent_again_is_the_one_a_cold_load_parses(
        redis_url: str, apps: list[App], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import warm_check

    warm_check.install(monkeypatch.setattr)  # each warm load is compared with a cold one, or the test fails
    before = len(warm_check.CHECKED)
    clock = MemoryScheduler()
    one, two = _app(redis_url, "same", clock), _app(redis_url, "same", clock)
    apps.extend([one, two])
    one.run_agent("a", job_id="j", messages=["count"])
    for app in (one, one, two, two, one, one, two):  # own commits, another's, back again
        app.advance("j")
    _storage(one).request_control("j", "pause")  # beside the record: read on either path
    one.advance("j")
    _finish(two, "j")
    assert len(warm_check.CHECKED) - before >= 3 and _record(one) == _record(two)
