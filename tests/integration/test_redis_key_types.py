"""Wrong Redis key types never half-apply a script (issue item 6).

Every script checks the type of every key it would write (or read before a
write) and refuses with CorruptRecordError naming the key and the type found,
with nothing written. The class is tested, not one case: every script x
every key role it checks x every wrong Redis type, each compared with a
snapshot of the whole database (every key's type, encoding and contents) before and after.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage
from adapters.redis.scripts import INDEX_ROLES
from pipelines import JobStatus
from pipelines.engine.errors import CorruptRecordError
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, LogEntry, Usage

pytestmark = pytest.mark.redis

PREFIX = "kt"
JOB = "job-1"


def record(job_id: str = JOB, *, version: int = 1, due_at: float = 100.0) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={"n": version}, version=version, due_at=due_at)
    return JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=version)


def a_commit(storage: RedisStorage) -> Commit:
    """A worker's commit that writes every key a commit can write (messages, logs, events, due, journal, lease)."""
    rec = storage.get_job(JOB)
    assert rec is not None
    return Commit(job_id=JOB, expected_version=rec.version, owner="w1", token=uuid.uuid4().hex,
                  record=record(version=rec.version + 1, due_at=200.0),
                  append_messages=[{"role": "assistant", "content": "hi"}],
                  logs=[LogEntry(timestamp=1.0, phase="a", message="turn")],
                  events=[Event(timestamp=1.0, type="turn_started")])


# --- setups: a job in the state each script expects ----------------------------
def running_job(storage: RedisStorage) -> None:
    """Job 1 with messages, logs, events, a journal entry and w1's lease; another job fills the indexes."""
    storage.create_job(record("other"), messages=[{"role": "user", "content": "x"}])
    storage.create_job(record(), messages=[{"role": "user", "content": "hello"}],
                       logs=[LogEntry(timestamp=0.0, phase="a", message="created")],
                       events=[Event(timestamp=0.0, type="job_started")])
    assert storage.acquire_lease(JOB, "w1", 60) is not None
    storage.record_step(JOB, version=1, owner="w1", key="model", value={"ok": True})


def running_job_before_st(storage: RedisStorage) -> None:
    running_job(storage)
    storage.client.hdel(storage.keys(JOB).record, "st")


def finished_job(storage: RedisStorage) -> None:
    """Job 1 finished with its events still in their stream (a storage that does not archive wrote it)."""
    plain = RedisStorage(storage.client, prefix=storage.prefix, archive_events=False)
    running_job(plain)
    rec = plain.get_job(JOB)
    assert rec is not None
    done = rec.model_copy(update={"status": JobStatus.COMPLETE, "checkpoint": None, "version": rec.version + 1})
    plain.commit(Commit(job_id=JOB, expected_version=rec.version, owner="w1", token=uuid.uuid4().hex, record=done,
                        events=[Event(timestamp=2.0, type="job_finished")]))


def only_other_job(storage: RedisStorage) -> None:
    storage.create_job(record("other"))


def record_deleted_by_hand(storage: RedisStorage) -> None:
    running_job(storage)
    storage.client.delete(storage.keys(JOB).record)


# --- the planted wrong types -----------------------------------------------------
PLANT: dict[str, Callable[[redis.Redis, str], Any]] = {
    "string": lambda r, k: r.set(k, "planted"),
    "list": lambda r, k: r.rpush(k, "planted"),
    "hash": lambda r, k: r.hset(k, "planted", "1"),
    "set": lambda r, k: r.sadd(k, "planted"),
    "zset": lambda r, k: r.zadd(k, {"planted": 1.0}),
    "stream": lambda r, k: r.xadd(k, {"planted": "1"}),
}
EXPECTED = {"record": "hash", "messages": "list", "logs": "list", "journal": "hash", "lease": "string",
            "events": "stream", "due": "zset", "jobs": "set", "live": "stream", "finished": "zset", "inbox": "list",
            **{role: "zset" for role in INDEX_ROLES}}
# The listing indexes every writing script checks: all jobs, the status written, and one it is not.
LISTING = ("updated", "status_running", "status_idle")

Action = Callable[[RedisStorage], Any]
# script -> (setup, action, the key roles the script checks)
SCRIPTS: dict[str, tuple[Callable[[RedisStorage], None], Action, tuple[str, ...]]] = {
    "CREATE": (only_other_job, lambda s: s.create_job(record()), ("record", "due", "jobs", "finished", *LISTING)),
    # A commit touches the status index the job is in (the record's 'st') and the one it enters; a
    # record written before 'st' existed has every index touched, so checked.
    "COMMIT": (running_job, lambda s: s.commit(COMMITS[s]),
               ("record", "messages", "logs", "journal", "lease", "events", "due", "live", "finished", "inbox",
                "updated", "status_running")),
    "COMMIT(record before st)": (running_job_before_st, lambda s: s.commit(COMMITS[s]), LISTING),
    "RECORD_STEP": (running_job, lambda s: s.record_step(JOB, version=1, owner="w1", key="tool:1", value=1),
                    ("record", "journal", "lease")),
    "RECORD_STEP(with parts)": (running_job, lambda s: s.record_step_and_publish(
        JOB, version=1, owner="w1", key="tool:1", value=1,
        parts=[Event(timestamp=1.0, type="text_delta", data={"text": "x"})]), ("record", "journal", "lease", "live")),
    "EVENTS": (running_job, lambda s: s.events(JOB), ("record", "events")),
    "ARCHIVE": (finished_job, lambda s: s.archive_events(JOB), ("record", "events", "finished")),
    "LOAD(acquire_lease)": (running_job, lambda s: s.acquire_lease(JOB, "w1", 30), ("record", "journal", "lease")),
    "LOAD(get_job)": (running_job, lambda s: s.get_job(JOB), ("record", "journal")),
    "LOAD(unknown job)": (record_deleted_by_hand, lambda s: s.get_job(JOB), ("due", "jobs")),
    "RENEW": (running_job, lambda s: s.renew_lease(JOB, "w1", 30), ("lease",)),
    "RELEASE": (running_job, lambda s: s.release_lease(JOB, "w1"), ("lease", "record")),
    "STATE": (running_job, lambda s: s.lease_state(JOB), ("lease", "record")),
    "DELETE": (running_job, lambda s: s.delete_job(JOB), ("due", "jobs", "finished", *LISTING)),
    "DELETE(if_version)": (running_job, lambda s: s.delete_job(JOB, if_version=1), ("record", "due", "jobs",
                                                                                   "finished", *LISTING)),
    "REINDEX": (running_job, lambda s: s.reindex(), LISTING),
    "CONTROL": (running_job, lambda s: s.request_control(JOB, "pause"), ("record",)),
    "DROPPED": (running_job, lambda s: s.add_dropped_usage(JOB, Usage(model_calls=1), token="t"), ("record",)),
    "SEND": (running_job, lambda s: s.send(JOB, [{"role": "user", "content": "x"}]), ("record", "inbox")),
    "PUBLISH": (running_job, lambda s: s.publish(JOB, [Event(timestamp=1.0, type="text_delta", data={"text": "x"})]),
                ("record", "live")),
    "READ_LIVE": (running_job, lambda s: s.read_live(JOB), ("live",)),
    "READ_LIVE(blocking)": (running_job, lambda s: s.read_live(JOB, block=0.05), ("live",)),
}
COMMITS: dict[RedisStorage, Commit] = {}  # the commit of each test, built before anything is planted

CASES = [
    pytest.param(script, role, wrong, id=f"{script}-{role}-{wrong}")
    for script, (_, _, roles) in SCRIPTS.items()
    for role in roles
    for wrong in PLANT
    if wrong != EXPECTED[role]
]


def key_of(storage: RedisStorage, role: str) -> str:
    if role in INDEX_ROLES:
        return storage.listing_keys[INDEX_ROLES.index(role)]
    if role in ("due", "jobs", "finished"):
        return {"due": storage.due_key, "jobs": storage.jobs_key, "finished": storage.finished_key}[role]
    key: str = getattr(storage.keys(JOB), role)
    return key


def snapshot(r: redis.Redis) -> dict[bytes, tuple[Any, ...]]:
    """Every key of the database with its type, encoding, contents and expiry.

    Contents, not DUMP bytes: a read-only lookup may advance the incremental
    rehash of a large hash, which changes the order DUMP writes its fields in
    without changing the hash.
    """
    out: dict[bytes, tuple[Any, ...]] = {}
    for k in sorted(r.scan_iter(count=1000)):  # type: ignore[misc]
        kind = r.type(k).decode()  # type: ignore[union-attr]
        value: Any
        if kind == "hash":
            value = sorted(r.hgetall(k).items())  # type: ignore[union-attr]
        elif kind == "set":
            value = sorted(r.smembers(k))  # type: ignore[arg-type]
        elif kind in ("list", "string", "zset", "stream"):
            value = r.dump(k)  # their DUMP is in a fixed order
        else:
            raise AssertionError(f"snapshot: key {k!r} has the unexpected type {kind}")
        out[k] = (kind, r.object("encoding", k), value, r.pttl(k) > 0)
    return out


@pytest.fixture
def storage(redis_url: str) -> Iterator[RedisStorage]:
    s = RedisStorage.from_url(redis_url, prefix=PREFIX)
    yield s
    COMMITS.pop(s, None)
    s.close()


@pytest.mark.parametrize(("script", "role", "wrong"), CASES)
def test_a_key_of_the_wrong_type_is_reported_and_nothing_is_written(
    storage: RedisStorage, r: redis.Redis, script: str, role: str, wrong: str
) -> None:
    setup, action, _ = SCRIPTS[script]
    setup(storage)
    if script.startswith("COMMIT"):
        COMMITS[storage] = a_commit(storage)
    key = key_of(storage, role)
    r.delete(key)
    PLANT[wrong](r, key)
    before = snapshot(r)

    with pytest.raises(CorruptRecordError) as caught:
        action(storage)

    message = str(caught.value)
    assert repr(key) in message and f"is a Redis {wrong}" in message and "nothing was written" in message
    assert snapshot(r) == before


def test_the_issue_case_a_string_at_messages_leaves_the_job_at_its_version(storage: RedisStorage,
                                                                             r: redis.Redis) -> None:
    running_job(storage)
    commit = a_commit(storage)
    r.delete(storage.keys(JOB).messages)
    r.set(storage.keys(JOB).messages, "planted")
    with pytest.raises(CorruptRecordError, match="messages"):
        storage.commit(commit)
    # The record did not move on: the same commit lands once the key is repaired.
    r.delete(storage.keys(JOB).messages)
    assert storage.client.hget(storage.keys(JOB).record, "version") == b"1"
    storage.commit(commit)
    rec = storage.get_job(JOB)
    assert rec is not None and rec.version == 2


@pytest.mark.parametrize("role", ["record", "messages", "logs", "journal", "lease", "events"])
def test_a_corrupt_job_can_still_be_deleted(storage: RedisStorage, r: redis.Redis, role: str) -> None:
    running_job(storage)
    key = key_of(storage, role)
    r.delete(key)
    r.sadd(key, "planted")  # a set fits no job key
    assert storage.delete_job(JOB) is True
    assert not any(k.startswith(f"{PREFIX}:{{{JOB}}}".encode()) for k in r.scan_iter())
    assert r.zscore(storage.due_key, JOB) is None and not r.sismember(storage.jobs_key, JOB)
    assert storage.get_job("other") is not None


def test_create_clears_leftover_keys_of_any_type(storage: RedisStorage, r: redis.Redis) -> None:
    for key, wrong in zip(storage.keys(JOB)[1:], PLANT, strict=False):
        PLANT[wrong](r, key)
    storage.create_job(record(), messages=[{"role": "user", "content": "hello"}])
    assert [m["content"] for m in storage.messages(JOB)] == ["hello"]
    assert storage.logs(JOB) == [] and storage.events(JOB) == [] and storage.lease_owner(JOB) is None


# --- the flow-control scripts (adapters/redis/flow.py): same rule, their own keys ---------------
FLOW_SCRIPTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "TAKE_RATE": ("rate", lambda f: f.take_rate("m", rpm=60.0, tpm=600.0, burst=1.0, tokens=5, now=0.0)),
    "ADJUST_RATE": ("rate", lambda f: f.adjust_rate("m", 7)),
    "BLOCK_RATE": ("rate", lambda f: f.block_rate("m", 30.0, now=0.0)),
    "TAKE_SLOT": ("slots", lambda f: f.take_slot("k", JOB, limit=2, ttl=30.0, now=0.0)),
    "RELEASE_SLOT": ("slots", lambda f: f.release_slot("k", JOB)),
}
FLOW_EXPECTED = {"rate": "hash", "slots": "zset"}
FLOW_CASES = [
    pytest.param(script, wrong, id=f"{script}-{wrong}")
    for script, (role, _) in FLOW_SCRIPTS.items()
    for wrong in PLANT
    if wrong != FLOW_EXPECTED[role]
]


@pytest.mark.parametrize(("script", "wrong"), FLOW_CASES)
def test_a_flow_key_of_the_wrong_type_is_reported_and_nothing_is_written(
    storage: RedisStorage, r: redis.Redis, script: str, wrong: str
) -> None:
    flow_store = storage.flow_store()
    role, action = FLOW_SCRIPTS[script]
    # A live bucket and slot first, so the scripts would have something to write over.
    flow_store.take_rate("other", rpm=60.0, tpm=None, burst=1.0, tokens=1, now=0.0)
    key = flow_store.rate_key("m") if role == "rate" else flow_store.slots_key("k")
    PLANT[wrong](r, key)
    before = snapshot(r)

    with pytest.raises(CorruptRecordError) as caught:
        action(flow_store)

    message = str(caught.value)
    assert repr(key) in message and f"is a Redis {wrong}" in message and "nothing was written" in message
    assert snapshot(r) == before


def test_a_commit_leaves_a_status_index_it_does_not_write_alone(storage: RedisStorage, r: redis.Redis) -> None:
    """Running to running: the idle index is neither written nor checked, whatever it holds."""
    running_job(storage)
    commit = a_commit(storage)
    idle = key_of(storage, "status_idle")
    r.delete(idle)
    PLANT["string"](r, idle)
    storage.commit(commit)
    assert r.get(idle) == b"planted"
    rec = storage.get_job(JOB)
    assert rec is not None and rec.version == commit.record.version
    listing = storage.listing_keys
    assert r.zscore(listing[INDEX_ROLES.index("status_running")], JOB) is not None
