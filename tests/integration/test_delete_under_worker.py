"""Issue 30 (14): a job deleted under a running worker leaves nothing behind, on memory and on a real Redis.

A job's records live and die together. The worker does not know its job is
gone: it goes on with its turn and then publishes text deltas, journals the
model's answer, writes large values to the blob store and commits. None of
that may bring back a key, a blob or an index entry of the deleted job, and
no later sweep may report it as unknown.

The delete is the storage's own (``app.delete`` refuses a running job): what
a person deleting keys, an operator's script, or the delete of a job that
another worker finished while this one was stale would do.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from adapters.blobs import MemoryBlobStore, RedisBlobStore
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.offload import OffloadingStorage
from adapters.redis import RedisStorage
from pipelines import Agent, App, tool
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply

JOB = "doomed"
BIG = "r" * (100 * 1024)  # over the 64 KiB threshold: a value the offloading storage sends to the blob store


class Gate:
    """Holds the worker at one point of its turn while the test deletes the job."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.go.wait(10), "the test never let the worker go on"


class Backend:
    def __init__(self, storage: Any, blobs: Any, leftovers: Any) -> None:
        self.storage, self.blobs, self.leftovers = storage, blobs, leftovers


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        storage, blobs = MemoryStorage(), MemoryBlobStore()

        def memory_leftovers() -> list[str]:
            found = [f"{what}" for what, there in [
                ("record", storage.inspect(JOB)), ("due", JOB in storage.due_jobs(1e12)),
                ("listed", storage.count_jobs()), ("live", storage.read_live(JOB)), ("events", storage.events(JOB)),
                ("logs", storage.logs(JOB)), ("messages", storage.messages(JOB)), ("inbox", storage.inbox(JOB, 10)),
                ("blobs", list(blobs.job_ids()))] if there]
            return found

        yield Backend(storage, blobs, memory_leftovers)
        return
    request.applymarker(pytest.mark.redis)
    prefix = f"du{uuid.uuid4().hex[:8]}"
    url = request.getfixturevalue("redis_url")
    storage = RedisStorage.from_url(url, prefix=prefix)
    r = redis.Redis.from_url(url)

    def redis_leftovers() -> list[str]:
        found = [k.decode() for k in r.scan_iter(match=f"{prefix}:*{JOB}*")]
        for key in r.scan_iter(match=f"{prefix}:*"):  # an index entry naming the job
            kind = r.type(key).decode()
            if (kind == "zset" and r.zscore(key, JOB) is not None) or (kind == "set" and r.sismember(key, JOB)):
                found.append(f"{key.decode()} names {JOB}")
        return sorted(found)

    yield Backend(storage, RedisBlobStore(storage.client, prefix=prefix), redis_leftovers)
    storage.close()
    r.close()


def make_app(backend: Backend, gate: Gate, where: str, *, offload: bool) -> App:
    @tool
    def fetch(n: int) -> str:
        """Fetch a large page."""
        if where == "tool":
            gate.hold()
        return BIG

    def answer(messages: list[dict[str, Any]]) -> Any:
        if where == "model":
            gate.hold()
        # A long answer: streamed as text deltas, journaled (offloaded when large) before the tool runs.
        return reply(("thinking " * 40) + (BIG if offload else ""), call("fetch", n=1))

    storage = OffloadingStorage(backend.storage, backend.blobs) if offload else backend.storage
    return App(storage=storage, scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)), provenance=False,
               agents=[Agent(name="bot", model=ScriptedModel(answer), tools=[fetch])])


@pytest.mark.parametrize("offload", [False, True], ids=["inline", "offloaded"])
@pytest.mark.parametrize("where", ["model", "tool"])
def test_a_job_deleted_mid_turn_leaves_nothing_behind(backend: Backend, where: str, offload: bool) -> None:
    gate = Gate()
    app = make_app(backend, gate, where, offload=offload)
    app.run_agent("bot", job_id=JOB, messages=["read the page", "and sum it up"])
    assert backend.leftovers()  # the fixture's view sees a live job
    app.send(JOB, ["one more thing"])  # something in its inbox too
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(app.advance(JOB)))
    worker.start()
    assert gate.entered.wait(10)
    assert backend.storage.delete_job(JOB) is True
    if offload:
        backend.blobs.delete_job(JOB)  # what OffloadingStorage.delete_job does after the record
    gate.go.set()
    worker.join(10)
    assert done and done[0] is AdvanceResult.STALE  # the worker found out at its next write, and stopped
    assert backend.leftovers() == []
    assert app.advance_due(grace=-1e9) == []  # nothing due, nothing reported unknown
    assert backend.leftovers() == []
