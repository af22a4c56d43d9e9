"""Issue 5, "Bad input catalogue": the cases only a real redis-server shows.

Bad URLs, Redis down at enqueue, a job deleted under a worker, records
corrupted by hand, oversized values. Each case asserts the error (class and
a message naming the problem) and that nothing was half written, reading
Redis directly.
"""

from __future__ import annotations

import io
import json
import logging
import math
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, App, Done, JobStatus, Next, Phase, PhaseContext
from pipelines.cli import main as cli_main
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidJobIdError,
    JobConflictError,
    StateNotSerializableError,
    StorageError,
    StorageUnavailableError,
)
from pipelines.engine.models import Commit, JobRecord
from pipelines.engine.runner import AdvanceResult, try_advance
from pipelines.testing import ScriptedModel
from tests.redis_server import free_port

pytestmark = pytest.mark.redis

PREFIX = "bi"


def done_phase(ctx: PhaseContext[Any]) -> Done:
    return Done(result="ok")


def two_phases() -> list[Phase]:
    return [Phase("a", lambda ctx: Next("b", state={"n": ctx.state["n"] + 1})), Phase("b", done_phase)]


def dump(r: redis.Redis) -> dict[bytes, Any]:
    """Every key in Redis with its type and full value, for before/after comparisons."""
    out: dict[bytes, Any] = {}
    for key in r.scan_iter("*"):
        kind = r.type(key).decode()
        if kind == "string":
            out[key] = r.get(key)
        elif kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = kind
    return out


def job_keys_in(r: redis.Redis, job_id: str) -> list[bytes]:
    return sorted(k for k in r.scan_iter("*") if f"{{{job_id}}}".encode() in k)


# --- bad Redis URLs and prefixes -------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://x", "scheme must be redis://, rediss:// or unix://"),
        ("garbage", "scheme must be redis://, rediss:// or unix://"),
        ("ftp://127.0.0.1/0", "scheme must be redis://"),
        ("redis://127.0.0.1:-1/0", "could not be cast to integer"),
        ("redis://127.0.0.1:65536/0", "out of range"),
        ("redis://127.0.0.1:0/0", "port 0"),
        ("redis://127.0.0.1:port/0", "'port'"),
        ("redis://127.0.0.1:6379/db1", "database 'db1' is not a number"),
        ("redis://", "no host"),
        (" redis://127.0.0.1:6379/0", "must specify one of the following schemes"),
    ],
)
def test_a_bad_redis_url_is_a_configuration_error_naming_it(url: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisStorage.from_url(url)
    assert f"bad Redis URL {url!r}" in str(info.value) and why in str(info.value)


@pytest.mark.parametrize("url", [
    "redis//:s3cretPW@127.0.0.1:6481/0", "redis:/:s3cretPW@127.0.0.1:6481/0", ":s3cretPW@127.0.0.1:6481",
    "redis://:s3cr/etPW@127.0.0.1:6481/0", "redis://:s3cretPW@127.0.0.1:6481/0?db=x", "redis://:s3cretPW@/0",
    "redis://user:s3cretPW@127.0.0.1:0/0", "redis://:s3cret#PW@127.0.0.1:6481/x", "redis://:s3cr?etPW@127.0.0.1/0",
    # redis-py takes a password as a query argument too (unix:// URLs give it so).
    "redis://host:6379/abc?password=s3cretPW", "unix://?password=s3cretPW&username=alice",
])
def test_a_bad_redis_url_never_shows_its_password(url: str) -> None:
    # Masked only when the URL parsed: a password with '/' or '#', or a URL missing its '//', was printed whole
    # (cron mail, CI logs), or quoted in part by the parser's own words ("could not be cast ... 's3cr'").
    with pytest.raises(ConfigurationError) as info:
        RedisStorage.from_url(url)
    shown = str(info.value)
    assert "bad Redis URL" in shown and "***" in shown
    assert not any(piece in shown for piece in ("s3cr", "etPW", "PW@", "user:", "alice"))


@pytest.mark.parametrize("url", [None, 123, ""], ids=repr)
def test_a_redis_url_that_is_not_a_string_names_what_it_got(url: Any) -> None:
    with pytest.raises(ConfigurationError, match=f"a Redis URL must be a non-empty string, got {url!r}"):
        RedisStorage.from_url(url)


def test_an_unparsable_ipv6_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="Invalid IPv6 URL"):
        RedisStorage.from_url("redis://[::1/0")


@pytest.mark.parametrize("prefix", ["", "a{b", "x}", "a b", "caf\u00e9", "*"])
def test_a_bad_key_prefix_is_a_configuration_error(r: redis.Redis, prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=f"key prefix must be 1\\+ of .*got {prefix!r}"):
        RedisStorage(r, prefix=prefix)


# --- Redis down at enqueue ---------------------------------------------------------------
def dead_app() -> App:
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    return App(storage=storage, scheduler=RQScheduler(storage.client, queue="bi"),
               pipelines={"p": two_phases()}, agents=[Agent(name="chat", model=ScriptedModel(["hi"]))])


def test_redis_down_at_enqueue_raises_storage_unavailable_in_bounded_time(r: redis.Redis) -> None:
    app = dead_app()
    for start in (lambda: app.run_pipeline("p", job_id="j", initial_state={"n": 0}),
                  lambda: app.agents["chat"].run(job_id="c", messages=["hi"],  # type: ignore[attr-defined]
                                                 storage=app.storage, scheduler=app.scheduler)):
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailableError, match="unreachable") as info:
            start()
        assert time.monotonic() - t0 < 20  # retries with capped backoff: seconds, not minutes
        assert "'j'" in str(info.value) or "'c'" in str(info.value)  # names the job it was writing
    assert dump(r) == {}  # the live server of this test saw nothing either


def test_storage_up_but_the_queue_down_leaves_a_durable_job_the_sweep_recovers(storage: RedisStorage,
                                                                               r: redis.Redis) -> None:
    # Documented behaviour (I7), not "nothing written": the job is written first,
    # then the enqueue fails. The caller sees StorageUnavailableError; the job is
    # due in storage, so `pipelines advance --due` (or a worker's sweep) runs it.
    dead = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    app = App(storage=storage, scheduler=RQScheduler(dead, queue="bi"), pipelines={"p": two_phases()})
    with pytest.raises(StorageUnavailableError, match=r"scheduling job 'j'.*; the job's commit is written: it runs "
                                                      r"when a sweep finds it due .* do not start it again"):
        app.run_pipeline("p", job_id="j", initial_state={"n": 0})
    rec = storage.get_job("j")
    assert rec is not None and rec.status is JobStatus.RUNNING
    assert storage.due_jobs(time.time() + 1) == ["j"]
    assert [k for k in r.scan_iter("rq:*")] == []
    # Starting it again is a conflict (it is running), not a second job.
    with pytest.raises(JobConflictError, match="'j' is running"):
        app.run_pipeline("p", job_id="j", initial_state={"n": 0})
    recovered = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()})
    recovered.advance_due()
    recovered.scheduler.drain()  # type: ignore[attr-defined]
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_redis_down_at_advance_is_storage_unavailable_not_a_crash() -> None:
    app = dead_app()
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailableError, match="'j'"):
        app.try_advance("j")
    assert time.monotonic() - t0 < 20


# --- invalid ids never reach Redis ---------------------------------------------------------
@pytest.mark.parametrize("bad", ["", "a b", "{j}", "j}", "j*", "\uff4aob", "x" * 201])
def test_an_invalid_job_id_writes_no_key_and_enqueues_nothing(storage: RedisStorage, r: redis.Redis,
                                                              bad: str) -> None:
    sched = RQScheduler(storage.client, queue="bi")
    app = App(storage=storage, scheduler=sched, pipelines={"p": two_phases()})
    with pytest.raises(InvalidJobIdError):
        app.run_pipeline("p", job_id=bad, initial_state={"n": 0})
    with pytest.raises(InvalidJobIdError):
        sched.schedule_advance(bad, version=1)
    with pytest.raises(InvalidJobIdError):
        app.try_advance(bad)
    assert dump(r) == {}


# --- non-JSON values at the adapter: nothing half written (I1) ------------------------------
@pytest.mark.parametrize(
    "commit_update",
    [
        pytest.param({"append_messages": [{"role": "user", "content": "fine"}, {"role": "user", "content": math.nan}]},
                     id="nan-in-second-message"),
        pytest.param({"append_messages": [{"role": "user", "content": {1, 2}}]}, id="set-in-message"),
    ],
)
def test_a_commit_carrying_non_json_raises_before_any_write(storage: RedisStorage, r: redis.Redis,
                                                            commit_update: dict[str, Any]) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()})
    app.run_pipeline("p", job_id="j", initial_state={"n": 0})
    before = dump(r)
    rec = storage.get_job("j")
    assert rec is not None
    commit = Commit(job_id="j", expected_version=rec.version, token=uuid.uuid4().hex,
                    record=rec.model_copy(update={"version": rec.version + 1}))
    commit = commit.model_copy(update=commit_update)
    with pytest.raises(StateNotSerializableError, match="a transcript message is not JSON-serialisable"):
        storage.commit(commit)
    assert dump(r) == before


def test_a_phase_returning_non_json_state_on_redis_keeps_the_stored_checkpoint(storage: RedisStorage) -> None:
    def a(ctx: PhaseContext[Any]) -> Next:
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        return Next("b", state={"x": math.inf})

    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", a), Phase("b", done_phase)]})
    app.run_pipeline("p", job_id="j", initial_state={"n": 0})
    scheduler.drain()
    rec = storage.get_job("j")
    assert rec is not None and rec.status is JobStatus.ERROR
    assert rec.error is not None and "state returned by phase 'a' is not JSON-serialisable" in rec.error
    assert rec.checkpoint is not None and rec.checkpoint.state == {"n": 0}
    assert storage.messages("j") == []


# --- a job deleted while a worker holds its lease ------------------------------------------
def deleting_phase(redis_url: str, where: str) -> Phase:
    def a(ctx: PhaseContext[Any]) -> Next:
        other = RedisStorage.from_url(redis_url, prefix=PREFIX)  # another process, an operator
        assert other.lease_owner(ctx.job_id) is not None  # the worker holds the lease right now
        assert other.delete_job(ctx.job_id) is True
        other.close()
        if where == "step":
            ctx.step("work", lambda: {"done": True})
        elif where == "save_state":
            ctx.save_state({"n": 2})
        ctx.append_messages([{"role": "assistant", "content": "must not land"}])
        ctx.log("must not land")
        return Next("b", state={"n": 3})

    return Phase("a", a)


@pytest.mark.parametrize("where", ["commit", "step", "save_state"])
def test_a_job_deleted_under_its_worker_stays_deleted(storage: RedisStorage, r: redis.Redis, redis_url: str,
                                                      where: str) -> None:
    sched = RQScheduler(storage.client, queue="bi")
    app = App(storage=storage, scheduler=sched,
              pipelines={"p": [deleting_phase(redis_url, where), Phase("b", done_phase)]})
    app.run_pipeline("p", job_id="j", initial_state={"n": 1})
    sched.queue.empty()
    assert app.try_advance("j") is AdvanceResult.STALE  # fenced; StaleVersionError handled
    assert job_keys_in(r, "j") == []  # no record, lease, journal, messages or logs came back
    assert r.zscore(f"{PREFIX}:due", "j") is None and not r.sismember(f"{PREFIX}:jobs", "j")
    assert storage.get_job("j") is None
    assert sched.queue.count == 0 and [k for k in r.scan_iter("rq:job:*")] == []  # nothing enqueued
    assert app.try_advance("j") is AdvanceResult.UNKNOWN


def test_a_stale_worker_cannot_commit_into_a_recreated_job_on_redis(storage: RedisStorage, redis_url: str) -> None:
    scheduler = MemoryScheduler()

    def a(ctx: PhaseContext[Any]) -> Next:
        if ctx.state.get("gen") == 1:
            other = RedisStorage.from_url(redis_url, prefix=PREFIX)
            other.delete_job(ctx.job_id)
            App(storage=other, scheduler=MemoryScheduler(), pipelines={"p": phases}).run_pipeline(
                "p", job_id=ctx.job_id, initial_state={"gen": 2})
            other.close()
            ctx.append_messages([{"role": "assistant", "content": "from the deleted run"}])
            return Next("b", state={"gen": "stale"})
        return Next("b")

    phases = [Phase("a", a), Phase("b", done_phase)]
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": phases})
    app.run_pipeline("p", job_id="j", initial_state={"gen": 1})
    scheduler.drop_all()
    result = app.try_advance("j")
    rec = storage.get_job("j")
    assert rec is not None and rec.initial_state == {"gen": 2}
    assert rec.checkpoint is not None and rec.checkpoint.state == {"gen": 2}
    assert storage.messages("j") == []
    assert result is AdvanceResult.STALE


# --- records corrupted by hand ----------------------------------------------------------------
def corrupt(r: redis.Redis, storage: RedisStorage, job_id: str, how: str) -> None:
    k = storage.keys(job_id)
    if how == "not-json":
        r.hset(k.record, "data", '{"job_id": "' + job_id + '", "status": ')
    elif how == "wrong-schema":
        data = json.loads(r.hget(k.record, "data") or b"")
        data["status"] = "melted"
        r.hset(k.record, "data", json.dumps(data))
    elif how == "missing-data-field":
        r.hdel(k.record, "data")
    elif how == "other-job-id":
        data = json.loads(r.hget(k.record, "data") or b"")
        data["job_id"] = "someone-else"
        r.hset(k.record, "data", json.dumps(data))
    elif how == "journal-not-json":
        r.hset(k.record, "jver", r.hget(k.record, "version") or b"")
        r.hset(k.journal, "model", "{half")
    else:
        raise AssertionError(how)


RECORD_CORRUPTIONS = ["not-json", "wrong-schema", "missing-data-field", "other-job-id", "journal-not-json"]


@pytest.mark.parametrize("how", RECORD_CORRUPTIONS)
def test_a_hand_corrupted_record_is_a_corrupt_record_error_naming_the_job_and_stays_as_it_was(
    storage: RedisStorage, r: redis.Redis, how: str
) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()})
    app.run_pipeline("p", job_id="bad", initial_state={"n": 0})
    corrupt(r, storage, "bad", how)
    record_before = r.hgetall(storage.keys("bad").record)
    with pytest.raises(CorruptRecordError, match="job 'bad'"):
        storage.get_job("bad")
    with pytest.raises(CorruptRecordError, match="job 'bad'"):
        app.try_advance("bad")
    with pytest.raises(CorruptRecordError, match="job 'bad'"):
        storage.acquire_lease("bad", "w1", 30)
    assert r.hgetall(storage.keys("bad").record) == record_before  # nobody "repaired" or overwrote it
    assert r.llen(storage.keys("bad").messages) == 0
    assert r.exists(storage.keys("bad").lease) == 0  # the lease the refused load took went back


def test_a_failed_advance_of_a_corrupt_record_leaves_no_lease_behind(storage: RedisStorage, r: redis.Redis) -> None:
    scheduler = MemoryScheduler()
    app = App(storage=storage, scheduler=scheduler, pipelines={"p": two_phases()})
    app.run_pipeline("p", job_id="bad", initial_state={"n": 0})
    corrupt(r, storage, "bad", "wrong-schema")
    # The runner's own entry point (what run_pipeline binds for in-process schedulers);
    # App.try_advance reads the record before it leases, so it does not leak.
    with pytest.raises(CorruptRecordError, match="job 'bad'"):
        try_advance(job_id="bad", phases=two_phases(), storage=storage, scheduler=scheduler)
    assert r.exists(storage.keys("bad").lease) == 0


def test_a_corrupt_transcript_line_or_log_line_is_named(storage: RedisStorage, r: redis.Redis) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()})
    app.run_pipeline("p", job_id="bad", initial_state={"n": 0})
    r.rpush(storage.keys("bad").messages, b"\x80\x04not json")
    r.rpush(storage.keys("bad").logs, "{nope")
    with pytest.raises(CorruptRecordError, match="a stored transcript message of job 'bad' does not parse"):
        storage.messages("bad")
    with pytest.raises(CorruptRecordError, match="a stored log entry of job 'bad' does not parse"):
        storage.logs("bad")


def test_a_record_key_of_the_wrong_type_is_a_corrupt_record(storage: RedisStorage, r: redis.Redis) -> None:
    App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()}).run_pipeline(
        "p", job_id="bad", initial_state={"n": 0})
    r.delete(storage.keys("bad").record)
    r.set(storage.keys("bad").record, "a string, not a hash")
    with pytest.raises(CorruptRecordError, match="job 'bad'"):
        storage.get_job("bad")


def test_a_wrong_type_record_is_at_least_a_storage_error_naming_the_job(storage: RedisStorage,
                                                                        r: redis.Redis) -> None:
    App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()}).run_pipeline(
        "p", job_id="bad", initial_state={"n": 0})
    r.delete(storage.keys("bad").record)
    r.set(storage.keys("bad").record, "a string, not a hash")
    with pytest.raises(StorageError, match=r"loading job 'bad'.*WRONGTYPE"):
        storage.get_job("bad")
    assert r.get(storage.keys("bad").record) == b"a string, not a hash"


@pytest.fixture
def cli_app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """``tests.apps.redis_app:app`` freshly imported on this test's redis-server (prefix "pr")."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delenv("FAKE_OPENAI_BASE", raising=False)
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    monkeypatch.delitem(sys.modules, "tests.apps.redis_app", raising=False)
    from tests.apps import redis_app

    yield redis_app.app
    redis_app.storage.close()


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli_main([*argv, "--app", "tests.apps.redis_app:app"], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("how", ["not-json", "wrong-schema", "other-job-id"])
def test_cli_status_of_a_corrupt_record_prints_error_and_exits_1(cli_app: App, r: redis.Redis, how: str) -> None:
    cli_app.run_pipeline("multi", job_id="bad", initial_state={"n": 0})
    storage = cli_app.storage
    assert isinstance(storage, RedisStorage)
    corrupt(r, storage, "bad", how)
    code, out, err = cli("status", "bad")
    assert code == 1 and out == ""
    assert err.startswith("error: stored record of job 'bad'") and "Traceback" not in err
    cli_app.run_pipeline("multi", job_id="good", initial_state={"n": 0})
    code, out, err = cli("jobs")  # one corrupt record never hides the others: it is named, the rest listed
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["good"]
    assert "warning: job bad: unreadable record skipped: stored record of job 'bad'" in err


def test_cli_log_and_transcript_of_corrupt_lines_exit_1(cli_app: App, r: redis.Redis) -> None:
    cli_app.run_pipeline("multi", job_id="bad", initial_state={"n": 0})
    storage = cli_app.storage
    assert isinstance(storage, RedisStorage)
    r.rpush(storage.keys("bad").logs, "{nope")
    r.rpush(storage.keys("bad").messages, "{nope")
    code, _, err = cli("log", "bad")
    assert code == 1 and err.startswith("error: a stored log entry of job 'bad' does not parse")
    code, _, err = cli("transcript", "bad")
    assert code == 1 and err.startswith("error: a stored transcript message of job 'bad' does not parse")


def _sweep_setup(storage: RedisStorage, r: redis.Redis) -> App:
    app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={"p": two_phases()})
    # Both are due at the same virtual instant; ties go by id, so "a-bad" is swept first.
    app.run_pipeline("p", job_id="a-bad", initial_state={"n": 0})
    app.run_pipeline("p", job_id="b-good", initial_state={"n": 0})
    app.scheduler.drop_all()  # type: ignore[attr-defined]
    corrupt(r, storage, "a-bad", "wrong-schema")
    return app


def test_the_cli_sweep_skips_a_corrupt_record_and_advances_the_others(storage: RedisStorage,
                                                                     r: redis.Redis) -> None:
    app = _sweep_setup(storage, r)
    done = dict(app.advance_due())
    assert done == {"a-bad": AdvanceResult.UNREACHED, "b-good": AdvanceResult.ADVANCED}


def test_app_advance_due_skips_a_corrupt_record_and_advances_the_others(storage: RedisStorage,
                                                                       r: redis.Redis) -> None:
    app = _sweep_setup(storage, r)
    done = dict(app.advance_due())
    assert done["b-good"] is AdvanceResult.ADVANCED


# --- oversized values --------------------------------------------------------------------------
def test_values_up_to_the_limit_round_trip_and_larger_ones_are_refused_on_redis(storage: RedisStorage,
                                                                               r: redis.Redis) -> None:
    from pipelines.engine.errors import ValueTooLargeError

    big = "y" * (7 * 1024 * 1024)  # under the 8 MiB limit (pipelines.engine.models.MAX_VALUE_BYTES)
    scheduler = MemoryScheduler()

    def a(ctx: PhaseContext[Any]) -> Done:
        blob = ctx.step("fetch", lambda: {"blob": big})
        ctx.append_messages([{"role": "assistant", "content": blob["blob"]}])
        return Done(result=len(blob["blob"]))

    agent_like = App(storage=storage, scheduler=scheduler, pipelines={"p": [Phase("a", a)]})
    agent_like.run_pipeline("p", job_id="big", initial_state={"n": 0})
    scheduler.drain()
    rec = storage.get_job("big")
    assert rec is not None and rec.status is JobStatus.COMPLETE and rec.result == len(big)
    assert storage.messages("big")[0]["content"] == big
    assert r.hstrlen(storage.keys("big").record, "data") < 10_000  # the blob is in the transcript, not the record
    before = dump(r)
    with pytest.raises(ValueTooLargeError, match=r"initial_state of job 'huge' is 5,242,891 bytes of JSON; its record "
                                                 r"keeps it twice"):
        # (the record holds the state twice: as initial_state and in the checkpoint)
        agent_like.run_pipeline("p", job_id="huge", initial_state={"blob": "z" * (5 * 1024 * 1024)})
    assert dump(r) == before  # nothing written


def test_reads_never_wait_for_replicas_that_are_not_there(storage: RedisStorage, redis_url: str) -> None:
    # replicas=1 waits for a copy after each write (fail closed); the lease read went the write path, so
    # `pipelines status` and the job page failed for every job while no replica was connected.
    storage.create_job(JobRecord(job_id="j", status=JobStatus.RUNNING))
    waiting = RedisStorage.from_url(redis_url, prefix=storage.key_prefix(), replicas=1)
    try:
        view = waiting.get_job("j")
        assert view is not None and view.status is JobStatus.RUNNING
        assert waiting.lease_state("j") == (None, False)
    finally:
        waiting.close()


def test_a_lease_taken_while_no_replica_acknowledges_is_let_go_not_counted_as_an_interrupted_turn(
        storage: RedisStorage, redis_url: str) -> None:
    # replicas=1 with the replica gone (a failover leaves the new master without one): each take wrote the lease,
    # then failed at WAIT and left it to run out; each next take counted a turn interrupted, and once the replica
    # was back the job failed as a poison turn ("interrupted 12 times in a row") though no turn had run.
    pipelines = {"p": [Phase("a", lambda ctx: Done(result="ran"))]}
    healthy = App(storage=storage, scheduler=MemoryScheduler(), pipelines=pipelines, lease_seconds=1,
                  max_interrupted_turns=2, provenance=False)
    healthy.run_pipeline("p", job_id="j")
    waiting = RedisStorage(redis.Redis.from_url(redis_url), prefix=storage.key_prefix(), replicas=1,
                           replica_timeout=0.05)
    degraded = App(storage=waiting, scheduler=MemoryScheduler(), pipelines=pipelines, lease_seconds=1,
                   max_interrupted_turns=2, provenance=False)
    try:
        for _ in range(3):
            with pytest.raises(StorageUnavailableError, match="only 0 of 1 replicas"):
                degraded.advance("j")
            assert storage.lease_state("j").owner is None  # let go, not left to run out
            time.sleep(1.05)  # past the lease: a lease left behind would have run out by the next take
    finally:
        waiting.close()
    assert healthy.advance("j") is AdvanceResult.COMPLETED  # the replica is back
    assert healthy.get("j").result == "ran"  # type: ignore[union-attr]


def test_a_cluster_whose_seed_node_does_not_answer_is_storage_unavailable() -> None:
    # redis-py's RedisClusterException is no RedisError: it escaped, and the CLI said the app failed to import.
    url = f"redis://:s3cretPW@127.0.0.1:{free_port()}"
    with pytest.raises(StorageUnavailableError, match=r"Redis Cluster at 'redis://\*\*\*@127\.0\.0\.1:\d+' is "
                                                      r"unreachable") as info:
        RedisStorage.from_url(url, cluster=True)
    assert "s3cretPW" not in str(info.value)


def test_a_cluster_that_answers_no_node_for_a_moment_is_retried_not_raised_raw(
        redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading the slot map again while no node answered raised redis-py's RedisClusterException (no RedisError):
    # past the failover loop, not a StorageUnavailableError, so nothing that catches one saw it.
    storage = RedisStorage.from_url(redis_cluster_url, prefix=f"blip{uuid.uuid4().hex[:6]}", cluster=True)
    try:
        conn = storage.conn
        real_run, real_init = conn._run_on_node, conn.client.nodes_manager.initialize
        failures = {"run": 1, "init": 2}

        def run_once_down(*args: Any, **kwargs: Any) -> Any:
            if failures["run"]:
                failures["run"] -= 1
                raise redis.exceptions.ConnectionError("the master went away")
            return real_run(*args, **kwargs)

        def no_node_answers(*args: Any, **kwargs: Any) -> Any:
            if failures["init"]:
                failures["init"] -= 1
                raise redis.exceptions.RedisClusterException("Redis Cluster cannot be connected")
            return real_init(*args, **kwargs)

        monkeypatch.setattr(conn, "_run_on_node", run_once_down)
        monkeypatch.setattr(conn.client.nodes_manager, "initialize", no_node_answers)
        assert storage.lease_state("nope") == (None, False)  # retried through the blip, within failover_timeout
        assert failures == {"run": 0, "init": 1}
        # No node for longer than the failover timeout: retried to it, then phaserunner's error, not redis-py's.
        failures["run"], failures["init"], conn.failover_timeout = 1000, 1000, 0.3
        with pytest.raises(StorageUnavailableError, match="unreachable while reading the lease of job 'nope'"):
            storage.lease_state("nope")
        assert 1000 - failures["init"] >= 2  # the slot map was asked for again: retried, not raised at once
    finally:
        storage.close()


def test_cluster_true_on_a_plain_redis_is_a_setting_not_an_outage(redis_url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"is not a Cluster \(cluster mode is not enabled\); use "
                                                 r"cluster=False"):
        RedisStorage.from_url(redis_url, cluster=True)


def test_the_worker_sweep_names_a_corrupt_record_once_an_interval_on_one_line(
        storage: RedisStorage, r: redis.Redis, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine import control

    monkeypatch.setattr(control, "_skipped", {}, raising=False)  # what this process said before this test
    app = _sweep_setup(storage, r)
    with caplog.at_level(logging.ERROR, logger="pipelines"):
        for _ in range(3):  # three passes of a worker's sweep (every 2 s)
            assert app.requeue_overdue(grace=0) == ["b-good"]
    said = [rec.getMessage() for rec in caplog.records if "a-bad" in rec.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and said[0].startswith("sweep: skipping job a-bad: "), said
    monkeypatch.setattr(control, "SWEEP_REPEAT_EVERY", 0.0)  # the interval passed: said again while it lasts
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="pipelines"):
        app.requeue_overdue(grace=0)
    assert [rec for rec in caplog.records if "a-bad" in rec.getMessage()]
