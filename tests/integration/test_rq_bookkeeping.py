"""Our RQ workers send their own heartbeat and state only when it changes something (adapters.rq.bookkeeping).

Against a real redis-server: RQ's stock worker sends three standalone
heartbeats of three round trips each for every job it takes, and its "idle"
state twice; ours leave both to the suspension check RQ sends at the top of
every loop (its pipeline carries them), and keep the worker's keys and state
just as RQ would.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import Callback, Queue, SimpleWorker
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now

import adapters.rq.bookkeeping as bookkeeping
from adapters.rq.priority import PrioritySimpleWorker, PriorityWorker
from tests.redis_server import free_port

pytestmark = pytest.mark.redis


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(bookkeeping.time, "monotonic", c)
    return c


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Every round trip a client of this process sends (a pipeline is one), as its packed bytes."""
    trips: list[bytes] = []
    original = redis.connection.Connection.send_packed_command

    def send(self: Any, command: Any, check_health: bool = True) -> None:
        trips.append(command if isinstance(command, bytes) else b"".join(bytes(c) for c in command))
        original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", send)
    yield trips


def _beats(trips: list[bytes], worker: Any) -> list[bytes]:
    """The round trips holding the worker's heartbeat (``HSET <worker key> last_heartbeat ...``)."""
    key = worker.key.encode()
    return [t for t in trips if b"HSET\r\n$%d\r\n%s\r\n$14\r\nlast_heartbeat" % (len(key), key) in t]


def _worker(r: redis.Redis, cls: type[Any] = PrioritySimpleWorker) -> Any:
    worker = cls([Queue("beat", connection=r, serializer=JSONSerializer)], connection=r, serializer=JSONSerializer)
    r.ping()  # the connection's own set-up is not the heartbeat's
    return worker


@pytest.mark.parametrize("cls", [PrioritySimpleWorker, PriorityWorker])
def test_a_heartbeat_is_one_round_trip_and_one_that_moves_nothing_is_not_sent(
        r: redis.Redis, cls: type[Any], clock: Clock, sent: list[bytes]) -> None:
    worker = _worker(r, cls)
    sent.clear()
    worker.heartbeat()
    assert len(sent) == 1 and sent[0].count(b"EXPIRE") == 2, "the HSET and both EXPIREs go in one round trip"
    assert worker.worker_ttl + 55 <= r.ttl(worker.key) <= worker.worker_ttl + 60
    assert r.hget(worker.key, "last_heartbeat")
    for _ in range(20):
        clock.now += 0.04
        worker.heartbeat()
    assert len(_beats(sent, worker)) == 1, "heartbeats within a second of the last move its expiry by less than that"
    clock.now += 0.5
    worker.heartbeat()
    assert len(_beats(sent, worker)) == 2, "one that moves the expiry by more than the slack is sent"
    worker.heartbeat(timeout=worker.worker_ttl + 600)
    assert len(_beats(sent, worker)) == 3, "a longer expiry goes out at once"
    assert r.ttl(worker.key) > worker.worker_ttl + 500


def test_a_shorter_expiry_set_in_a_pipeline_is_not_forgotten(r: redis.Redis, clock: Clock,
                                                              sent: list[bytes]) -> None:
    """RQ sets a job's shorter heartbeat TTL in a pipeline of its own: the next standalone one restores the long one."""
    worker = _worker(r)
    worker.heartbeat()
    with r.pipeline() as pipe:
        worker.heartbeat(90, pipeline=pipe)
        pipe.execute()
    assert len(_beats(sent, worker)) == 2, "a heartbeat RQ adds to its pipeline is always added"
    assert r.ttl(worker.key) <= 90
    clock.now += 0.1
    worker.heartbeat()
    assert len(_beats(sent, worker)) == 3 and r.ttl(worker.key) > worker.worker_ttl
    with r.pipeline() as pipe:
        worker.heartbeat(pipeline=pipe)  # the suspension check's: as long as the last one
        pipe.execute()
    clock.now += 0.1
    worker.heartbeat()
    assert len(_beats(sent, worker)) == 4, "a pipelined one as long as the last does not make the next one go out"


@pytest.mark.parametrize("cls", [SimpleWorker, PrioritySimpleWorker, PriorityWorker])
def test_a_busy_worker_sends_no_heartbeat_of_its_own_a_take(r: redis.Redis, sent: list[bytes], cls: type[Any]) -> None:
    """RQ's stock worker sends three a take; ours leaves each to the suspension check's pipeline, which RQ sends too."""
    q = Queue("beat", connection=r, serializer=JSONSerializer)
    jobs = [q.enqueue("os.getpid") for _ in range(15)]
    worker = _worker(r, cls)
    sent.clear()
    worker.work(burst=True)
    assert all(j.get_status(refresh=True) == "finished" for j in jobs)
    # RQ's own pipelines (its suspension check, a job's start) are transactions; standalone heartbeats are not.
    beats = _beats(sent, worker)
    standalone = [t for t in beats if not t.startswith(b"*1\r\n$5\r\nMULTI")]
    checks = [t for t in beats if b"rq:suspended" in t]
    assert len(checks) >= len(jobs), "RQ's suspension check carries a heartbeat at the top of every loop"
    if cls is SimpleWorker:
        assert len(standalone) >= 3 * len(jobs), "what the count is against"
    else:
        assert len(standalone) <= 1, len(standalone)


def test_after_a_job_a_failed_suspension_check_leaves_the_heartbeat_to_the_dequeue(r: redis.Redis, clock: Clock,
                                                                                   sent: list[bytes]) -> None:
    """The heartbeat right after a job is left to the suspension check; if that fails, the next one goes out."""
    worker = _worker(r)
    worker.heartbeat()
    worker._after_job, worker._beat_until = True, 0.0  # what execute_job leaves
    worker.heartbeat()  # the loop's, right after the job: left to the check
    assert len(_beats(sent, worker)) == 1
    worker.connection = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    worker.check_for_suspension(burst=False)  # refused: RidesOutOutages logs it and goes on
    worker.connection = r
    clock.now += 0.1
    worker.heartbeat()  # the one before the dequeue
    assert len(_beats(sent, worker)) == 2 and r.ttl(worker.key) > worker.worker_ttl
    worker.check_for_suspension(burst=False)  # goes out, with a heartbeat in its pipeline
    assert len(_beats(sent, worker)) == 3
    clock.now += 0.1
    worker.heartbeat()
    assert len(_beats(sent, worker)) == 3, "the check's heartbeat counts as sent"


@pytest.mark.parametrize("cls", [PrioritySimpleWorker, PriorityWorker])
def test_after_a_take_the_worker_key_lives_as_long_as_rq_would_keep_it(r: redis.Redis, cls: type[Any]) -> None:
    """A job's start shortens the worker key's expiry (in the work-horse, for a forking worker): restored after it."""
    q = Queue("beat", connection=r, serializer=JSONSerializer)
    jobs = [q.enqueue("os.getpid") for _ in range(3)]
    worker = _worker(r, cls)
    worker.register_death = lambda: None  # keep the key to look at after the burst
    worker.work(burst=True)
    assert all(j.get_status(refresh=True) == "finished" for j in jobs)
    assert r.ttl(worker.key) > worker.worker_ttl, "back to RQ's idle expiry, not the job's 90 s"


def _states(trips: list[bytes], worker: Any) -> list[bytes]:
    """The standalone round trips setting the worker's state (``HSET <worker key> state ...``, no pipeline)."""
    key = worker.key.encode()
    return [t for t in trips if t.startswith(b"*4\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n$5\r\nstate\r\n" % (len(key), key))]


def test_a_state_already_written_is_not_written_again(r: redis.Redis, sent: list[bytes]) -> None:
    worker = _worker(r)
    worker.set_state("idle")
    worker.set_state("idle")
    assert len(_states(sent, worker)) == 1 and r.hget(worker.key, "state") == b"idle"
    with r.pipeline() as pipe:
        worker.set_state("busy", pipeline=pipe)
        pipe.execute()
    assert worker.get_state() == "busy"
    worker.set_state("idle")
    assert len(_states(sent, worker)) == 2, "after a state set in a pipeline, the next one is sent"
    assert r.hget(worker.key, "state") == b"idle" and worker.get_state() == "idle"
    worker.set_state("idle")
    assert len(_states(sent, worker)) == 2


def test_a_state_whose_write_failed_is_written_again(r: redis.Redis) -> None:
    worker = _worker(r)
    # Nothing listens there, and redis-py is told not to retry.
    worker.connection = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.ConnectionError):
        worker.set_state("idle")
    worker.connection = r
    worker.set_state("idle")
    assert r.hget(worker.key, "state") == b"idle"


@pytest.mark.parametrize("cls", [SimpleWorker, PrioritySimpleWorker, PriorityWorker])
def test_a_busy_worker_writes_idle_with_its_suspension_check(r: redis.Redis, sent: list[bytes], cls: type[Any]) -> None:
    """RQ's stock worker writes "idle" when a job ends and again before its next dequeue, a round trip each;
    ours writes it in the suspension check's pipeline that comes next, and ends idle all the same."""
    q = Queue("beat", connection=r, serializer=JSONSerializer)
    jobs = [q.enqueue("os.getpid") for _ in range(15)]
    worker = _worker(r, cls)
    worker.register_death = lambda: None  # keep the worker's hash to look at after the burst
    sent.clear()
    worker.work(burst=True)
    assert all(j.get_status(refresh=True) == "finished" for j in jobs)
    states = _states(sent, worker)
    if cls is SimpleWorker:
        assert len(states) >= 2 * len(jobs), "what the count is against"
    else:
        assert len(states) <= 3, len(states)  # "started", and the first "idle" before any job
        key = worker.key.encode()
        idle = b"HSET\r\n$%d\r\n%s\r\n$5\r\nstate\r\n$4\r\nidle" % (len(key), key)
        carried = [t for t in sent if b"rq:suspended" in t and idle in t]
        assert len(carried) >= len(jobs), len(carried)
    assert r.hget(worker.key, "state") == b"idle"


def test_a_failed_suspension_check_leaves_idle_to_the_dequeue(r: redis.Redis, sent: list[bytes]) -> None:
    worker = _worker(r)
    worker.set_state("busy")
    worker._job_ran = True  # what perform_job leaves
    worker.set_state("idle")  # RQ's, as the job ends: left to the check
    assert len(_states(sent, worker)) == 1 and r.hget(worker.key, "state") == b"busy"
    assert worker.get_state() == "idle"
    worker.connection = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    worker.check_for_suspension(burst=False)  # refused: RidesOutOutages logs it and goes on
    worker.connection = r
    worker.set_state("idle")  # the dequeue's
    assert len(_states(sent, worker)) == 2 and r.hget(worker.key, "state") == b"idle"


def _job_beats(trips: list[bytes], job_id: str) -> list[bytes]:
    """The standalone round trips writing a job's heartbeat (``HSET rq:job:<id> last_heartbeat``, no pipeline)."""
    key = f"rq:job:{job_id}".encode()
    beat = b"HSET\r\n$%d\r\n%s\r\n$14\r\nlast_heartbeat" % (len(key), key)
    return [t for t in trips if t.startswith(b"*4\r\n$4\r\nHSET") and beat in t]


def _says_hi(job: Any, connection: Any, result: Any) -> None:  # a success callback (RQ imports it by name)
    connection.set(f"hi:{job.id}", "1")


@pytest.mark.parametrize("cls", [SimpleWorker, PrioritySimpleWorker])
def test_a_job_without_callbacks_has_its_ending_heartbeat_written_with_its_end(
        r: redis.Redis, sent: list[bytes], cls: type[Any]) -> None:
    """RQ writes a job's heartbeat as its work ends (a round trip), then saves the job; ours, for a job with no
    callback to keep alive meanwhile, only saves it: the same heartbeat, a round trip fewer a job."""
    q = Queue("beat", connection=r, serializer=JSONSerializer)
    plain = [q.enqueue("os.getpid") for _ in range(5)]
    failing = q.enqueue("os.path.join")  # called without arguments: it raises
    called = q.enqueue("os.getpid", on_success=Callback(f"{__name__}._says_hi"))
    worker = _worker(r, cls)
    sent.clear()
    started = rq_now()
    worker.work(burst=True)
    assert [j.get_status(refresh=True) for j in plain] == ["finished"] * 5
    assert failing.get_status(refresh=True) == "failed" and called.get_status(refresh=True) == "finished"
    assert r.get(f"hi:{called.id}") == b"1"
    for job in [*plain, failing, called]:
        job.refresh()
        # The heartbeat of its end is stored, whichever way: not the one its start wrote.
        assert job.ended_at is not None and job.ended_at >= started.replace(microsecond=0)
        assert job.last_heartbeat is not None and job.last_heartbeat >= job.ended_at
    beats = {j.id: len(_job_beats(sent, j.id)) for j in [*plain, failing, called]}
    if cls is SimpleWorker:
        assert set(beats.values()) == {1}, "what the count is against"
    else:
        assert beats[called.id] == 1, "a job with a callback keeps RQ's heartbeat before it"
        assert all(beats[j.id] == 0 for j in [*plain, failing]), beats


@pytest.mark.parametrize("cls", [SimpleWorker, PrioritySimpleWorker])
def test_a_job_naming_a_callback_that_cannot_be_imported_fails_and_the_worker_goes_on(
        r: redis.Redis, cls: type[Any]) -> None:
    """RQ fails such a job where it handles a callback's errors; ours must not meet the import earlier, outside
    that handling (it stopped a worker running jobs in its own process, the job left started)."""
    q = Queue("beat", connection=r, serializer=JSONSerializer)
    broken = q.enqueue("os.path.join", on_failure=Callback("no_such_module_here.handler"))  # fails, then its callback
    behind = q.enqueue("os.getpid")
    _worker(r, cls).work(burst=True)
    assert broken.get_status(refresh=True) == "failed"
    assert behind.get_status(refresh=True) == "finished" and q.count == 0
