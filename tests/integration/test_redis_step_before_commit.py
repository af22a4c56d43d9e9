"""A Redis worker's last journal write before its commit: sent at once, its reply read with the next script.

The agent turn journals its one tool call's result with ``record_step_before_commit``
(adapters/redis/deferred.py). These tests hold it to what a synchronous write gives: the result is in
Redis once the call returns (a worker killed with SIGKILL right after still journaled it), a lost
script or connection has it sent again, and the thread's next script reads the reply first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.redis.deferred import Deferred
from bench import w1
from bench.apps import w1_agent
from pipelines.engine.models import Checkpoint, JobRecord, JobStatus
from pipelines.testing import ScriptedModel, call, reply

MODEL = {"model": "the answer"}


def _job(storage: RedisStorage, job_id: str = "j1") -> None:
    """A leased job with its model's answer journaled, as an agent turn's is before its tool runs."""
    cp = Checkpoint[Any](next_phase="a", state={}, version=1, due_at=100.0)
    storage.create_job(JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=1))
    assert storage.acquire_lease(job_id, "w1", 30) is not None
    storage.record_step(job_id, version=1, owner="w1", key="model", value="the answer")


def _journal(url: str, storage: RedisStorage, job_id: str = "j1") -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    try:
        raw = client.hgetall(storage.keys(job_id).journal)
    finally:
        client.close()
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def _eventually(read: Any) -> Any:
    """What ``read()`` gives once it gives something (within 5 s): a write another connection sent."""
    deadline = time.monotonic() + 5
    while not (found := read()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


@pytest.fixture
def storage(redis_url: str) -> Any:
    store = RedisStorage.from_url(redis_url, prefix=f"d{uuid.uuid4().hex[:8]}")
    yield store
    store.close()


@pytest.fixture(params=["kept", "pool"])
def way(request: pytest.FixtureRequest, storage: RedisStorage) -> str:
    """The connection the write goes on: the thread's kept one (adapters/redis/held.py), or the pool's
    (a forking worker's horse, a client with a single connection: no kept one)."""
    if request.param == "pool":
        storage.conn._held = None
    return str(request.param)


def test_the_reply_is_read_by_the_threads_next_script_and_the_connection_goes_back(redis_url: str,
                                                                                  storage: RedisStorage,
                                                                                  way: str) -> None:
    _job(storage)
    pool = storage.client.connection_pool
    busy = len(pool._in_use_connections)
    storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value={"sum": 4})
    assert storage.conn._deferred.waiting()  # sent, its reply not read
    pending = storage.conn._deferred._local.pending
    if way == "kept":  # on the thread's own connection: none taken from the pool
        assert pending.conn is storage.conn._held._local.slot.conn  # type: ignore[union-attr]
        assert len(pool._in_use_connections) == busy
    else:  # out of the pool until its reply is read
        assert len(pool._in_use_connections) == busy + 1
    # The server runs it whether or not anyone reads the reply (as for a worker killed now: below).
    assert _eventually(lambda: _journal(redis_url, storage).get("tool:c1")) == {"sum": 4}
    loaded = storage.acquire_lease("j1", "w1", 30)  # the next script reads the reply first
    assert not storage.conn._deferred.waiting() and len(pool._in_use_connections) == busy
    assert loaded is not None and loaded.checkpoint is not None
    assert loaded.checkpoint.journal == {**MODEL, "tool:c1": {"sum": 4}}


def test_closing_the_storage_reads_the_reply_first_and_a_later_call_reconnects(redis_url: str,
                                                                               storage: RedisStorage,
                                                                               way: str) -> None:
    _job(storage)
    refused: list[str] = []
    admin = redis.Redis.from_url(redis_url)
    admin.set(storage.keys("j1").lease, "w2")  # another owner took the lease: the write is refused
    storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value=5,
                                      on_refused=lambda: refused.append("tool:c1"))
    assert storage.conn._deferred.waiting()
    conn = storage.conn._deferred._local.pending.conn
    pool = storage.client.connection_pool
    assert conn._sock is not None and (conn in pool._in_use_connections) == (way == "pool")
    storage.close()
    # The refusal reached the turn before the connection went (not lost with it), and every connection is closed.
    assert refused == ["tool:c1"] and not storage.conn._deferred.waiting()
    assert conn._sock is None
    assert not pool._in_use_connections and all(c._sock is None for c in pool._available_connections)
    assert _journal(redis_url, storage) == MODEL
    job = storage.get_job("j1")  # a later call opens a new connection
    assert job is not None and job.checkpoint is not None and job.checkpoint.journal == MODEL
    admin.close()


@pytest.mark.parametrize("functions", [True, False])
def test_a_script_the_server_lost_is_run_again(redis_url: str, storage: RedisStorage, functions: bool) -> None:
    _job(storage)
    admin = redis.Redis.from_url(redis_url)
    if functions:  # a restarted server, say: FCALL answers "Function not found" (adapters.redis.library)
        admin.function_flush()
    else:  # a server without functions: EVALSHA answers NOSCRIPT
        storage.scripts.library.on = False
        admin.script_flush()
    storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value=[1])
    assert _journal(redis_url, storage) == MODEL
    storage.get_job("j1")  # reads the "not found" reply: the write is run again, loading the function or script
    assert _journal(redis_url, storage) == {**MODEL, "tool:c1": [1]}
    admin.close()


def test_a_connection_lost_before_the_write_ran_has_it_sent_again(redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    admin = redis.Redis.from_url(redis_url)
    # The server holds the scripts it reads, runs none (CLIENT KILL, not a write, still runs).
    admin.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
    try:
        storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value="late")
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")  # drops the unrun write
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert _journal(redis_url, storage) == MODEL
    storage.get_job("j1")  # the reply is lost with the connection: the write is sent again
    assert _journal(redis_url, storage) == {**MODEL, "tool:c1": "late"}
    admin.close()


def test_a_worker_killed_right_after_the_call_returns_has_journaled_it(redis_url: str) -> None:
    prefix = f"k{uuid.uuid4().hex[:8]}"
    storage = RedisStorage.from_url(redis_url, prefix=prefix)
    _job(storage)
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.getcwd()!r})
        from adapters.redis import RedisStorage
        storage = RedisStorage.from_url({redis_url!r}, prefix={prefix!r})
        storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value={{"paid": True}})
        os.kill(os.getpid(), signal.SIGKILL)  # before anything reads the reply
    """)
    proc = subprocess.run([sys.executable, "-c", child], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _eventually(lambda: _journal(redis_url, storage).get("tool:c1")) == {"paid": True}
    storage.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The step keys of the journal writes sent without their reply waited for, in order."""
    keys: list[str] = []
    real = Deferred.send

    def counting(self: Deferred, client: Any, script: Any, skeys: Any, args: Any, what: str, on_reply: Any,
                 held: Any = None) -> bool:
        keys.append(args[3])
        return real(self, client, script, skeys, args, what, on_reply, held)

    monkeypatch.setattr(Deferred, "send", counting)
    return keys


def test_an_agent_journals_each_one_call_turn_this_way_and_its_transcript_is_whole(
        redis_url: str, storage: RedisStorage, sent: list[str]) -> None:
    scheduler = MemoryScheduler()
    agent = w1_agent(5)
    agent.run(job_id="a1", messages=[w1.USER], storage=storage, scheduler=scheduler)
    from pipelines.app import App

    App(storage=storage, scheduler=scheduler, agents=[agent])
    scheduler.drain()
    job = storage.get_job("a1")
    assert job is not None and job.status is JobStatus.COMPLETE
    # Every turn but the last calls add once (its answer gates the call: waited for); the last answers.
    assert sent == [*(f"tool:call_{n}" for n in range(4)), "model"]
    messages = storage.messages("a1")
    assert [m["role"] for m in messages] == ["system", "user", *["assistant", "tool"] * 4, "assistant"]
    assert [json.loads(m["content"])["sum"] for m in messages if m["role"] == "tool"] == [1, 2, 3, 4]


def test_a_server_that_is_down_is_reported_as_for_any_write(redis_url: str) -> None:
    from pipelines.engine.errors import StorageUnavailableError
    from tests.redis_server import free_port

    down = RedisStorage.from_url(f"redis://127.0.0.1:{free_port()}", prefix="down", retries=0, connect_timeout=0.2)
    with pytest.raises(StorageUnavailableError):
        down.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value=1)
    assert not down.conn._deferred.waiting()
    down.close()


class _Intruder:
    """A model whose final answer arrives after another worker took the job's lease (its write is refused)."""

    def __init__(self, storage: RedisStorage) -> None:
        self.storage = storage

    def complete(self, request: Any) -> Any:
        from phases.model import ModelResponse
        from pipelines.engine.models import Usage

        lease = self.storage.keys(request.job_id).lease
        self.storage.client.set(lease, "intruder", px=30_000)  # taken over while the model was answering
        return ModelResponse(message={"role": "assistant", "content": "all done"}, finish_reason="stop",
                             usage=Usage(prompt_tokens=7, completion_tokens=3, model_calls=1), model="m")


def test_a_final_answer_refused_after_the_call_returned_is_counted_as_a_fenced_attempt(
        redis_url: str, storage: RedisStorage, sent: list[str]) -> None:
    from pipelines import AdvanceResult, Agent
    from pipelines.app import App

    scheduler = MemoryScheduler()
    agent = Agent(name="chat", model=_Intruder(storage))
    app = App(storage=storage, scheduler=scheduler, agents=[agent])
    agent.run(job_id="c1", messages=["hello"], storage=storage, scheduler=scheduler)
    assert app.try_advance("c1") is AdvanceResult.STALE  # the commit, behind the same fence, is refused
    assert sent == ["model"]  # the answer's write went out without its reply waited for
    job = storage.get_job("c1")
    assert job is not None and job.status is JobStatus.RUNNING and job.checkpoint is not None
    assert job.checkpoint.journal == {}  # nothing journaled, nothing committed
    # What the attempt paid is counted all the same, and the page can show what the model said.
    assert job.dropped.model_calls == 1 and job.dropped.prompt_tokens == 7
    kept = storage.fenced_answers("c1")
    assert len(kept) == 1 and kept[0]["answer"]["message"]["content"] == "all done"


def test_a_server_not_ready_for_the_library_check_has_the_write_sent_the_usual_way(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    fresh = RedisStorage.from_url(redis_url, prefix=storage.prefix)  # its first call on the server: a deferred one
    inner, asked = fresh.client.fcall, []

    def fcall(name: str, *args: Any) -> Any:
        if not asked:  # the library's check, answered as a server busy with a script answers
            asked.append(name)
            raise redis.ResponseError("BUSY Redis is busy running a script.")
        return inner(name, *args)

    fresh.client.fcall = fcall  # type: ignore[method-assign]
    fresh.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value="done")
    # Not sent deferred (nothing concluded from the BUSY answer): sent and waited for, by FCALL once checked.
    assert asked and not fresh.conn._deferred.waiting() and fresh.scripts.library.on
    assert _journal(redis_url, storage) == {**MODEL, "tool:c1": "done"}
    fresh.close()


# --- the commit sent right behind the journal write (Deferred.then) ----------------------------------
def _acting(msgs: list[dict[str, Any]]) -> Any:
    done = sum(1 for m in msgs if m["role"] == "assistant")
    return "done" if done >= 3 else reply(f"step {done}", call("act", n=done))


def _acting_app(storage: RedisStorage, sabotage: Any, ran: list[int]) -> Any:
    from pipelines import Agent, App, tool

    @tool
    def act(n: int) -> dict[str, int]:
        """Act once per call; the first call sabotages what follows it."""
        ran.append(n)
        if len(ran) == 1:
            sabotage()
        return {"acted": n}

    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="s", model=ScriptedModel(_acting), tools=[act], max_turns=10)])


def test_the_commit_goes_right_behind_the_journal_write_and_both_replies_are_read_after(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage, "warm")  # the thread's kept connection made
    conn = storage.conn._held._local.slot.conn  # type: ignore[union-attr]
    ops: list[str] = []
    send, read = conn.send_packed_command, conn.read_response

    def sending(packed: Any, *args: Any, **kwargs: Any) -> Any:
        wire = packed if isinstance(packed, bytes | str) else b"".join(packed)
        ops.append("send " + wire.split(b"\r\n")[4].decode())  # *N, $len, FCALL, $len, its name
        return send(packed, *args, **kwargs)

    def reading(*args: Any, **kwargs: Any) -> Any:
        ops.append("read")
        return read(*args, **kwargs)

    conn.send_packed_command, conn.read_response = sending, reading
    ran: list[int] = []
    app = _acting_app(storage, lambda: None, ran)
    app.run_agent("s", job_id="p1", messages=["go"])
    app.scheduler.drain()
    assert app.get("p1").status is JobStatus.COMPLETE and ran == [0, 1, 2]
    s = storage.scripts
    step, commit = f"send {s.step.name}", f"send {s.commit.name}"
    # Each turn: the model's answer waited for; its tool's result, then the commit, sent before either reply is read.
    behind = [i for i in range(len(ops) - 3) if ops[i:i + 4] == [step, commit, "read", "read"]]
    assert len(behind) == 4  # three tool turns and the final answer's turn


@pytest.mark.parametrize("how", ["flush functions", "flush scripts", "kill connections"])
def test_a_journal_write_and_the_commit_behind_it_that_did_not_run_are_run_again(
        redis_url: str, storage: RedisStorage, how: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    if how == "flush scripts":
        storage.scripts.library.on = False  # a server without functions: EVALSHA, NOSCRIPT when flushed
    sabotage = {
        "flush functions": admin.function_flush,  # a restarted server: FCALL answers "Function not found"
        "flush scripts": admin.script_flush,
        "kill connections": lambda: admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"),
    }[how]
    ran: list[int] = []
    app = _acting_app(storage, sabotage, ran)
    app.run_agent("s", job_id="p2", messages=["go"])
    app.scheduler.drain()
    admin.close()
    job = app.get("p2")
    assert job.status is JobStatus.COMPLETE and ran == [0, 1, 2]  # each tool ran once: the write went again
    tools = [json.loads(m["content"]) for m in app.messages("p2") if m["role"] == "tool"]
    assert tools == [{"acted": 0}, {"acted": 1}, {"acted": 2}]
    assert [m["role"] for m in app.messages("p2")] == ["user", *["assistant", "tool"] * 3, "assistant"]


def test_a_connection_lost_after_the_write_and_the_call_behind_it_went_has_both_run_again(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value={"sum": 4})
    conn = storage.conn._held._local.slot.conn  # type: ignore[union-attr]
    read, lost = conn.read_response, []

    def lose_first(*args: Any, **kwargs: Any) -> Any:
        if not lost:  # both went; the connection drops before either reply is read
            lost.append(True)
            raise redis.exceptions.ConnectionError("connection reset by peer")
        return read(*args, **kwargs)

    conn.read_response = lose_first
    try:
        loaded = storage.acquire_lease("j1", "w1", 30)  # a write of the turn's: it goes right behind the journal's
    finally:
        conn.read_response = read
    assert lost and loaded is not None and loaded.checkpoint is not None
    assert loaded.checkpoint.journal == {**MODEL, "tool:c1": {"sum": 4}}
    assert _journal(redis_url, storage) == {**MODEL, "tool:c1": {"sum": 4}}


def _fcalls(storage: RedisStorage) -> list[str]:
    """The FCALLs ``storage`` sends from now on, by function name (tests/redis_spy.py sees every way)."""
    from tests.redis_spy import spy_commands

    names: list[str] = []

    def spy(send: Any, *args: Any) -> Any:
        if str(args[0]).upper() == "FCALL":
            names.append(args[1].decode() if isinstance(args[1], bytes) else str(args[1]))
        return send(*args)

    spy_commands(storage, spy)
    return names


def test_a_connection_lost_after_the_write_and_the_commit_behind_it_ran_keeps_the_answer_as_committed(
        storage: RedisStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both ran; the connection drops before their replies are read. Run again, the write is refused (the commit
    # moved the version on) and the commit answers 'applied': the answer is the turn's, not a fenced-off one.
    from adapters.redis import deferred
    from pipelines import Agent, App

    real_read, real_then, armed, lost = deferred._read, Deferred.then, [], []

    def then(self: Deferred, *args: Any, **kwargs: Any) -> Any:
        armed.append(True)
        try:
            return real_then(self, *args, **kwargs)
        finally:
            armed.clear()

    def read(conn: Any) -> Any:
        if armed and not lost:
            lost.append(conn.read_response())  # the write's reply: the commit behind it runs meanwhile
            time.sleep(0.05)
            conn.disconnect()
            return deferred._Read(error=redis.exceptions.ConnectionError("connection reset by peer"))
        return real_read(conn)

    monkeypatch.setattr(Deferred, "then", then)
    monkeypatch.setattr(deferred, "_read", read)
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[Agent(name="chat", model=ScriptedModel(
        lambda msgs: "all done"))])
    app.run_agent("chat", job_id="c1", messages=["hello"])
    app.scheduler.drain()
    job = storage.get_job("c1")
    assert lost and job is not None and job.status is JobStatus.COMPLETE
    assert job.usage.model_calls == 1 and job.dropped.model_calls == 0
    assert storage.fenced_answers("c1") == []
    assert [m["content"] for m in storage.messages("c1")] == ["hello", "all done"]


def test_no_health_check_goes_between_the_write_and_the_commit_behind_it(redis_url: str) -> None:
    # redis-py's health check sends a PING before a command once its interval passed; behind an unread reply
    # it would read that reply as the PING's and the commit's as the write's.
    storage = RedisStorage.from_url(f"{redis_url}?health_check_interval=30&socket_timeout=2",
                                    prefix=f"d{uuid.uuid4().hex[:8]}")
    try:
        _job(storage)
        sent = _fcalls(storage)
        storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value={"sum": 4})
        conn = storage.conn._held._local.slot.conn  # type: ignore[union-attr]
        assert conn.health_check_interval == 30
        conn.next_health_check = 0  # the interval passed while the turn ran
        loaded = storage.acquire_lease("j1", "w1", 30)  # a write of the turn's: it goes right behind
        assert loaded is not None and loaded.checkpoint is not None
        assert loaded.checkpoint.journal == {**MODEL, "tool:c1": {"sum": 4}}
        assert sent == [storage.scripts.step.name, storage.scripts.load.name], "each sent once, read in order"
    finally:
        storage.close()


def test_a_storage_closed_by_another_thread_has_the_pending_write_run_again(
        redis_url: str, storage: RedisStorage) -> None:
    _job(storage)
    sent = _fcalls(storage)
    storage.record_step_before_commit("j1", version=1, owner="w1", key="tool:c1", value={"sum": 4})
    closer = threading.Thread(target=storage.close)  # a thread may outlive close(): its next call reconnects
    closer.start()
    closer.join()
    loaded = storage.acquire_lease("j1", "w1", 30)
    assert loaded is not None and loaded.checkpoint is not None
    assert loaded.checkpoint.journal == {**MODEL, "tool:c1": {"sum": 4}}
    # The write's reply went with the closed socket: the write runs again, then the call, each read in order.
    step, load = storage.scripts.step.name, storage.scripts.load.name
    assert sent == [step, step, load]
