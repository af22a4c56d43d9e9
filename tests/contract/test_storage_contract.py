"""The Storage contract (adapters/base/), run against every adapter."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, cast

import pytest

from adapters.base import CountingIndex, Storage, page_cursor
from pipelines.engine.errors import InvalidInputError, JobConflictError, StaleVersionError, StateNotSerializableError
from pipelines.engine.models import Checkpoint, Commit, JobRecord, JobStatus, LogEntry
from tests.contract.ports import covers


def record(job_id: str = "job-1", *, version: int = 1, due_at: float = 100.0, **kw: Any) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={"n": 0}, version=version, due_at=due_at)
    fields: dict[str, Any] = {"job_id": job_id, "status": JobStatus.RUNNING, "checkpoint": cp, "version": version}
    fields.update(kw)
    return JobRecord(**fields)


def moved(rec: JobRecord, **kw: Any) -> JobRecord:
    version = rec.version + 1
    cp = rec.checkpoint.model_copy(update={"version": version, "state": kw.pop("state", {"n": version})}) \
        if rec.checkpoint is not None else None
    return rec.model_copy(update={"version": version, "checkpoint": cp, **kw})


def commit(rec: JobRecord, new: JobRecord, **kw: Any) -> Commit:
    return Commit(job_id=rec.job_id, expected_version=rec.version, token=uuid.uuid4().hex, record=new, **kw)


def log(msg: str) -> LogEntry:
    return LogEntry(timestamp=1.0, phase="a", level="info", message=msg)


@pytest.fixture
def storage(make_storage: Any) -> Storage:
    s: Storage = make_storage()
    return s


@covers("JobStore.create_job", "JobStore.get_job", "HistoryStore.messages", "HistoryStore.logs")
def test_create_and_read_back(storage: Storage) -> None:
    rec = record(result={"x": [1, 2]})
    storage.create_job(rec, messages=[{"role": "user", "content": "hi"}], logs=[log("started")])
    got = storage.get_job("job-1")
    assert got == rec
    assert storage.messages("job-1") == [{"role": "user", "content": "hi"}]
    assert [e.message for e in storage.logs("job-1")] == ["started"]
    assert storage.get_job("other") is None
    assert storage.messages("other") == [] and storage.logs("other") == []


@covers("JobStore.create_job")
def test_create_twice_is_a_conflict(storage: Storage) -> None:
    storage.create_job(record())
    with pytest.raises(JobConflictError):
        storage.create_job(record())


@covers("JobStore.commit")
def test_commit_applies_everything_together(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec, messages=[{"role": "user", "content": "q"}])
    new = moved(rec, transcript_len=3)
    storage.commit(commit(rec, new, append_messages=[{"role": "assistant", "content": "a", "extra": {"k": 1}},
                                                      {"role": "tool", "content": "r", "tool_call_id": "c1"}],
                          logs=[log("turn 1")]))
    assert storage.get_job("job-1") == new
    assert [m["role"] for m in storage.messages("job-1")] == ["user", "assistant", "tool"]
    assert storage.messages("job-1")[1]["extra"] == {"k": 1}  # provider fields survive
    assert [e.message for e in storage.logs("job-1")] == ["turn 1"]


@covers("JobStore.commit")
def test_stale_commit_is_rejected_and_changes_nothing(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    storage.commit(commit(rec, moved(rec), append_messages=[{"role": "assistant", "content": "first"}]))
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec, result="second"), append_messages=[{"role": "assistant", "content": "x"}],
                              logs=[log("stale")]))
    got = storage.get_job("job-1")
    assert got is not None and got.version == 2 and got.result is None
    assert storage.messages("job-1") == [{"role": "assistant", "content": "first"}]
    assert storage.logs("job-1") == []


@covers("JobStore.delete_job", "JobStore.commit")
def test_commit_to_a_deleted_job_is_stale(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    assert storage.delete_job("job-1") is True
    assert storage.delete_job("job-1") is False
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec)))
    assert storage.get_job("job-1") is None


@covers("JobStore.commit")
def test_the_same_commit_applied_twice_is_a_no_op(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    c = commit(rec, moved(rec), append_messages=[{"role": "assistant", "content": "once"}], logs=[log("once")])
    storage.commit(c)
    storage.commit(c)
    assert storage.messages("job-1") == [{"role": "assistant", "content": "once"}]
    assert len(storage.logs("job-1")) == 1


@covers("JobStore.commit")
def test_unserialisable_messages_are_rejected_with_nothing_written(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    with pytest.raises(StateNotSerializableError):
        storage.commit(commit(rec, moved(rec), append_messages=[{"role": "assistant", "content": object()}]))
    assert storage.get_job("job-1") == rec
    assert storage.messages("job-1") == []


@covers("LeaseStore.acquire_lease", "LeaseStore.renew_lease", "LeaseStore.release_lease", "LeaseStore.lease_owner")
def test_lease_is_exclusive_until_released_or_expired(storage: Storage) -> None:
    storage.create_job(record())
    assert storage.acquire_lease("job-1", "w1", 30) is not None
    assert storage.lease_owner("job-1") == "w1"
    assert storage.acquire_lease("job-1", "w2", 30) is None
    assert storage.acquire_lease("job-1", "w1", 30) is not None  # re-entrant for its owner
    assert storage.renew_lease("job-1", "w2", 30) is False
    assert storage.renew_lease("job-1", "w1", 30) is True
    storage.release_lease("job-1", "w2")  # not the owner: nothing happens
    assert storage.lease_owner("job-1") == "w1"
    storage.release_lease("job-1", "w1")
    assert storage.lease_owner("job-1") is None
    assert storage.acquire_lease("job-1", "w2", 30) is not None
    assert storage.acquire_lease("unknown", "w1", 30) is None


@covers("LeaseStore.acquire_lease", "LeaseStore.lease_owner")
def test_an_expired_lease_can_be_taken(storage: Storage) -> None:
    storage.create_job(record())
    assert storage.acquire_lease("job-1", "w1", 0.05) is not None
    _expire(storage, 0.05)
    assert storage.acquire_lease("job-1", "w2", 30) is not None
    assert storage.lease_owner("job-1") == "w2"


def _expire(storage: Storage, ttl: float) -> None:
    # Memory storage in this suite runs on a virtual clock; real backends on real time.
    clock = getattr(storage, "_clock", None)
    if clock is not None and hasattr(clock, "advance"):
        clock.advance(ttl + 1)
    else:
        time.sleep(ttl + 0.1)


@covers("JobStore.commit")
def test_commit_is_fenced_by_another_owners_lease(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    storage.acquire_lease("job-1", "w2", 30)
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec), owner="w1"))
    storage.commit(commit(rec, moved(rec), owner="w2"))
    assert storage.lease_owner("job-1") is None  # released with the commit


@covers("JobStore.commit")
def test_commit_can_keep_the_lease(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    storage.acquire_lease("job-1", "w1", 30)
    storage.commit(commit(rec, moved(rec), owner="w1", release_lease=False, keep_journal=True))
    assert storage.lease_owner("job-1") == "w1"


@covers("JobStore.record_step")
def test_journal_is_fenced_and_cleared_by_a_commit(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    storage.acquire_lease("job-1", "w1", 30)
    storage.record_step("job-1", version=1, owner="w1", key="model", value={"text": "hi"})
    storage.record_step("job-1", version=1, owner="w1", key="tool:c1", value=[1, 2])
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None
    assert got.checkpoint.journal == {"model": {"text": "hi"}, "tool:c1": [1, 2]}
    with pytest.raises(StaleVersionError):
        storage.record_step("job-1", version=0, owner="w1", key="x", value=1)
    with pytest.raises(StaleVersionError):
        storage.record_step("job-1", version=1, owner="w2", key="x", value=1)
    storage.commit(commit(rec, moved(rec), owner="w1"))
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None and got.checkpoint.journal == {}


@covers("StepPublisher.record_step_and_publish")
def test_a_step_journaled_with_live_parts_publishes_them_only_if_it_is_journaled(storage: Storage) -> None:
    from adapters.base import StepPublisher
    from pipelines.engine.models import Event

    assert isinstance(storage, StepPublisher)
    rec = record()
    storage.create_job(rec)
    storage.acquire_lease("job-1", "w1", 30)
    parts = [Event(timestamp=1.0, type="attempt_started", turn=1, data={"attempt": "a1"}),
             Event(timestamp=1.5, type="text_delta", turn=1, data={"attempt": "a1", "text": "héllo"})]
    storage.record_step_and_publish("job-1", version=1, owner="w1", key="model", value={"text": "héllo"},
                                    parts=parts)
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None and got.checkpoint.journal == {"model": {"text": "héllo"}}
    live = storage.read_live("job-1")
    assert [(p.type, p.data) for p in live] == [(p.type, p.data) for p in parts]
    # Fenced like record_step: a stale version or another owner journals nothing and publishes nothing.
    for version, owner in ((0, "w1"), (1, "w2")):
        with pytest.raises(StaleVersionError):
            storage.record_step_and_publish("job-1", version=version, owner=owner, key="tool:x", value=1,
                                            parts=[Event(timestamp=2.0, type="text_delta", turn=1, data={"text": "x"})])
    assert len(storage.read_live("job-1")) == len(parts)
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None and "tool:x" not in got.checkpoint.journal
    # No parts: exactly record_step.
    storage.record_step_and_publish("job-1", version=1, owner="w1", key="tool:c1", value=[1], parts=[])
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None and got.checkpoint.journal["tool:c1"] == [1]
    assert len(storage.read_live("job-1")) == len(parts)


@covers("JobStore.record_step")
def test_journal_survives_a_commit_that_keeps_it(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    storage.record_step("job-1", version=1, owner=None, key="model", value="m")
    new = moved(rec)
    storage.commit(commit(rec, new, keep_journal=True))
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None and got.checkpoint.journal == {"model": "m"}
    storage.record_step("job-1", version=2, owner=None, key="tool:a", value=1)
    got = storage.get_job("job-1")
    assert got is not None and got.checkpoint is not None
    assert got.checkpoint.journal == {"model": "m", "tool:a": 1}


@covers("HistoryStore.messages")
def test_transcript_reads_are_ranged_and_truncation_cuts_back(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec, messages=[{"role": "user", "content": str(i)} for i in range(5)])
    assert [m["content"] for m in storage.messages("job-1", 1, 3)] == ["1", "2"]
    assert [m["content"] for m in storage.messages("job-1", 3)] == ["3", "4"]
    storage.commit(commit(rec, moved(rec), truncate_messages_to=2, append_messages=[{"role": "user", "content": "n"}]))
    assert [m["content"] for m in storage.messages("job-1")] == ["0", "1", "n"]


@covers("JobIndex.due_jobs")
def test_due_index_follows_status_and_due_time(storage: Storage) -> None:
    a, b, c = record("a", due_at=10.0), record("b", due_at=5.0), record("c", due_at=50.0)
    for r in (a, b, c):
        storage.create_job(r)
    assert storage.due_jobs(20.0) == ["b", "a"]
    assert storage.due_jobs(20.0, limit=1) == ["b"]
    storage.commit(commit(b, moved(b, status=JobStatus.COMPLETE, checkpoint=None)))
    assert storage.due_jobs(100.0) == ["a", "c"]
    later = moved(a)
    assert later.checkpoint is not None
    later = later.model_copy(update={"checkpoint": later.checkpoint.model_copy(update={"due_at": 70.0})})
    storage.commit(commit(a, later))
    assert storage.due_jobs(60.0) == ["c"]


@covers("JobIndex.due_jobs", "RetentionStore.finished_jobs")
def test_due_and_finished_indexes_order_many_jobs_by_time_then_id(storage: Storage) -> None:
    # Enough jobs to land in every bucket of a bucketed layout; ties on the time are ordered by id.
    ids = [f"j{n:02}" for n in range(30)]
    for n, job_id in enumerate(ids):
        storage.create_job(record(job_id, due_at=float(n % 7)))
    expected = sorted(ids, key=lambda j: (int(j[1:]) % 7, j))
    assert storage.due_jobs(100.0) == expected
    assert storage.due_jobs(100.0, limit=11) == expected[:11]
    assert storage.due_jobs(2.0) == [j for j in expected if int(j[1:]) % 7 <= 2]
    assert storage.due_jobs(100.0, limit=0) == []
    for n, job_id in enumerate(ids[:12]):
        rec = storage.get_job(job_id)
        assert rec is not None
        storage.commit(commit(rec, moved(rec, status=JobStatus.COMPLETE, checkpoint=None, updated_at=50.0 - n)))
    done = [f"j{n:02}" for n in range(11, -1, -1)]  # the last to finish was updated earliest
    assert storage.finished_jobs(100.0) == done
    assert storage.finished_jobs(100.0, limit=5) == done[:5]
    assert storage.finished_jobs(45.0) == [j for j in done if 50.0 - int(j[1:]) <= 45.0]
    assert storage.due_jobs(100.0) == [j for j in expected if j not in done]


@covers("RetentionStore.finished_page", "RetentionStore.delete_job")
def test_the_finished_index_pages_on_from_a_cursor_past_ties_and_gone_jobs(storage: Storage) -> None:
    # Retention walks the finished index with this cursor, past jobs it keeps (a child its parent waits for):
    # reading from the start each time would never get past them. Ties on the time, in every bucket.
    ids = [f"j{n:02}" for n in range(30)]
    for job_id in ids:
        storage.create_job(record(job_id))
        rec = storage.get_job(job_id)
        assert rec is not None
        storage.commit(commit(rec, moved(rec, status=JobStatus.COMPLETE, checkpoint=None,
                                          updated_at=float(int(job_id[1:]) % 3))))
    index = cast(Any, storage)
    entries = sorted((float(int(j[1:]) % 3), j) for j in ids)
    assert index.finished_page(100.0) == entries
    assert index.finished_page(1.0, limit=5) == entries[:5]
    pages, after = [], None
    while page := index.finished_page(100.0, after=after, limit=7):
        pages.append(page)
        after = page[-1]
    assert [e for p in pages for e in p] == entries and [len(p) for p in pages] == [7, 7, 7, 7, 2]
    assert index.finished_page(100.0, after=entries[12]) == entries[13:]
    assert index.finished_page(0.0, after=entries[3]) == entries[4:10]  # finished at 0 only
    assert index.delete_job(entries[12][1]) is True  # the cursor's own job gone: the page starts after it
    assert index.finished_page(100.0, after=entries[12], limit=3) == entries[13:16]
    assert index.finished_page(100.0, after=(1.5, "")) == entries[20:]  # a cursor between two times
    assert index.finished_page(100.0, after=entries[-1]) == [] and index.finished_page(100.0, limit=0) == []


@covers("JobIndex.list_jobs")
def test_list_jobs_filters_by_status(storage: Storage) -> None:
    storage.create_job(record("a"))
    storage.create_job(record("b", status=JobStatus.ERROR, error="x"))
    assert {r.job_id for r in storage.list_jobs()} == {"a", "b"}
    assert [r.job_id for r in storage.list_jobs(status=JobStatus.ERROR)] == ["b"]


# --- the listing indexes: newest first, cursor pages, counts ------------------------------------
def listed(storage: Storage, **kw: Any) -> list[str]:
    return [r.job_id for r in storage.list_jobs(**kw)]


def all_pages(storage: Storage, size: int, **kw: Any) -> list[list[str]]:
    """Every page of ``size`` jobs, each read with the cursor of the page before."""
    pages: list[list[str]] = []
    before = None
    while page := storage.list_jobs(limit=size, before=before, **kw):
        pages.append([r.job_id for r in page])
        before = page_cursor(page[-1])
    return pages


@covers("JobIndex.list_jobs")
def test_list_jobs_is_newest_first_and_pages_by_cursor_through_ties(storage: Storage) -> None:
    # Ties on updated_at (a virtual clock, one batch) are ordered by id, descending.
    for job_id, when in [("a", 10.0), ("b", 30.0), ("c", 20.0), ("d", 20.0), ("e", 20.0), ("f", 5.0)]:
        storage.create_job(record(job_id, updated_at=when))
    assert listed(storage) == ["b", "e", "d", "c", "a", "f"]
    assert all_pages(storage, 2) == [["b", "e"], ["d", "c"], ["a", "f"]]
    assert all_pages(storage, 4) == [["b", "e", "d", "c"], ["a", "f"]]
    assert listed(storage, limit=3) == ["b", "e", "d"] and listed(storage, limit=0) == []
    assert listed(storage, before=page_cursor(JobRecord(job_id="d", updated_at=20.0))) == ["c", "a", "f"]


@covers("JobIndex.list_jobs", "CountingIndex.count_jobs")
def test_pages_of_many_jobs_walk_the_whole_listing_once_in_order(storage: Storage) -> None:
    jobs = {f"k{n:02}": float(n % 5) for n in range(40)}  # eight jobs per updated_at: ties across buckets
    for job_id, when in jobs.items():
        storage.create_job(record(job_id, updated_at=when))
    newest_first = sorted(jobs, key=lambda j: (jobs[j], j), reverse=True)
    assert listed(storage) == newest_first
    for size in (1, 7, 40):
        assert [j for page in all_pages(storage, size) for j in page] == newest_first
    assert cast(CountingIndex, storage).count_jobs() == 40


@covers("JobIndex.list_jobs", "CountingIndex.count_jobs", "CountingIndex.reindex")
def test_listing_and_counts_follow_every_status_change_and_delete(storage: Storage) -> None:
    a, b = record("a", updated_at=1.0), record("b", updated_at=2.0)
    storage.create_job(a)
    storage.create_job(b)
    storage.create_job(record("c", status=JobStatus.ERROR, error="x", updated_at=3.0))
    assert listed(storage, status=JobStatus.RUNNING) == ["b", "a"]
    storage.commit(commit(a, moved(a, status=JobStatus.COMPLETE, checkpoint=None, updated_at=9.0)))
    assert listed(storage) == ["a", "c", "b"]
    assert listed(storage, status=JobStatus.RUNNING) == ["b"]
    assert listed(storage, status=JobStatus.COMPLETE) == ["a"]
    assert listed(storage, status=JobStatus.ERROR) == ["c"] and listed(storage, status=JobStatus.IDLE) == []
    counter = cast(CountingIndex, storage)
    counts = {s: counter.count_jobs(status=s) for s in JobStatus}
    assert counts == {**dict.fromkeys(JobStatus, 0), JobStatus.RUNNING: 1, JobStatus.COMPLETE: 1, JobStatus.ERROR: 1}
    assert counter.count_jobs() == 3
    assert storage.delete_job("a") is True
    assert listed(storage) == ["c", "b"] and listed(storage, status=JobStatus.COMPLETE) == []
    assert counter.count_jobs(status=JobStatus.COMPLETE) == 0 and counter.count_jobs() == 2
    assert counter.reindex() == 2 and listed(storage) == ["c", "b"]  # rebuilding changes nothing here


@covers("JobIndex.list_jobs")
def test_a_cursor_holds_its_place_when_jobs_move_or_go(storage: Storage) -> None:
    recs = {n: record(f"j{n}", updated_at=float(n)) for n in range(6)}
    for rec in recs.values():
        storage.create_job(rec)
    first = storage.list_jobs(limit=2)
    assert [r.job_id for r in first] == ["j5", "j4"]
    # Meanwhile j1 commits (it moves to the front) and j4 and j3 are deleted.
    storage.commit(commit(recs[1], moved(recs[1], updated_at=99.0)))
    storage.delete_job("j4")
    storage.delete_job("j3")
    assert listed(storage, limit=2, before=page_cursor(first[-1])) == ["j2", "j0"]
    assert listed(storage, limit=2) == ["j1", "j5"]


@pytest.mark.parametrize("cursor", ["", "yesterday", "12.5", "12.5/", "nan/j1", "inf/j1", "1.0/bad id", "x/j1"])
@covers("JobIndex.list_jobs")
def test_a_bad_cursor_is_invalid_input(storage: Storage, cursor: str) -> None:
    storage.create_job(record("j1"))
    with pytest.raises(InvalidInputError, match="cursor"):
        storage.list_jobs(before=cursor)


@covers("JobStore.commit")
def test_concurrent_commits_on_one_version_let_exactly_one_win(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            msg = {"role": "assistant", "content": str(i)}
            storage.commit(commit(rec, moved(rec, result=i), append_messages=[msg]))
            wins.append(i)
        except StaleVersionError:
            pass

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert storage.messages("job-1") == [{"role": "assistant", "content": str(wins[0])}]
    got = storage.get_job("job-1")
    assert got is not None and got.result == wins[0]


@covers("JobStore.commit", "JobStore.record_step")
def test_a_worker_commits_and_journals_only_while_it_holds_the_lease(storage: Storage) -> None:
    rec = record()
    storage.create_job(rec)
    # No lease at all (it expired, or the job was deleted and re-created under
    # the same id): a worker's writes are fenced off although the version matches.
    with pytest.raises(StaleVersionError):
        storage.record_step("job-1", version=1, owner="w1", key="k", value=1)
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec), owner="w1"))
    assert storage.get_job("job-1") == rec
    # A control operation (no owner) checks the version only.
    storage.commit(commit(rec, moved(rec)))
    got = storage.get_job("job-1")
    assert got is not None and got.version == 2


@covers("HistoryStore.events")
def test_events_are_appended_with_their_commit_and_read_from_a_cursor(storage: Storage) -> None:
    from pipelines.engine.models import Event

    def ev(kind: str, n: int) -> Event:
        return Event(timestamp=float(n), type=kind, turn=n, data={"n": n})

    rec = record()
    storage.create_job(rec, events=[ev("job_started", 0)])
    storage.commit(commit(rec, moved(rec), events=[ev("turn_started", 1), ev("tool_call", 1)]))
    with pytest.raises(StaleVersionError):
        storage.commit(commit(rec, moved(rec), events=[ev("stale", 9)]))
    got = storage.events("job-1")
    assert [(e.type, e.turn, e.data) for e in got] == [
        ("job_started", 0, {"n": 0}), ("turn_started", 1, {"n": 1}), ("tool_call", 1, {"n": 1})]
    assert len({e.id for e in got}) == 3 and all(e.id for e in got)
    after_first = storage.events("job-1", after=got[0].id)
    assert [e.type for e in after_first] == ["turn_started", "tool_call"]
    assert storage.events("job-1", after=got[-1].id) == []
    assert [e.type for e in storage.events("job-1", limit=1)] == ["job_started"]
    assert storage.events("unknown") == []
