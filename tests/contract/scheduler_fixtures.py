"""Schedulers under the contract suite, each wrapped in a harness that drives its work the same way.

A harness owns an :class:`~pipelines.app.App` on a scheduler and a storage of
the same kind, with one two-turn pipeline ``"p"`` (``a`` then ``b``) that
counts how often each phase ran. It records every delivery (an advance the
scheduler's work actually called) with the scheduler's clock at that moment,
and the raw message each delivery came from, so a test can check what the
queue carried. A new scheduler joins with one harness class and one entry in
``HARNESSES``.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from adapters.base import Scheduler
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import App, Done, Next, Phase, PhaseContext
from pipelines.engine.runner import AdvanceResult


@dataclass(frozen=True)
class Delivery:
    """One advance the scheduler's work ran: which job, and when by the scheduler's clock."""

    job_id: str
    at: float


class Harness:
    """What the contract tests need from a scheduler, beyond the port itself."""

    name = ""
    delay = 0.0
    """A delay short enough for the suite, long enough for the scheduler's precision."""
    margin = 0.0
    """How long before the earliest allowed delivery the suite checks that nothing came yet."""
    late = 0.0
    """How long after its time a delayed delivery may come (a scheduler of whole seconds rounds up)."""

    def __init__(self, scheduler: Scheduler, app_factory: Callable[[Scheduler], App]) -> None:
        self.runs: Counter[tuple[str, str]] = Counter()  # (job id, phase) -> executions
        self.deliveries: list[Delivery] = []
        self.scheduler = scheduler
        self.app = app_factory(scheduler)

    def pipeline(self) -> list[Phase]:
        """The two-turn pipeline every test runs; each phase counts its executions."""

        def a(ctx: PhaseContext[Any]) -> Next:
            self.runs[(ctx.job_id, "a")] += 1
            return Next("b", state={"n": 1})

        def b(ctx: PhaseContext[Any]) -> Done:
            self.runs[(ctx.job_id, "b")] += 1
            return Done(result={"n": ctx.state["n"] + 1})

        return [Phase("a", a), Phase("b", b)]

    def _advance(self, job_id: str) -> AdvanceResult:
        self.deliveries.append(Delivery(job_id, self.scheduler.now()))
        return self.app.advance(job_id)

    # --- what each scheduler implements -------------------------------------------------
    def run_due(self) -> None:
        """Run every advance due now, without moving the clock."""
        raise NotImplementedError

    def run_all(self) -> None:
        """Run every advance that is ready, and what those schedule in turn (memory: whatever the delay)."""
        raise NotImplementedError

    def wait_until(self, t: float) -> None:
        """Let the scheduler's clock reach ``t``."""
        raise NotImplementedError

    def lose_messages(self) -> int:
        """Throw away every message waiting in the queue (a crash, a flushed queue); returns how many."""
        raise NotImplementedError

    def wire(self) -> list[bytes]:
        """The raw bytes of every message delivered so far, as they crossed the queue."""
        raise NotImplementedError

    def queued(self, name: str) -> int:
        """How many messages wait in the broker's queue called ``name`` (a scheduler with named queues)."""
        raise NotImplementedError


class MemoryHarness(Harness):
    """MemoryScheduler on a virtual clock, attached to the App; ``drain()`` runs its work."""

    name = "memory"
    delay = 30.0
    margin = 0.5

    def __init__(self) -> None:
        self.clock = VirtualClock(start=1_000_000.0)
        self._wire: list[bytes] = []
        self.memory = MemoryScheduler(clock=self.clock)
        storage = MemoryStorage(clock=self.clock)
        super().__init__(self.memory, lambda s: App(storage=storage, scheduler=s, pipelines={"p": self.pipeline()}))
        # The App attached its own advance; ours records each delivery, then calls it.
        self.memory.attach(self._deliver)

    def _deliver(self, *args: Any) -> AdvanceResult:
        # What an in-process scheduler hands over is its message: it must be JSON as it stands.
        self._wire.append(json.dumps(list(args), allow_nan=False).encode())
        (job_id,) = args
        return self._advance(job_id)

    def run_due(self) -> None:
        self.memory.run_due()

    def run_all(self) -> None:
        self.memory.drain()

    def wait_until(self, t: float) -> None:
        self.clock.advance_to(t)

    def lose_messages(self) -> int:
        return self.memory.drop_all()

    def wire(self) -> list[bytes]:
        return list(self._wire)


class LocalHarness(Harness):
    """LocalScheduler on a real SQLite file, no worker threads: its requests run in the test's thread.

    ``run_due`` / ``run_all`` are its ``run_due()`` / ``drain()`` (real time); the worker threads and
    the storage poller are tested in tests/integration/test_local_scheduler.py.
    """

    name = "local"
    delay = 1.0
    margin = 0.2

    def __init__(self, tmp_path: Any) -> None:
        from adapters.local import LocalScheduler
        from adapters.sqlite import SQLiteStorage

        self.storage = SQLiteStorage(str(tmp_path / "local.db"))
        self.local = LocalScheduler(workers=0)
        self._wire: list[bytes] = []
        super().__init__(self.local,
                         lambda s: App(storage=self.storage, scheduler=s, pipelines={"p": self.pipeline()}))
        self.local.attach(self._deliver)  # ours records each delivery, then calls the App's advance

    def _deliver(self, *args: Any) -> AdvanceResult:
        self._wire.append(json.dumps(list(args), allow_nan=False).encode())
        (job_id,) = args
        return self._advance(job_id)

    def run_due(self) -> None:
        self.local.run_due()

    def run_all(self) -> None:
        self.local.drain()

    def wait_until(self, t: float) -> None:
        while (left := t - self.scheduler.now()) > 0:
            time.sleep(min(left, 0.05))

    def lose_messages(self) -> int:
        return self.local.drop_all()

    def wire(self) -> list[bytes]:
        return list(self._wire)

    def close(self) -> None:
        self.storage.close()


class RQHarness(Harness):
    """RQScheduler on a real Redis, its work run by an in-process SimpleWorker (burst, JSON serializer)."""

    name = "rq"
    delay = 3.0  # RQ's scheduler has whole-second resolution (precision 1.0)
    margin = 1.0  # a worker's start-up under load must not reach the scheduled second
    late = 1.0  # sent for the whole second at or after its time, never before it

    def __init__(self, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from adapters.redis import RedisStorage
        from adapters.rq import RQScheduler
        from pipelines import worker

        self.storage = RedisStorage.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:10]}")
        self.rq = RQScheduler.for_storage(self.storage, queue=f"q{uuid.uuid4().hex[:10]}", job_timeout=60)
        self._rq_ids: list[str] = []
        super().__init__(self.rq, lambda s: App(storage=self.storage, scheduler=s, pipelines={"p": self.pipeline()}))
        # The worker finds the App through use_app (the payload names no app); ours records each delivery.
        worker.forget_apps()
        worker.use_app(self.app)
        monkeypatch.setattr(self.app, "advance", self._recorded(self.app.advance))

    def _recorded(self, advance: Callable[[str], AdvanceResult]) -> Callable[[str], AdvanceResult]:
        from rq import get_current_job

        def run(job_id: str) -> AdvanceResult:
            current = get_current_job()
            assert current is not None, "an advance ran outside an RQ job"
            self._rq_ids.append(current.id)
            self.deliveries.append(Delivery(job_id, self.scheduler.now()))
            return advance(job_id)

        return run

    def _work(self) -> None:
        from rq.serializers import JSONSerializer

        from tests.rq_workers import BurstWorker

        # Every priority queue, highest first, as `pipelines worker` listens.
        queues = list(self.rq.queues.values())
        w = BurstWorker(queues, connection=self.rq.connection, serializer=JSONSerializer)
        # with_scheduler in burst mode moves what is due from the scheduled registry to the queue first.
        w.work(burst=True, with_scheduler=True, logging_level="WARNING")

    def run_due(self) -> None:
        self._work()

    def run_all(self) -> None:
        self._work()

    def wait_until(self, t: float) -> None:
        while (left := t - self.scheduler.now()) > 0:
            time.sleep(min(left, 0.05))

    def lose_messages(self) -> int:
        from rq.registry import ScheduledJobRegistry

        ids = []
        for queue in self.rq.queues.values():
            registry = ScheduledJobRegistry(queue=queue)  # type: ignore[no-untyped-call]
            ids += [*queue.get_job_ids(), *registry.get_job_ids()]
        for rq_id in ids:
            self.rq.fetch(rq_id).delete()  # the hash, its queue entry and its registry entry
        return len(ids)

    def queued(self, name: str) -> int:
        return int(self.storage.client.llen(f"rq:queue:{name}"))  # RQ's list of a queue, read beside RQ

    def wire(self) -> list[bytes]:
        out = []
        for rq_id in self._rq_ids:
            data = self.storage.client.hget(f"rq:job:{rq_id}", "data")
            assert isinstance(data, bytes), f"no RQ job hash for {rq_id}"
            out.append(zlib.decompress(data))  # RQ compresses the payload; inside is the serializer's output
        return out

    def close(self) -> None:
        from pipelines import worker

        worker.forget_apps()
        self.storage.close()


class CeleryHarness(Harness):
    """CeleryScheduler on a real Redis broker; its work is run burst-style in this process.

    ``_work`` takes each message off the broker's queue (the Redis list kombu
    writes), keeps back those whose ``eta`` is still ahead, and runs the rest
    through the registered Celery task (``Task.apply`` with the message's id,
    args and kwargs, decoded from the JSON body that crossed the broker).
    Real ``celery worker`` processes run in tests/system/test_celery_workers.py.
    """

    name = "celery"
    delay = 2.0  # countdown becomes an ISO eta (sub-second), precision 0.5
    margin = 0.5

    def __init__(self, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from adapters.celery import CeleryScheduler
        from adapters.redis import RedisStorage
        from pipelines import worker
        from tests.apps.celery_app import make_celery

        self.storage = RedisStorage.from_url(redis_url, prefix=f"t{uuid.uuid4().hex[:10]}")
        self.celery = make_celery(redis_url, main=f"contract-{uuid.uuid4().hex[:6]}")
        self.queue = f"q{uuid.uuid4().hex[:10]}"
        self.celery_scheduler = CeleryScheduler.for_storage(self.celery, self.storage, queue=self.queue)
        self._wire: list[bytes] = []
        self._body = b""
        super().__init__(self.celery_scheduler,
                         lambda s: App(storage=self.storage, scheduler=s, pipelines={"p": self.pipeline()}))
        worker.forget_apps()
        worker.use_app(self.app)  # the messages name no app: the task body finds this one
        monkeypatch.setattr(self.app, "advance", self._recorded(self.app.advance))

    def _recorded(self, advance: Callable[[str], AdvanceResult]) -> Callable[[str], AdvanceResult]:
        def run(job_id: str) -> AdvanceResult:
            self._wire.append(self._body)
            self.deliveries.append(Delivery(job_id, self.scheduler.now()))
            return advance(job_id)

        return run

    def _work(self) -> None:
        # Priority order, as a worker's -Q lists them; again while a turn sent more work (to either queue).
        while sum([self._work_queue(queue) for queue in (self.queue, f"{self.queue}-background")]):
            pass

    def _work_queue(self, queue: str) -> int:
        import base64
        from datetime import datetime

        client = self.storage.client
        held: list[bytes] = []
        ran = 0
        while (raw := client.rpop(queue)) is not None:  # kombu LPUSHes: RPOP takes the oldest
            envelope = json.loads(raw)
            headers = envelope["headers"]
            if headers.get("eta") and datetime.fromisoformat(headers["eta"]).timestamp() > self.scheduler.now():
                held.append(raw)  # a worker would hold it until its eta
                continue
            self._body = base64.b64decode(envelope["body"])
            args, kwargs, _embed = json.loads(self._body)
            self.celery.tasks[headers["task"]].apply(args=args, kwargs=kwargs, task_id=headers["id"], throw=True)
            ran += 1
        if held:
            client.rpush(queue, *held)
        return ran

    def run_due(self) -> None:
        self._work()

    def run_all(self) -> None:
        self._work()

    def wait_until(self, t: float) -> None:
        while (left := t - self.scheduler.now()) > 0:
            time.sleep(min(left, 0.05))

    def lose_messages(self) -> int:
        client = self.storage.client
        queues = (self.queue, f"{self.queue}-background")
        lost = sum(int(client.llen(q)) for q in queues)
        client.delete(*queues)
        return lost

    def wire(self) -> list[bytes]:
        return list(self._wire)

    def queued(self, name: str) -> int:
        return int(self.storage.client.llen(name))  # kombu's list of a queue on the Redis broker

    def close(self) -> None:
        from pipelines import worker

        worker.forget_apps()
        self.storage.close()


def _memory(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield MemoryHarness()


def _local(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = LocalHarness(request.getfixturevalue("tmp_path"))
    yield harness
    harness.close()


def _rq(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = RQHarness(request.getfixturevalue("redis_url"), request.getfixturevalue("monkeypatch"))
    yield harness
    harness.close()


def _celery(request: pytest.FixtureRequest) -> Iterator[Harness]:
    pytest.importorskip("celery", reason="the celery extra is not installed (pip install phaserunner[celery])")
    harness = CeleryHarness(request.getfixturevalue("redis_url"), request.getfixturevalue("monkeypatch"))
    yield harness
    harness.close()


HARNESSES: dict[str, Callable[[pytest.FixtureRequest], Iterator[Harness]]] = {
    "memory": _memory, "local": _local, "rq": _rq, "celery": _celery}

PARAMS = [pytest.param("memory"), pytest.param("local"), pytest.param("rq", marks=pytest.mark.redis),
          pytest.param("celery", marks=pytest.mark.redis)]
"""The fixture's parameters: the RQ entry needs a real redis-server (tests/conftest.py checks for it)."""
