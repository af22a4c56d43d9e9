"""The rest of the storage ports (adapters/base.py), run against every storage adapter (tests/contract/conftest.py).

What ``test_storage_contract.py`` leaves out: usage of fenced-off attempts,
pause/cancel requests, the inbox, the live stream (blocking and ``async``),
the version-fenced delete and the schema upgrade. A test of an optional
port runs on every adapter that declares its feature and is skipped, by the
declaration alone, on the others.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from typing import Any, TypeVar

import pytest

from adapters.base import (
    FEATURE_PROTOCOLS,
    FENCED_KEPT,
    INBOX_OPEN,
    AsyncLiveStore,
    ClaimingStore,
    Feature,
    FencedAnswers,
    KeyPrefixed,
    LeaseHistory,
    RetentionStore,
    StepBeforeCommit,
    Storage,
    VersionedSchema,
)
from pipelines.engine.capabilities import as_feature, features_of
from pipelines.engine.errors import InboxNotEmptyError, InvalidInputError, JobConflictError, StaleVersionError
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, JobStatus, Usage
from tests.contract.ports import covers
from tests.contract.test_storage_contract import _expire

T = TypeVar("T")


def record(job_id: str = "job-1", *, version: int = 1, status: JobStatus = JobStatus.RUNNING, **kw: Any) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={"n": 0}, version=version, due_at=100.0)
    return JobRecord(job_id=job_id, status=status, checkpoint=cp, version=version, **kw)


def moved(rec: JobRecord, **kw: Any) -> JobRecord:
    version = rec.version + 1
    cp = rec.checkpoint.model_copy(update={"version": version}) if rec.checkpoint is not None else None
    return rec.model_copy(update={"version": version, "checkpoint": cp, **kw})


def commit(rec: JobRecord, new: JobRecord, **kw: Any) -> Commit:
    return Commit(job_id=rec.job_id, expected_version=rec.version, token=uuid.uuid4().hex, record=new, **kw)


def msg(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": text}


def part(n: int, kind: str = "text_delta") -> Event:
    return Event(timestamp=float(n), type=kind, turn=1, data={"n": n, "text": f"δ{n}"})


def feature(storage: Any, which: Feature, protocol: type[T]) -> T:
    """``storage`` as the port of ``which``; the test is skipped where the adapter does not declare it."""
    found = as_feature(storage, which, protocol)
    if found is None:
        pytest.skip(f"{type(storage).__name__} does not declare {which.value}")
    return found


@pytest.fixture
def storage(make_storage: Any) -> Storage:
    s: Storage = make_storage()
    return s


def loaded(storage: Storage, job_id: str = "job-1") -> JobRecord:
    got = storage.get_job(job_id)
    assert got is not None
    return got


# --- a phase's last step before its commit -----------------------------------------------------
@covers("StepBeforeCommit.record_step_before_commit")
def test_a_last_step_before_the_commit_is_journaled_for_the_next_load_and_fenced_like_any(storage: Storage) -> None:
    last = feature(storage, Feature.STEP_BEFORE_COMMIT, StepBeforeCommit)
    rec = record()
    storage.create_job(rec)
    assert storage.acquire_lease("job-1", "w1", 30) is not None
    storage.record_step("job-1", version=1, owner="w1", key="model", value={"text": "hi"})
    last.record_step_before_commit("job-1", version=1, owner="w1", key="tool:c1", value=[1, "é"], parts=[part(1)])
    # Whatever the storage reads next sees it: a re-run after a crash here would not run the call again.
    again = storage.acquire_lease("job-1", "w1", 30)
    assert again is not None and again.checkpoint is not None
    assert again.checkpoint.journal == {"model": {"text": "hi"}, "tool:c1": [1, "é"]}
    assert [e.data for e in storage.read_live("job-1")] == [{"n": 1, "text": "δ1"}]  # published with it
    # Fenced like record_step: another owner or an old version journals nothing; the stale worker's
    # commit, behind the same fence, is refused.
    refused: list[str] = []
    for owner, version, key in (("w2", 1, "tool:c2"), ("w1", 0, "tool:c3")):
        # Refused at once (a storage that waits for the reply) or when the reply is read (then saying so):
        # either way, unwritten and unpublished.
        try:
            last.record_step_before_commit("job-1", version=version, owner=owner, key=key, value=2,
                                           parts=[part(2)], on_refused=lambda key=key: refused.append(key))
        except StaleVersionError:
            refused.append(key)
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec), owner="w2"))
    again = storage.acquire_lease("job-1", "w1", 30)
    assert again is not None and again.checkpoint is not None
    assert sorted(again.checkpoint.journal) == ["model", "tool:c1"]
    assert refused == ["tool:c2", "tool:c3"] and len(storage.read_live("job-1")) == 1
    storage.commit(commit(rec, moved(rec), owner="w1"))  # the commit ends the journal
    after = storage.acquire_lease("job-1", "w1", 30)
    assert after is not None and after.checkpoint is not None and after.checkpoint.journal == {}


# --- usage of attempts fenced off after paying ------------------------------------------------
@covers("JobStore.add_dropped_usage")
def test_dropped_usage_counts_once_per_token_beside_the_record(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    assert loaded(storage).dropped == Usage()
    first = Usage(prompt_tokens=10, completion_tokens=5, cost_usd=0.25, model_calls=1)
    storage.add_dropped_usage("job-1", first, token="t1")
    storage.add_dropped_usage("job-1", first, token="t1")  # the same call re-sent: counted once
    got = loaded(storage)
    assert got.dropped == first and got.version == 1
    storage.add_dropped_usage("job-1", Usage(prompt_tokens=1, model_calls=1, unknown_cost_calls=1), token="t2")
    both = Usage(prompt_tokens=11, completion_tokens=5, cost_usd=0.25, model_calls=2, unknown_cost_calls=1)
    assert loaded(storage).dropped == both
    # Outside the version fence: a turn in flight still commits, and the count survives the commit.
    storage.commit(commit(rec, moved(rec, usage=Usage(prompt_tokens=100, model_calls=1))))
    got = loaded(storage)
    assert got.version == 2 and got.dropped == both and got.total_usage.prompt_tokens == 111
    storage.add_dropped_usage("nobody", first, token="t3")  # an unknown job: nothing, and nothing created
    assert storage.get_job("nobody") is None


# --- pause / cancel requests ----------------------------------------------------------------
@covers("JobStore.request_control", "JobStore.commit", "LeaseStore.acquire_lease")
def test_a_control_request_waits_beside_the_record_until_a_commit_clears_it(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    assert loaded(storage).control is None
    assert storage.request_control("job-1", "pause") is True
    got = loaded(storage)
    assert got.control == "pause" and got.version == 1  # the record and its version are untouched
    leased = storage.acquire_lease("job-1", "w1", 30)
    assert leased is not None and leased.control == "pause"  # every load reports it
    assert storage.request_control("job-1", "cancel") is True  # a later request replaces it
    # A commit that does not apply it reports it, and leaves it pending.
    reply = storage.commit(commit(rec, moved(rec), owner="w1", release_lease=False))
    assert reply.control == "cancel" and loaded(storage).control == "cancel"
    assert storage.request_control("job-1", None) is True  # cleared by hand
    assert loaded(storage).control is None
    assert storage.request_control("job-1", "pause") is True
    two = loaded(storage)
    reply = storage.commit(commit(two, moved(two, status=JobStatus.PAUSED), owner="w1", clear_control=True))
    assert reply.control is None and loaded(storage).control is None
    assert storage.request_control("nobody", "cancel") is False and storage.get_job("nobody") is None


@covers("JobStore.request_control")
def test_a_pause_never_replaces_a_stored_cancel(storage: Storage) -> None:
    storage.create_job(record())
    assert storage.request_control("job-1", "cancel") is True
    assert storage.request_control("job-1", "pause") is True  # the job exists; the cancel stays
    assert loaded(storage).control == "cancel"
    assert storage.request_control("job-1", None) is True  # clearing still clears
    assert storage.request_control("job-1", "pause") is True and loaded(storage).control == "pause"
    assert storage.request_control("job-1", "cancel") is True and loaded(storage).control == "cancel"


# --- a deferred turn's place in the due index ----------------------------------------------------
@covers("JobStore.postpone", "JobIndex.due_jobs")
def test_a_postponed_job_leaves_the_due_index_until_its_new_time(storage: Storage) -> None:
    storage.create_job(record())  # due at 100
    assert storage.due_jobs(150.0) == ["job-1"]
    assert storage.postpone("job-1", version=2, due_at=200.0) is False  # another version: nothing moves
    assert storage.postpone("job-1", version=1, due_at=50.0) is False  # never earlier
    assert storage.due_jobs(150.0) == ["job-1"]
    assert storage.postpone("job-1", version=1, due_at=200.0) is True
    assert storage.due_jobs(150.0) == [] and storage.due_jobs(200.0) == ["job-1"]
    assert loaded(storage).version == 1  # outside the version fence: the record is untouched
    # A commit sets the due time it carries, whatever a deferral said.
    rec = loaded(storage)
    storage.commit(commit(rec, moved(rec)))
    assert storage.due_jobs(150.0) == ["job-1"]
    storage.create_job(record("done", status=JobStatus.COMPLETE))
    assert storage.postpone("done", version=1, due_at=300.0) is False  # not due: nothing to move
    assert storage.postpone("nobody", version=1, due_at=300.0) is False


# --- counts past what a storage can number -----------------------------------------------------------
@covers("HistoryStore.messages", "InboxStore.inbox", "JobIndex.list_jobs", "JobIndex.due_jobs", "LiveStore.read_live")
def test_a_count_or_bound_of_any_size_reads_as_all(storage: Storage) -> None:
    # What a caller passes to mean "everything" (10**20, sys.maxsize * 4) reads as in memory, not an OverflowError.
    huge = 10**20
    storage.create_job(record(), messages=[msg("a"), msg("b")])
    storage.send("job-1", [msg("c")])
    assert storage.messages("job-1", 0, huge) == [msg("a"), msg("b")]
    assert storage.messages("job-1", huge) == [] and storage.messages("job-1", -huge, -huge) == []
    assert storage.messages("job-1", -huge) == [msg("a"), msg("b")]
    assert storage.inbox("job-1", huge) == [msg("c")]
    assert [r.job_id for r in storage.list_jobs(limit=huge)] == ["job-1"]
    assert storage.due_jobs(1e12, limit=huge) == ["job-1"] and storage.finished_jobs(1e12, limit=huge) == []
    assert storage.events("job-1", limit=huge) == [] and storage.recent_events("job-1", limit=huge) == []
    assert storage.recent_logs("job-1", limit=huge) == ([], 0) == storage.recent_logs("job-1", skip=huge, limit=huge)
    storage.publish("job-1", [part(1), part(2)])
    assert len(storage.read_live("job-1", limit=huge)) == 2


# --- the inbox ---------------------------------------------------------------------------------
@covers("InboxStore.send", "InboxStore.inbox", "JobStore.commit")
def test_sent_messages_wait_in_order_until_a_commit_takes_them(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec, messages=[msg("start")])
    assert storage.inbox("job-1", 10) == []
    assert storage.send("job-1", [msg("one"), msg("two")]) == 2
    assert storage.send("job-1", [msg("three", role="system")]) == 3
    assert storage.inbox("job-1", 2) == [msg("one"), msg("two")]
    assert storage.inbox("job-1", 10) == [msg("one"), msg("two"), msg("three", role="system")]
    assert storage.inbox("job-1", 0) == []
    got = loaded(storage)
    assert got.inbox == 3 and got.version == 1  # outside the version fence
    assert storage.messages("job-1") == [msg("start")]  # not in the transcript before a turn takes them
    reply = storage.commit(commit(rec, moved(rec, transcript_len=3), take_inbox=2,
                                  append_messages=[msg("one"), msg("two")]))
    assert reply.inbox == 1
    assert storage.inbox("job-1", 10) == [msg("three", role="system")] and loaded(storage).inbox == 1
    assert storage.messages("job-1") == [msg("start"), msg("one"), msg("two")]
    assert storage.send("nobody", [msg("x")]) is None and storage.get_job("nobody") is None
    assert storage.inbox("nobody", 5) == []
    with pytest.raises(InvalidInputError):
        storage.send("job-1", [])
    with pytest.raises(InvalidInputError):
        storage.send("job-1", [{"content": "no role"}])
    assert storage.inbox("job-1", 10) == [msg("three", role="system")]


@covers("InboxStore.send", "InboxStore.inbox", "JobStore.commit")
def test_only_an_open_job_takes_messages_and_a_run_never_ends_past_them(storage: Storage) -> None:
    for status in JobStatus:
        job_id = f"s-{status.value}"
        storage.create_job(record(job_id, status=status))
        if status in INBOX_OPEN:
            assert storage.send(job_id, [msg("hi")]) == 1
        else:
            with pytest.raises(JobConflictError, match=status.value):
                storage.send(job_id, [msg("hi")])
            assert storage.inbox(job_id, 10) == []
    rec = record()
    storage.create_job(rec)
    storage.send("job-1", [msg("late")])
    done = moved(rec, status=JobStatus.COMPLETE, checkpoint=None, result="r")
    with pytest.raises(InboxNotEmptyError) as refused:
        storage.commit(commit(rec, done, ends_run=True, logs=[], append_messages=[msg("answer", "assistant")]))
    assert refused.value.waiting == 1
    assert loaded(storage) == rec.model_copy(update={"inbox": 1}) and storage.messages("job-1") == []
    # Taking what waits, the run may end; then the finished job's inbox takes nothing more.
    storage.commit(commit(rec, done, ends_run=True, take_inbox=1, append_messages=[msg("late")]))
    assert loaded(storage).status is JobStatus.COMPLETE and storage.inbox("job-1", 10) == []
    with pytest.raises(JobConflictError, match="complete"):
        storage.send("job-1", [msg("too late")])
    assert storage.inbox("job-1", 10) == [] and loaded(storage).inbox == 0


# --- the live stream ----------------------------------------------------------------------------
def _kinds(events: list[Event]) -> list[tuple[str, Any]]:
    return [(e.type, e.data) for e in events]


@covers("LiveStore.publish", "RunStore.publish", "LiveStore.read_live", "ReadStore.read_live")
def test_the_live_stream_is_every_committed_event_and_the_published_parts_in_order(storage: Storage) -> None:
    rec = record()
    started = Event(timestamp=0.0, type="job_started", data={})
    storage.create_job(rec, events=[started])
    storage.publish("job-1", [part(1), part(2, "attempt_started")])
    storage.publish("job-1", [])  # nothing to publish: nothing published
    storage.commit(commit(rec, moved(rec), events=[Event(timestamp=3.0, type="turn_started", turn=1, data={})]))
    storage.publish("job-1", [part(4)])
    live = storage.read_live("job-1")
    assert _kinds(live) == [("job_started", {}), ("text_delta", {"n": 1, "text": "δ1"}),
                            ("attempt_started", {"n": 2, "text": "δ2"}), ("turn_started", {}),
                            ("text_delta", {"n": 4, "text": "δ4"})]
    assert len({e.id for e in live}) == 5 and all(e.id for e in live)
    assert [e.type for e in storage.events("job-1")] == ["job_started", "turn_started"]  # parts are not history
    assert storage.read_live("job-1", after=live[1].id, limit=2) == live[2:4]
    assert storage.read_live("job-1", after=live[-1].id) == []
    assert storage.read_live("job-1", limit=0) == []
    storage.publish("nobody", [part(9)])  # an unknown job: nothing published, nothing created
    assert storage.read_live("nobody") == [] and storage.get_job("nobody") is None


@covers("LiveStore.read_live", "LiveStore.publish")
def test_a_blocked_live_read_waits_for_the_next_part_or_its_time(storage: Storage) -> None:
    storage.create_job(record(), events=[Event(timestamp=0.0, type="job_started", data={})])
    last = storage.read_live("job-1")[-1].id
    t0 = time.monotonic()
    assert storage.read_live("job-1", after=last, block=0.05) == []
    assert time.monotonic() - t0 >= 0.04
    publisher = threading.Timer(0.05, lambda: storage.publish("job-1", [part(1)]))
    publisher.start()
    t0 = time.monotonic()
    try:
        woke = storage.read_live("job-1", after=last, block=10)
    finally:
        publisher.join()
    assert _kinds(woke) == [("text_delta", {"n": 1, "text": "δ1"})] and time.monotonic() - t0 < 5
    assert storage.read_live("job-1", after=last, block=10) == woke  # already there: no wait


@covers("AsyncLiveStore.aread_live")
def test_an_async_live_read_is_the_same_stream_and_waits_without_a_thread(storage: Storage) -> None:
    live = feature(storage, Feature.ASYNC_LIVE, AsyncLiveStore)  # type: ignore[type-abstract]
    storage.create_job(record(), events=[Event(timestamp=0.0, type="job_started", data={})])
    storage.publish("job-1", [part(1), part(2)])

    async def follow() -> None:
        every = await live.aread_live("job-1")
        assert every == storage.read_live("job-1") and len(every) == 3
        assert await live.aread_live("job-1", after=every[0].id, limit=1) == every[1:2]
        assert await live.aread_live("nobody", block=0.01) == []
        t0 = time.monotonic()
        assert await live.aread_live("job-1", after=every[-1].id, block=0.05) == []
        assert time.monotonic() - t0 >= 0.04
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: threading.Thread(target=storage.publish, args=("job-1", [part(3)])).start())
        t0 = time.monotonic()
        woke = await live.aread_live("job-1", after=every[-1].id, block=10)
        assert _kinds(woke) == [("text_delta", {"n": 3, "text": "δ3"})] and time.monotonic() - t0 < 5
        with pytest.raises(InvalidInputError, match="cursor"):
            await live.aread_live("job-1", after="x", block=0.01)

    asyncio.run(follow())


# --- retention: the fenced delete ------------------------------------------------------------------
@covers("RetentionStore.delete_job", "RetentionStore.finished_jobs")
def test_a_delete_fenced_on_the_version_removes_the_job_only_at_that_version(storage: Storage) -> None:
    retention = feature(storage, Feature.RETENTION, RetentionStore)  # type: ignore[type-abstract]
    rec = record(updated_at=5.0)
    storage.create_job(rec, messages=[msg("hi")])
    done = moved(rec, status=JobStatus.COMPLETE, checkpoint=None, updated_at=6.0)
    storage.commit(commit(rec, done))
    assert retention.finished_jobs(10.0) == ["job-1"]
    with pytest.raises(StaleVersionError):
        retention.delete_job("job-1", if_version=1)  # it moved on to 2 meanwhile: nothing removed
    assert loaded(storage).version == 2 and storage.messages("job-1") == [msg("hi")]
    assert retention.finished_jobs(10.0) == ["job-1"]
    assert retention.delete_job("job-1", if_version=2) is True
    assert storage.get_job("job-1") is None and storage.messages("job-1") == []
    assert retention.finished_jobs(10.0) == [] and storage.list_jobs() == []
    assert retention.delete_job("job-1", if_version=2) is False  # gone: nothing to delete, nothing stale
    assert retention.delete_job("job-1") is False


# --- the schema version ----------------------------------------------------------------------------
@covers("VersionedSchema.migrate", "VersionedSchema.path")
def test_migrate_is_idempotent_on_a_current_file_and_keeps_its_data(storage: Storage) -> None:
    schema = feature(storage, Feature.SCHEMA, VersionedSchema)  # type: ignore[type-abstract]
    rec = record()
    storage.create_job(rec, messages=[msg("kept")])
    assert os.path.isabs(schema.path) and os.path.isfile(schema.path)  # where the job just went
    before, after = schema.migrate()
    assert isinstance(before, int) and before == after >= 1  # a new file is already at this library's version
    assert schema.migrate() == (after, after)
    assert storage.get_job("job-1") == rec and storage.messages("job-1") == [msg("kept")]


# --- claiming due work (a local scheduler's storage) ----------------------------------------------------
@covers("ClaimingStore.claim_due", "ClaimingStore.reap_dead_processes")
def test_due_work_is_claimed_by_one_claimer_until_its_hold_passes(storage: Storage) -> None:
    claims = feature(storage, Feature.CLAIMS, ClaimingStore)  # type: ignore[type-abstract]
    for job_id in ("a", "b", "c"):
        storage.create_job(record(job_id))  # running, due at 100
    storage.create_job(record("done", status=JobStatus.COMPLETE))
    assert claims.claim_due(99.0, limit=10, hold=60) == []  # nothing is due that early
    first = claims.claim_due(100.0, limit=2, hold=60)
    assert len(first) == 2 and set(first) < {"a", "b", "c"}  # at most ``limit``, never a finished job
    rest = claims.claim_due(100.0, limit=10, hold=60)
    assert set(rest) == {"a", "b", "c"} - set(first)  # held ones go to no other claim
    assert claims.claim_due(100.0, limit=10, hold=60) == []
    assert storage.acquire_lease("a", "w", 60) is not None  # a claim keeps claimers off, not the worker it is for
    assert claims.reap_dead_processes() >= 1  # this process lives: nothing it holds is released
    assert claims.claim_due(100.0, limit=10, hold=60) == []
    assert storage.lease_owner("a") == "w"


@covers("ClaimingStore.claim_due")
def test_a_claim_can_ask_for_the_jobs_of_some_pipelines_only(storage: Storage) -> None:
    claims = feature(storage, Feature.CLAIMS, ClaimingStore)  # type: ignore[type-abstract]
    for job_id, pipeline in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("odd", "it's \"odd\"")):
        storage.create_job(record(job_id, pipeline=pipeline))
    assert claims.claim_due(100.0, limit=10, hold=60, pipelines=["c"]) == []  # another App's work: left alone
    assert sorted(claims.claim_due(100.0, limit=10, hold=60, pipelines={"a"})) == ["a1", "a2"]
    assert claims.claim_due(100.0, limit=10, hold=60, pipelines=["it's \"odd\"", "b"]) == ["b1", "odd"]
    assert claims.claim_due(100.0, limit=10, hold=60, pipelines=[]) == []
    storage.create_job(record("plain"))  # the default pipeline: a record that leaves the name out
    assert claims.claim_due(100.0, limit=10, hold=60, pipelines=["default"]) == ["plain"]


# --- the key prefix queue ids carry --------------------------------------------------------------------
@covers("KeyPrefixed.key_prefix")
def test_the_key_prefix_is_one_queue_ids_can_carry(storage: Storage) -> None:
    from adapters.rq.ids import parse_rq_job_id, rq_job_id

    prefixed = feature(storage, Feature.KEY_PREFIX, KeyPrefixed)  # type: ignore[type-abstract]
    prefix = prefixed.key_prefix()
    assert isinstance(prefix, str) and prefix and prefixed.key_prefix() == prefix
    assert parse_rq_job_id(rq_job_id("job-1", 3, prefix)).namespace == prefix


# --- a lease that lapsed, told from one let go ------------------------------------------------------------
@covers("LeaseHistory.lease_state")
def test_a_lease_that_ran_out_is_told_from_one_let_go(storage: Storage) -> None:
    """The page's "worker lost" even when the attempt journaled nothing: only a lease that ran out lapses."""
    history = feature(storage, Feature.LEASE_HISTORY, LeaseHistory)  # type: ignore[type-abstract]
    rec = record()
    storage.create_job(rec)
    assert history.lease_state("job-1") == (None, False)  # never leased
    assert history.lease_state("unknown") == (None, False)
    storage.acquire_lease("job-1", "w1", 30)
    assert history.lease_state("job-1") == ("w1", False)
    storage.release_lease("job-1", "w1")
    assert history.lease_state("job-1") == (None, False)  # let go

    storage.acquire_lease("job-1", "w1", 0.05)
    _expire(storage, 0.05)
    assert history.lease_state("job-1") == (None, True)  # ran out: its holder died or stalled
    storage.release_lease("job-1", "w2")  # not the last holder: changes nothing
    assert history.lease_state("job-1") == (None, True)
    storage.acquire_lease("job-1", "w2", 30)  # a new attempt takes it
    assert history.lease_state("job-1") == ("w2", False)
    storage.commit(commit(rec, moved(rec), owner="w2"))  # the commit lets it go
    assert history.lease_state("job-1") == (None, False)

    rec = storage.get_job("job-1")
    assert rec is not None
    storage.acquire_lease("job-1", "w3", 30)
    storage.commit(commit(rec, moved(rec), owner="w3", release_lease=False))  # kept for the next turn
    assert history.lease_state("job-1") == ("w3", False)
    storage.release_lease("job-1", "w3")
    # A stalled holder that comes back after its lease ran out lets go of it: it is alive, no worker was lost.
    assert storage.acquire_lease("job-1", "w4", 0.05) is not None
    _expire(storage, 0.05)
    assert history.lease_state("job-1") == (None, True)
    storage.release_lease("job-1", "w4")
    assert history.lease_state("job-1") == (None, False)


# --- a turn's interruptions: leases taken over after they ran out, since the last commit ------------------
@covers("LeaseStore.acquire_lease", "LeaseStore.release_lease", "JobStore.commit", "JobStore.get_job")
def test_a_lease_taken_over_after_it_ran_out_counts_an_interrupted_turn_until_a_commit(storage: Storage) -> None:
    """``record.interrupted``: what the runner fails a poison turn by (pipelines.engine.runner.interrupted)."""
    rec = record()
    storage.create_job(rec)

    def taken(owner: str, ttl: float = 30) -> int:
        got = storage.acquire_lease("job-1", owner, ttl)
        assert got is not None
        return got.interrupted

    def count() -> int:
        got = storage.get_job("job-1")
        assert got is not None
        return got.interrupted

    assert taken("w1") == 0 and taken("w1") == 0  # taken again by its own holder: nothing lost
    storage.release_lease("job-1", "w1")
    assert taken("w2", 0.05) == 0  # let go: no worker was lost
    _expire(storage, 0.05)
    assert count() == 0  # ran out, and nobody took it over yet
    assert taken("w3", 0.05) == 1 and count() == 1
    _expire(storage, 0.05)
    storage.release_lease("job-1", "w2")  # not the last holder: changes nothing
    assert taken("w4", 0.05) == 2
    _expire(storage, 0.05)
    storage.release_lease("job-1", "w4")  # a stalled holder that comes back lets go: alive, not counted
    assert taken("w5") == 2 and count() == 2  # the count stays until a commit
    storage.release_lease("job-1", "w5")

    held = storage.acquire_lease("job-1", "w6", 0.05)
    assert held is not None and held.interrupted == 2
    _expire(storage, 0.05)
    assert taken("w7") == 3
    # A commit (this one keeps the lease for the next turn) starts the count again.
    storage.commit(commit(rec, moved(rec), owner="w7", release_lease=False))
    assert count() == 0 and taken("w7") == 0
    storage.release_lease("job-1", "w7")
    assert taken("w8", 0.05) == 0
    _expire(storage, 0.05)
    assert taken("w9") == 1  # counted anew, at the new version
    assert storage.get_job("unknown") is None and storage.acquire_lease("unknown", "w9", 30) is None


def test_a_lease_that_ran_out_before_a_commit_without_an_owner_is_no_interruption_of_the_next_turn(
        storage: Storage) -> None:
    # A retry (or a forced cancel) commits with no lease: the holder that lapsed before it held another turn. The
    # next take-over counted it, and the retried run began one interruption down.
    rec = record()
    storage.create_job(rec)
    assert storage.acquire_lease("job-1", "dead", 0.05) is not None
    _expire(storage, 0.05)
    storage.commit(commit(rec, moved(rec), owner=None))
    taken = storage.acquire_lease("job-1", "next", 30)
    assert taken is not None and taken.interrupted == 0


# --- the answers of fenced-off attempts ---------------------------------------------------------------
@covers("FencedAnswers.add_fenced_answer", "FencedAnswers.fenced_answers")
def test_a_fenced_off_attempts_answer_is_kept_with_its_usage_the_newest_few(storage: Storage) -> None:
    kept = feature(storage, Feature.FENCED_ANSWERS, FencedAnswers)  # type: ignore[type-abstract]
    storage.create_job(record())
    assert kept.fenced_answers("job-1") == [] and kept.fenced_answers("unknown") == []
    odd = {"turn": 1, "answer": {"message": {"role": "assistant", "content": "two\nlines «ü» \u2028", "tool_calls": []},
                                 "empty": {}, "n": 0.1, "big": 2**53}}
    kept.add_fenced_answer("job-1", Usage(prompt_tokens=5, model_calls=1), odd, token="a1")
    kept.add_fenced_answer("job-1", Usage(prompt_tokens=5, model_calls=1), odd, token="a1")  # re-sent: once
    assert kept.fenced_answers("job-1") == [odd]  # as written: an empty list stays a list, newlines stay
    got = storage.get_job("job-1")
    assert got is not None and got.dropped == Usage(prompt_tokens=5, model_calls=1)
    for i in range(2, FENCED_KEPT + 3):
        kept.add_fenced_answer("job-1", Usage(), {"turn": i}, token=f"a{i}")
    assert kept.fenced_answers("job-1") == [{"turn": i} for i in range(3, FENCED_KEPT + 3)]  # the newest kept
    kept.add_fenced_answer("unknown", Usage(model_calls=1), {"turn": 1}, token="x")  # ignored
    assert kept.fenced_answers("unknown") == [] and storage.get_job("unknown") is None
    assert storage.delete_job("job-1")
    storage.create_job(record())  # the same id again: nothing of the deleted job's answers comes back
    assert kept.fenced_answers("job-1") == []


# --- ranges and limits at their edges ------------------------------------------------------------------
@covers("HistoryStore.messages", "InboxStore.inbox", "HistoryStore.events", "LiveStore.read_live",
        "JobIndex.due_jobs", "JobIndex.list_jobs")
def test_ranges_read_like_a_slice_and_a_limit_below_one_reads_nothing(storage: Storage) -> None:
    storage.create_job(record(), messages=[msg(str(i)) for i in range(5)],
                       events=[Event(timestamp=0.0, type="job_started", data={})])
    storage.send("job-1", [msg("a"), msg("b")])
    storage.publish("job-1", [part(1)])

    def contents(start: int, stop: int | None = None) -> list[str]:
        return [m["content"] for m in storage.messages("job-1", start, stop)]

    every = [str(i) for i in range(5)]
    for start, stop in [(-2, None), (1, -1), (3, 2), (0, 0), (2, 99), (-99, 2), (5, None)]:
        assert contents(start, stop) == every[start:stop], (start, stop)
    for limit in (0, -1):
        assert storage.inbox("job-1", limit) == []
        assert storage.events("job-1", limit=limit) == [] and storage.read_live("job-1", limit=limit) == []
        assert storage.due_jobs(1e9, limit=limit) == [] and storage.list_jobs(limit=limit) == []
    assert storage.inbox("job-1", 99) == [msg("a"), msg("b")] and len(storage.read_live("job-1", limit=99)) == 2


def test_a_storage_declares_exactly_the_features_it_implements(storage: Storage) -> None:
    # The optional tests above are skipped by the declaration alone: a feature implemented but not declared
    # would hide its port from them (and from the App), one declared but not implemented would fail there.
    implemented = {f for f, proto in FEATURE_PROTOCOLS.items() if isinstance(storage, proto)}
    assert features_of(storage) == implemented
