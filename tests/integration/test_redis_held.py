"""The turn's three functions go on a connection each thread keeps (adapters/redis/held.py).

Held to what a call through the pool gives: one connection a thread however many calls, none taken
from the pool (a sized pool is not drained), closed when the thread ends or the storage closes,
connected again after the server dropped it, sent again when it was lost on the way, never a
parent's in a forked child, and not used where it must not be (a client with one connection, a
Cluster: elsewhere).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage, held
from adapters.redis.held import Held
from pipelines.engine.models import Checkpoint, JobRecord, JobStatus
from tests.integration.test_redis_step_before_commit import _journal


@pytest.fixture
def storage(redis_url: str) -> Any:
    store = RedisStorage.from_url(redis_url, prefix=f"h{uuid.uuid4().hex[:8]}")
    yield store
    store.close()


def _job(storage: RedisStorage, job_id: str = "j1") -> None:
    cp = Checkpoint[Any](next_phase="a", state={}, version=1, due_at=100.0)
    storage.create_job(JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=1))
    assert storage.acquire_lease(job_id, "w1", 30) is not None  # the lease and load: LOAD, on the kept connection


def _step(storage: RedisStorage, key: str, value: Any, job_id: str = "j1") -> None:
    storage.record_step(job_id, version=1, owner="w1", key=key, value=value)


class Taken:
    """How many connections a pool handed out (``get_connection`` calls) while counting."""

    def __init__(self, pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        inner = pool.get_connection

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(pool, "get_connection", counted)


def test_a_threads_calls_take_no_connection_from_the_pool(redis_url: str, storage: RedisStorage,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _job(storage)
    taken = Taken(storage.client.connection_pool, monkeypatch)
    for i in range(20):
        _step(storage, f"s{i}", i)
    assert taken.n == 0  # through the pool: one a call
    assert _journal(redis_url, storage) == {f"s{i}": i for i in range(20)}


def test_a_sized_pool_is_not_drained_by_threads_that_keep_a_connection(redis_url: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=1)
    store = RedisStorage(redis.Redis(connection_pool=pool), prefix=f"h{uuid.uuid4().hex[:8]}")
    try:
        _job(store)
        done: list[str] = []
        threads = [threading.Thread(target=lambda i=i: (_step(store, f"t{i}", i), done.append(f"t{i}")))
                   for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Each thread keeps its connection outside the pool: the pool's one is free for everything else.
        assert sorted(done) == ["t0", "t1", "t2"]
        assert store.get_job("j1") is not None
        assert _journal_keys(store) == {"t0", "t1", "t2"}
    finally:
        store.close()


def _connections(storage: RedisStorage) -> list[Any]:
    held = storage.conn._held
    assert held is not None
    return [slot.conn for slot in list(held._slots)]


def test_a_thread_that_ends_has_its_connection_closed(storage: RedisStorage) -> None:
    _job(storage)
    seen: list[Any] = []

    def work() -> None:
        _step(storage, "from-a-thread", 1)
        seen.append(storage.conn._held._local.slot.conn)  # type: ignore[union-attr]

    t = threading.Thread(target=work)
    t.start()
    t.join()
    gc.collect()
    assert seen and seen[0]._sock is None and seen[0] not in _connections(storage)
    assert _journal_keys(storage) == {"from-a-thread"}


def _journal_keys(storage: RedisStorage) -> set[str]:
    return {k.decode() for k in storage.client.hkeys(storage.keys("j1").journal)}


def test_closing_the_storage_closes_every_threads_connection_and_a_later_call_reconnects(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    release = threading.Event()
    started = threading.Event()

    def work() -> None:  # a thread that lives on past close(), as a worker's would
        _step(storage, "thread", 1)
        started.set()
        release.wait(10)
        _step(storage, "thread-again", 2)

    t = threading.Thread(target=work)
    t.start()
    assert started.wait(10)
    conns = _connections(storage)
    assert len(conns) == 2 and all(c._sock is not None for c in conns)
    storage.close()
    assert all(c._sock is None for c in conns)
    release.set()
    t.join()
    _step(storage, "after-close", 3)
    assert _journal(redis_url, storage) == {"thread": 1, "thread-again": 2, "after-close": 3}


def test_a_connection_the_server_dropped_is_connected_again(redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    admin = redis.Redis.from_url(redis_url)
    try:
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # a restart, an idle timeout
        _step(storage, "after-kill", 3)
    finally:
        admin.close()
    assert _journal(redis_url, storage) == {"after-kill": 3}


def test_a_reply_lost_on_the_way_has_the_call_sent_again(redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    slot = storage.conn._held._local.slot  # type: ignore[union-attr]
    conn, read = slot.conn, slot.conn.read_response
    lost = []

    def lose_first(*args: Any, **kwargs: Any) -> Any:
        if not lost:
            lost.append(read(*args, **kwargs))  # the server ran it; its reply is lost with the connection
            raise redis.exceptions.ConnectionError("connection reset by peer")
        return read(*args, **kwargs)

    conn.read_response = lose_first
    try:
        _step(storage, "twice", {"a": 1})  # sent again: the same write, idempotent
    finally:
        del conn.read_response
    assert lost and _journal(redis_url, storage) == {"twice": {"a": 1}}


def test_a_read_interrupted_midway_drops_the_connection_and_the_next_call_reads_its_own_reply(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    slot = storage.conn._held._local.slot  # type: ignore[union-attr]
    conn, read = slot.conn, slot.conn.read_response

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # a signal while the reply is on its way: it stays unread on the socket

    conn.read_response = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            _step(storage, "interrupted", 1)
    finally:
        conn.read_response = read
    assert conn._sock is None  # dropped: its unread reply cannot answer the next call
    _step(storage, "next", 2)
    assert _journal(redis_url, storage) == {"interrupted": 1, "next": 2}


def test_an_error_reply_leaves_the_connection_usable(redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    held = storage.conn._held
    assert held is not None
    with pytest.raises(redis.exceptions.ResponseError, match="unknown command"):
        held.call(storage.client, ("NOSUCHCOMMAND", "x"))
    _step(storage, "after-error", 4)
    assert _journal(redis_url, storage) == {"after-error": 4}


def test_a_forked_child_uses_a_connection_of_its_own(redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    parent = storage.conn._held._local.slot.conn  # type: ignore[union-attr]
    pid = os.fork()
    if pid == 0:  # the child: its calls must not go on (or close) its parent's socket
        code = 1
        try:
            _step(storage, "child", 5)
            slot = storage.conn._held._local.slot  # type: ignore[union-attr]
            code = 0 if slot.conn is not parent and slot.pid == os.getpid() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _step(storage, "parent", 6)  # the parent's connection still reads its own replies in order
    assert storage.conn._held._local.slot.conn is parent  # type: ignore[union-attr]
    assert _journal(redis_url, storage) == {"child": 5, "parent": 6}


@pytest.mark.parametrize("turns", [1, 3])
def test_a_horse_sends_its_first_turn_through_the_pool_and_keeps_a_connection_if_it_goes_on(
        redis_url: str, storage: RedisStorage, turns: int) -> None:
    from bench import w1
    from bench.apps import w1_agent
    from bench.run import NoopScheduler  # no queue to hand the job back to: continue_for runs every turn
    from pipelines.app import App

    _job(storage)
    parent = storage.conn._held._local.slot  # type: ignore[union-attr]
    app = App(storage=storage, scheduler=NoopScheduler(), agents=[w1_agent(turns)], continue_for=30)
    app.run_agent("w1", job_id="h1", messages=[w1.USER])
    pid = os.fork()
    if pid == 0:  # a forking worker's horse (adapters.rq.lifeline marks it), running one job
        code = 1
        try:
            held.pool_only_process()
            app.try_advance("h1")  # under continue_for: every turn of the job, in this process
            slot = storage.conn._held._local.slot  # type: ignore[union-attr]
            # One turn: all of it through the pool (the parent's slot untouched, none made). More: a kept
            # connection of the horse's own from its second turn.
            kept = slot is not parent and slot.pid == os.getpid()
            code = 0 if app.get("h1").status is JobStatus.COMPLETE and kept == (turns > 1) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(app.messages("h1")) == 2 + 2 * (turns - 1) + 1


def test_a_one_turn_horse_whose_commit_is_sent_again_whole_keeps_no_connection(
        redis_url: str, storage: RedisStorage) -> None:
    # A commit answered 'rebase' (the record hash not the one its delta was computed from) is sent again whole:
    # through the pool, as the rest of a one-turn horse's calls, not on a connection made for it.
    from bench.run import NoopScheduler
    from pipelines import Agent
    from pipelines.app import App
    from pipelines.testing import ScriptedModel

    def model(msgs: list[Any]) -> str:
        redis.Redis.from_url(redis_url).hset(storage.keys("h1").record, "token", "another")  # -> 'rebase'
        return "done"

    app = App(storage=storage, scheduler=NoopScheduler(), agents=[Agent(name="a", model=ScriptedModel(model))],
              continue_for=30)
    app.run_agent("a", job_id="h1", messages=["hi"])
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            held.pool_only_process()
            app.try_advance("h1")
            slot = getattr(storage.conn._held._local, "slot", None)  # type: ignore[union-attr]
            made = slot is not None and slot.pid == os.getpid()
            code = 0 if app.get("h1").status is JobStatus.COMPLETE and not made else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_child_forked_while_another_thread_held_the_lock_makes_its_connection(
        redis_url: str, storage: RedisStorage) -> None:
    kept = storage.conn._held
    assert kept is not None
    with kept._lock:  # another thread of the parent, in the middle of making its connection, at the fork
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _job(storage, "f1")  # makes the child's own connection: under the lock
                code = 0
            finally:
                os._exit(code)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    if done == (0, 0):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child waited for ever on the lock its parent's thread held at the fork")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_client_with_a_single_connection_sends_everything_on_it(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, single_connection_client=True)
    store = RedisStorage(client, prefix=f"h{uuid.uuid4().hex[:8]}")
    try:
        assert store.conn._held is None
        _job(store)
        _step(store, "single", 7)
        assert _journal(redis_url, store) == {"single": 7}
    finally:
        store.close()


def test_a_cluster_storage_keeps_none(redis_cluster_url: str) -> None:
    store = RedisStorage.from_url(redis_cluster_url, prefix=f"h{uuid.uuid4().hex[:8]}", cluster=True)
    try:
        assert store.conn._held is None  # its calls go to each slot's node (RedisConnection._run_on_node)
        _job(store)
        _step(store, "cluster", 8)
        assert _journal_keys(store) == {"cluster"}
    finally:
        store.close()


def test_a_held_call_sends_the_command_it_is_given_and_reads_its_reply(storage: RedisStorage) -> None:
    held = Held()
    assert held.call(storage.client, ("ECHO", "hello")) == b"hello"
    held.close()


def test_a_command_is_packed_as_redis_py_packs_it_and_a_bad_value_is_refused_the_same_way(
        storage: RedisStorage) -> None:
    from redis.connection import HiredisRespSerializer, PythonRespSerializer

    sent: list[bytes] = []
    checked: list[bool] = []

    class Wire:
        def send_packed_command(self, packed: Any, check_health: bool = True) -> None:
            sent.append(packed if isinstance(packed, bytes) else b"".join(packed))
            checked.append(check_health)

        def send_command(self, *args: Any, **kwargs: Any) -> None:  # as redis-py's, which packs with hiredis here
            # DataError for a value it refuses.
            self.send_packed_command(HiredisRespSerializer().pack(*args), check_health=kwargs.get("check_health", True))

    command = ("FCALL", "prabc123c", 2, "pr:{j1}:record", "pr:due", "", "é ☃ \\n", b"\x00raw", 12)
    held.put(Wire(), command)
    expected = HiredisRespSerializer().pack(*command)[0]
    assert sent == [expected]
    encoder = storage.client.connection_pool.get_encoder()
    assert b"".join(PythonRespSerializer(6000, encoder.encode).pack(*command)) == expected  # without hiredis too
    sent.clear()
    held.put(Wire(), ("CLIENT SETNAME", "x"))  # a command name of two words: redis-py splits it, so does put
    assert sent == [HiredisRespSerializer().pack("CLIENT SETNAME", "x")[0]]
    with pytest.raises(redis.exceptions.DataError):
        held.put(Wire(), ("ECHO", None))  # hiredis refuses it; redis-py's send_command says what it is
    # Behind an unread reply no health check goes first (its PING would read that reply as its own), both ways.
    checked.clear()
    held.put(Wire(), ("ECHO", "x"), check_health=False)
    held.put(Wire(), ("CLIENT SETNAME", "x"), check_health=False)
    assert checked == [False, False]
    # And on a real connection: the reply of what was put.
    conn = storage.client.connection_pool.get_connection()
    try:
        held.put(conn, ("ECHO", "é ☃"))
        assert conn.read_response() == "é ☃".encode()
    finally:
        storage.client.connection_pool.release(conn)
