"""RedisStorage against a real redis-server: what the contract suite cannot see.

The contract suite (tests/contract) already runs every Storage rule on Redis;
these tests cover lost replies, key layout, write volume, the whole runner,
corruption, outages, URLs and the on-disk format.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.record_format import stored_text
from pipelines import Done, JobStatus, Next, Phase, PhaseContext, run_pipeline
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    InvalidJobIdError,
    StorageError,
    StorageUnavailableError,
)
from pipelines.engine.models import Checkpoint, Commit, JobRecord, LogEntry
from tests.redis_server import RedisServer, find_redis_server, free_port

pytestmark = pytest.mark.redis


# --- builders ------------------------------------------------------------------
def record(job_id: str = "job-1", *, version: int = 1, **kw: Any) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={"n": 0}, version=version, due_at=100.0)
    return JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=version, **kw)


def turn(storage: RedisStorage, job_id: str, n_messages: int = 2, *, owner: str | None = None) -> Commit:
    """Commit one agent-like turn: the next version, a few messages, one log line."""
    rec = storage.get_job(job_id)
    assert rec is not None and rec.checkpoint is not None
    v = rec.version + 1
    tlen = rec.transcript_len + n_messages
    new = rec.model_copy(update={
        "version": v, "transcript_len": tlen,
        "checkpoint": rec.checkpoint.model_copy(update={"version": v, "state": {"n": v}, "transcript_len": tlen}),
    })
    assistant: dict[str, Any] = {"role": "assistant", "content": f"turn {v} " + "x" * 200,
                                 "tool_calls": [{"id": f"c{v}"}]}
    tool: dict[str, Any] = {"role": "tool", "tool_call_id": f"c{v}", "content": json.dumps({"sum": v})}
    msgs = [assistant, tool][:n_messages]
    c = Commit(job_id=job_id, expected_version=rec.version, owner=owner, token=uuid.uuid4().hex, record=new,
               append_messages=msgs, logs=[LogEntry(timestamp=float(v), phase="a", message=f"turn {v}")])
    storage.commit(c)
    return c


def raw(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


# --- a TCP proxy that loses one reply --------------------------------------------
class ReplyLosingProxy:
    """Forwards 127.0.0.1 traffic to Redis; when armed, lets one matching command reach the server,
    then drops the connection instead of forwarding the reply (a reply lost on the network)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed: bytes | None = None
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            state = {"swallow": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    if self.armed is not None and self.armed in data:
                        # Mark before forwarding, so the reply cannot race past us.
                        self.armed, state["swallow"] = None, True
                dst.sendall(data)
        except OSError:
            pass

    def _down(self, src: socket.socket, dst: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := src.recv(65536):
                if state["swallow"]:
                    self.dropped += 1
                    break  # the server applied the command; its reply is lost
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            # shutdown, not just close: it sends the FIN and wakes the other pump's blocked recv.
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_a_commit_whose_reply_was_lost_is_resent_by_redis_py_and_recognised(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = ReplyLosingProxy(port)
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{proxy.port}/0", prefix="itest")
    try:
        storage.create_job(record(), messages=[{"role": "user", "content": "hi"}])
        # The commit function's name travels in FCALL (adapters.redis.library): lose exactly that reply.
        proxy.armed = storage.scripts.commit.name.encode()
        c = turn(storage, "job-1")  # redis-py reconnects and re-sends; no exception
        assert proxy.dropped == 1
        got = storage.get_job("job-1")
        assert got is not None and got.version == 2
        assert [m["role"] for m in storage.messages("job-1")] == ["user", "assistant", "tool"]  # not doubled
        assert [e.message for e in storage.logs("job-1")] == ["turn 2"]
        storage.commit(c)  # and once more by hand: still a no-op
        assert len(storage.messages("job-1")) == 3
    finally:
        storage.close()
        proxy.close()


def test_a_create_whose_reply_was_lost_is_not_a_conflict(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = ReplyLosingProxy(port)
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{proxy.port}/0", prefix="itest")
    try:
        storage.get_job("job-1")  # loads the scripts
        proxy.armed = storage.scripts.create.sha.encode()
        storage.create_job(record(), messages=[{"role": "user", "content": "hi"}])
        assert proxy.dropped == 1
        assert storage.messages("job-1") == [{"role": "user", "content": "hi"}]
    finally:
        storage.close()
        proxy.close()


def test_the_same_commit_twice_writes_once(storage: RedisStorage, redis_url: str) -> None:
    storage.create_job(record())
    c = turn(storage, "job-1")
    storage.commit(c)
    r = raw(redis_url)
    assert r.llen(storage.keys("job-1").messages) == 2
    assert r.llen(storage.keys("job-1").logs) == 1
    assert r.hget(storage.keys("job-1").record, "version") == b"2"


# --- key layout -------------------------------------------------------------------
def test_every_key_of_a_job_has_the_prefix_and_its_hash_tag(storage: RedisStorage, redis_url: str) -> None:
    for job_id in ("job-1", "a.b:c_d-9"):
        storage.create_job(record(job_id), messages=[{"role": "user", "content": "q"}])
        storage.acquire_lease(job_id, "w1", 30)
        storage.record_step(job_id, version=1, owner="w1", key="model", value={"text": "t"})
        turn(storage, job_id, owner="w1")
        storage.acquire_lease(job_id, "w1", 30)
        storage.record_step(job_id, version=2, owner="w1", key="model", value={"text": "t"})
    keys = sorted(k.decode() for k in raw(redis_url).scan_iter("*"))
    globals_ = {"itest:due", "itest:jobs", "itest:updated", "itest:status:running", "itest:layout"}
    assert globals_ <= set(keys)
    per_job = [k for k in keys if k not in globals_]
    assert per_job and all(k.startswith("itest:{") for k in per_job)
    for job_id in ("job-1", "a.b:c_d-9"):
        mine = {k for k in per_job if k.startswith(f"itest:{{{job_id}}}:")}
        assert {k.rsplit(":", 1)[1] for k in mine} == {"record", "messages", "logs", "journal", "lease"}


@pytest.mark.parametrize("job_id", ["a}b", "{x}", "a b", "", "x" * 201, "é"])
def test_a_crafted_job_id_cannot_escape_its_namespace(storage: RedisStorage, job_id: str) -> None:
    with pytest.raises(InvalidJobIdError):
        storage.create_job(JobRecord.model_construct(job_id=job_id, version=1))
    with pytest.raises(InvalidJobIdError):
        storage.get_job(job_id)


def test_prefixes_keep_storages_apart(redis_url: str) -> None:
    a, b = RedisStorage.from_url(redis_url, prefix="a"), RedisStorage.from_url(redis_url, prefix="b")
    a.create_job(record())
    assert b.get_job("job-1") is None and b.list_jobs() == [] and b.due_jobs(1e9) == []
    b.create_job(record())  # no conflict: another namespace
    assert a.due_jobs(1e9) == ["job-1"]
    with pytest.raises(ConfigurationError):
        RedisStorage(a.client, prefix="p{x}")


# --- write volume ----------------------------------------------------------------
def test_bytes_sent_per_turn_do_not_grow_with_the_transcript(storage: RedisStorage, redis_url: str) -> None:
    meter = raw(redis_url)

    def net_in() -> int:
        return int(meter.info("stats")["total_net_input_bytes"])

    storage.create_job(record(), messages=[{"role": "user", "content": "go"}])
    turn(storage, "job-1")  # warm-up: the first call of each script also sends its source (SCRIPT LOAD)
    sent: dict[int, int] = {}
    for k in range(1, 101):
        before = net_in()
        turn(storage, "job-1")
        sent[k] = net_in() - before
    assert len(storage.messages("job-1")) == 203
    transcript = sum(len(m) for m in meter.lrange(storage.keys("job-1").messages, 0, -1))
    # Turn 100 sends what turn 1 sent, give or take a few digits; the transcript is ~100x larger.
    assert abs(sent[100] - sent[1]) < 64, sent
    assert sent[100] < transcript / 10


# --- the whole runner ------------------------------------------------------------
def test_the_runner_drives_a_pipeline_on_redis(storage: RedisStorage) -> None:
    scheduler = MemoryScheduler()

    def think(ctx: PhaseContext[Any]) -> Next | Done:
        n = ctx.state["n"]
        reply = ctx.step("model", lambda: {"content": f"step {n}"})
        ctx.append_messages([{"role": "assistant", "content": reply["content"]}])
        ctx.log(f"turn {n}")
        return Done(result={"turns": n}) if n >= 5 else Next("think", state={"n": n + 1}, delay=1.0)

    run_pipeline(job_id="agent-1", phases=[Phase("think", think)], storage=storage, scheduler=scheduler,
                 initial_state={"n": 1})
    assert scheduler.drain() == 5
    job = storage.get_job("agent-1")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == {"turns": 5}
    assert job.transcript_len == 5
    assert [m["content"] for m in storage.messages("agent-1")] == [f"step {n}" for n in range(1, 6)]
    assert [e.message for e in storage.logs("agent-1")][-2:] == ["turn 5", "job complete"]
    assert storage.due_jobs(time.time() + 1e6) == [] and storage.lease_owner("agent-1") is None
    assert [r.job_id for r in storage.list_jobs(status=JobStatus.COMPLETE)] == ["agent-1"]


# --- failures -------------------------------------------------------------------
def test_a_hand_corrupted_record_raises_corrupt_record_error(storage: RedisStorage, redis_url: str) -> None:
    storage.create_job(record("good"))
    storage.create_job(record("bad"))
    raw(redis_url).hset(storage.keys("bad").record, "data", '{"job_id": "bad", "status": "melted"')
    with pytest.raises(CorruptRecordError, match="'bad'"):
        storage.get_job("bad")
    with pytest.raises(CorruptRecordError, match="'bad'"):
        storage.acquire_lease("bad", "w1", 30)
    assert [r.job_id for r in storage.list_jobs()] == ["good"]  # a listing skips (and logs) the bad one
    assert storage.get_job("good") is not None
    raw(redis_url).rpush(storage.keys("good").messages, "not json")
    with pytest.raises(CorruptRecordError, match="'good'"):
        storage.messages("good")


def test_a_hash_version_changed_by_hand_is_reported_not_fenced_off_for_ever(storage: RedisStorage,
                                                                            redis_url: str) -> None:
    # The hash's 'version' is what every write is fenced on; the JSON's is what the engine expects. Parted by a
    # hand edit, every commit would be refused as stale and the job retried without a word.
    storage.create_job(record("v"))
    turn(storage, "v", owner=None)  # version 2, written whole or as a delta
    key = storage.keys("v").record
    raw(redis_url).hset(key, "version", "7")
    with pytest.raises(CorruptRecordError, match=r"'v' is at version 2 but its hash's 'version' field says '7'"):
        storage.get_job("v")
    with pytest.raises(CorruptRecordError, match="'version' field"):
        storage.acquire_lease("v", "w1", 30)
    assert storage.lease_owner("v") is None  # the lease it took went back
    raw(redis_url).hset(key, "version", "2")  # set right again: the job reads and runs
    assert storage.acquire_lease("v", "w1", 30) is not None
    commit = turn(storage, "v", owner="w1")  # this worker now holds what the hash holds: its next load is warm
    raw(redis_url).hset(key, "version", "9")
    warm = storage.records.warm_loads
    with pytest.raises(CorruptRecordError, match="'version' field says '9'"):
        storage.acquire_lease("v", "w1", 30)
    assert storage.records.warm_loads == warm + 1 and commit.record.version == 3  # checked on the warm path too


def test_redis_down_raises_storage_unavailable_in_bounded_time() -> None:
    storage = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    for call in (lambda: storage.get_job("job-1"), lambda: storage.create_job(record()),
                 lambda: storage.due_jobs(1.0)):
        t0 = time.monotonic()
        with pytest.raises(StorageUnavailableError, match="unreachable"):
            call()
        # 5 retries with backoff capped at 1 s (connect and command levels): seconds, not minutes.
        assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:6379/0", "redis://127.0.0.1:notaport/0", "redis://127.0.0.1:99999/0", "redis:///0",
    "redis://127.0.0.1:6379/zero", "127.0.0.1:6379", "", "unix://", "redis://127.0.0.1:6379/0?db=x",
])
def test_bad_urls_raise_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="Redis URL"):
        RedisStorage.from_url(url)


def test_a_password_in_a_bad_url_is_not_shown() -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisStorage.from_url("redis://user:hunter2@127.0.0.1:bad/0")
    assert "hunter2" not in str(info.value)


def test_tls_urls_build_a_tls_client() -> None:
    storage = RedisStorage.from_url("rediss://127.0.0.1:6380/2", prefix="p")
    kwargs = storage.client.connection_pool.connection_kwargs
    assert storage.client.connection_pool.connection_class is redis.SSLConnection
    assert kwargs["db"] == 2


@pytest.fixture
def auth_server() -> Iterator[RedisServer]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    server = RedisServer(binary)
    try:
        server.start()  # its readiness probe is an unauthenticated PING, so the password comes after
        admin = redis.Redis(port=server.port)
        admin.config_set("requirepass", "s3cret")
        admin.close()
        yield server
    finally:
        server.cleanup()


def test_auth_and_db_number_come_from_the_url(auth_server: RedisServer) -> None:
    storage = RedisStorage.from_url(f"redis://:s3cret@127.0.0.1:{auth_server.port}/3", prefix="p")
    storage.create_job(record())
    direct = redis.Redis(port=auth_server.port, password="s3cret", db=3)
    assert direct.exists(storage.keys("job-1").record) == 1
    assert redis.Redis(port=auth_server.port, password="s3cret", db=0).dbsize() == 0
    wrong = RedisStorage.from_url(f"redis://:nope@127.0.0.1:{auth_server.port}/3", retries=0)
    with pytest.raises(StorageError) as info:
        wrong.get_job("job-1")
    assert not isinstance(info.value, StorageUnavailableError)
    for c in (storage.client, direct, wrong.client):
        c.close()


@pytest.mark.parametrize("flush", ["script_flush", "function_flush"])
def test_scripts_still_run_after_script_flush(storage: RedisStorage, redis_url: str, flush: str) -> None:
    # SCRIPT FLUSH empties the script cache; FUNCTION FLUSH the turn's functions (adapters.redis.library).
    storage.create_job(record())
    turn(storage, "job-1")
    getattr(raw(redis_url), flush)()
    assert storage.acquire_lease("job-1", "w1", 30) is not None
    getattr(raw(redis_url), flush)()
    turn(storage, "job-1", owner="w1")
    getattr(raw(redis_url), flush)()
    assert storage.renew_lease("job-1", "w1", 30) is False  # the commit released it
    assert storage.delete_job("job-1") is True
    assert storage.scripts.library.on  # loaded again, not given up for EVALSHA


def test_nothing_is_pickled_every_value_is_json_or_plain_text(storage: RedisStorage, redis_url: str) -> None:
    storage.create_job(record(), messages=[{"role": "user", "content": "hé"}], logs=[])
    storage.acquire_lease("job-1", "w1", 30)
    storage.record_step("job-1", version=1, owner="w1", key="tool:c1", value={"sum": 2})
    turn(storage, "job-1", owner="w1")
    storage.acquire_lease("job-1", "w1", 30)
    storage.record_step("job-1", version=2, owner="w1", key="model", value=[1, "two", None])
    r = raw(redis_url)
    values: list[Any] = []
    for key in r.scan_iter("*"):
        kind = r.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            values.append(r.get(key) or b"")
        elif kind == "list":
            values += r.lrange(key, 0, -1)
        elif kind == "hash":
            values += [x for kv in r.hgetall(key).items() for x in kv]
        elif kind == "set":
            values += list(r.smembers(key))
        elif kind == "zset":
            values += list(r.zrange(key, 0, -1))
        else:
            pytest.fail(f"unexpected {kind} at {key!r}")
    assert values
    for v in values:
        assert not v.startswith(b"\x80"), v  # the pickle protocol marker
        v.decode("utf-8")  # plain text
    rec = stored_text(*r.hmget(storage.keys("job-1").record, ["data", "base", "dx"]))  # either record format
    assert rec is not None and json.loads(rec)["job_id"] == "job-1"
    assert all(json.loads(m) for m in r.lrange(storage.keys("job-1").messages, 0, -1))
    assert json.loads(r.hget(storage.keys("job-1").journal, "model") or b"") == [1, "two", None]


def test_delete_job_removes_every_key_and_index_entry(storage: RedisStorage, redis_url: str) -> None:
    storage.create_job(record(), messages=[{"role": "user", "content": "q"}], logs=[LogEntry(timestamp=1, message="x")])
    storage.acquire_lease("job-1", "w1", 30)
    storage.record_step("job-1", version=1, owner="w1", key="m", value=1)
    assert storage.delete_job("job-1") is True
    r = raw(redis_url)
    assert [k for k in r.scan_iter("*") if b"{job-1}" in k] == []
    assert r.zscore("itest:due", "job-1") is None and not r.sismember("itest:jobs", "job-1")


def test_ranged_transcript_reads_follow_python_slices(storage: RedisStorage) -> None:
    contents = [str(i) for i in range(5)]
    storage.create_job(record(), messages=[{"role": "user", "content": c} for c in contents])
    for start in range(-7, 8):
        for stop in [None, *range(-7, 8)]:
            got = [m["content"] for m in storage.messages("job-1", start, stop)]
            assert got == contents[start:stop], (start, stop)


def test_a_lease_ttl_must_be_finite(storage: RedisStorage) -> None:
    storage.create_job(record())
    with pytest.raises(InvalidInputError):
        storage.acquire_lease("job-1", "w1", float("inf"))


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    server = RedisServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def test_storage_reports_an_outage_and_recovers_when_redis_is_back(own_server: RedisServer) -> None:
    storage = RedisStorage.from_url(own_server.url, retries=2)
    storage.create_job(record())
    own_server.kill()
    with pytest.raises(StorageUnavailableError):
        storage.get_job("job-1")
    own_server.start()  # same port; no persistence, so the job is gone, but the client works again
    assert storage.get_job("job-1") is None
    storage.create_job(record())
    assert storage.get_job("job-1") is not None
    storage.close()


def test_the_test_server_moves_off_a_port_taken_before_it_starts_but_a_restart_never_moves() -> None:
    binary = find_redis_server()
    if binary is None:
        pytest.skip("redis-server not found")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]  # a parallel process won the race for the "free" port
        server = RedisServer(binary, port=port)
        try:
            server.start()
            assert server.port != port
            assert redis.Redis(port=server.port).ping()
            server.stop()
            server.port = port
            with pytest.raises(RuntimeError, match="exited"):
                server.start()  # clients hold the URL: a restart keeps its port or fails
        finally:
            server.cleanup()


def test_new_connections_do_not_look_up_redis_pys_version_and_still_say_who_they_are(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.driver_info

    from adapters.redis import client as redis_common

    redis_common.driver_info()  # looked up once per process (before a worker forks)
    looked_up: list[int] = []
    real = redis.utils.get_lib_version

    def counting() -> str:
        looked_up.append(1)
        return str(real())

    monkeypatch.setattr(redis.utils, "get_lib_version", counting)
    from_url = RedisStorage.from_url(redis_url)
    own = redis.Redis.from_url(redis_url)  # a client the user built: told once when the storage takes it
    taken = RedisStorage(own)
    for storage in (from_url, taken):
        pool = storage.client.connection_pool
        pool.disconnect()  # as in a forked work-horse: the next command makes a new connection
        assert storage.client.ping()
        conn = pool.get_connection()
        try:  # what CLIENT SETINFO sends (Redis >= 7.2 shows it in CLIENT INFO; 7.0 ignores it)
            assert (conn.driver_info.formatted_name, conn.driver_info.lib_version) == ("redis-py", real())
        finally:
            pool.release(conn)
    assert looked_up == []
    named = redis.Redis.from_url(redis_url, driver_info=redis.driver_info.DriverInfo(name="mine", lib_version="1"))
    RedisStorage(named)  # a client built with its own driver info keeps it
    assert named.connection_pool.connection_kwargs["driver_info"].formatted_name == "mine"
