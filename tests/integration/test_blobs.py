"""Issue 14: large values out of the transcript (blob stores, references, delete, crashes).

Every test taking ``backend`` runs on memory storage with a directory store, Redis with Redis blobs, and
memory storage with S3 blobs on moto's S3-compatible server on 127.0.0.1 (``tests/s3_server.py``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.blobs import DirectoryBlobStore, MemoryBlobStore, RedisBlobStore
from adapters.blobs.s3 import S3BlobStore
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.offload import OffloadingStorage
from adapters.redis import RedisStorage
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.blobs import BLOB_KEY, Offloader, blob_name
from pipelines.engine.errors import (
    ConfigurationError,
    CorruptRecordError,
    InvalidInputError,
    StateNotSerializableError,
    ValueTooLargeError,
)
from pipelines.engine.models import MAX_VALUE_BYTES, JobRecord
from pipelines.testing import ScriptedModel, SimulatedCrash, call, crash_test, reply
from tests.s3_server import ACCESS_KEY, SECRET_KEY

BIG = 100 * 1024  # over the 64 KiB default threshold


@pytest.fixture(params=["memory", "redis", "redis-cluster", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """(inner storage, blob store): memory with a directory store, Redis (or a Redis Cluster) with Redis blobs,
    memory with S3 blobs."""
    if request.param == "memory":
        yield MemoryStorage(), DirectoryBlobStore(tmp_path / "blobs")
        return
    if request.param == "s3":
        yield MemoryStorage(), S3BlobStore(request.getfixturevalue("s3_bucket"), prefix="app/blobs",
                                           endpoint=request.getfixturevalue("s3_endpoint"),
                                           access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
        return
    prefix = f"bl{uuid.uuid4().hex[:8]}"
    if request.param == "redis-cluster":
        s = RedisStorage.from_url(request.getfixturevalue("redis_cluster_url"), prefix=prefix, cluster=True)
    else:
        s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=prefix)
    yield s, RedisBlobStore(s.client, prefix=prefix)
    s.close()


def page(n: int) -> str:
    """A large, deterministic tool result."""
    return (f"page {n} " * (BIG // 7))[:BIG]


@tool
def fetch(n: int) -> str:
    """Fetch a large page."""
    return page(n)


def answer(messages: list[dict[str, Any]]) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    return reply(f"fetching {k}", call("fetch", n=k)) if k < 2 else "done"


def make_app(storage: Any, blobs: Any, **options: Any) -> tuple[App, OffloadingStorage, ScriptedModel]:
    model = ScriptedModel(answer)
    wrapped = OffloadingStorage(storage, blobs, **options)
    app = App(storage=wrapped, scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)), provenance=False,
              agents=[Agent(name="bot", model=model, tools=[fetch])])
    return app, wrapped, model


def names_in(raw: list[dict[str, Any]]) -> set[str]:
    return {m[BLOB_KEY]["name"] for m in raw if BLOB_KEY in m}


def test_large_tool_results_are_stored_once_and_read_back_whole(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, _, model = make_app(inner, blobs)
    app.run_agent("bot", job_id="j", messages=["read the pages"])
    app.drain()
    view = app.get("j")
    assert view is not None and view.status is JobStatus.COMPLETE
    msgs = app.messages("j")
    tool_results = [m for m in msgs if m["role"] == "tool"]
    assert [m["content"] for m in tool_results] == [page(0), page(1)]  # readers see full content
    raw = inner.messages("j")
    refs = [m for m in raw if BLOB_KEY in m]
    assert [m["tool_call_id"] for m in refs] == [m["tool_call_id"] for m in tool_results]
    assert all(len(json.dumps(m)) < 300 for m in refs)  # the transcript holds references only
    # The model saw the full result at its next turn.
    assert model.calls[1].messages[-1]["content"] == page(0)
    assert sorted(blobs.job_ids()) == ["j"]
    assert all(blobs.get("j", n) is not None for n in names_in(raw))


def test_below_the_threshold_values_stay_inline(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, _, _ = make_app(inner, blobs, threshold=10 * BIG)
    app.run_agent("bot", job_id="j", messages=["read"])
    app.drain()
    assert inner.messages("j") == app.messages("j")
    assert list(blobs.job_ids()) == []


def test_a_large_initial_message_and_journal_entry_are_offloaded(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, wrapped, _ = make_app(inner, blobs)
    big = "x" * BIG
    app.run_agent("bot", job_id="j", messages=[big])
    raw = inner.messages("j")
    assert BLOB_KEY in raw[-1] and raw[-1]["role"] == "user"
    assert wrapped.messages("j")[-1] == {"role": "user", "content": big}
    rec = wrapped.get_job("j")
    assert rec is not None
    wrapped.record_step("j", version=rec.version, owner=None, key="k", value={"v": big})
    stored = inner.get_job("j")
    assert stored is not None and stored.checkpoint is not None and BLOB_KEY in stored.checkpoint.journal["k"]
    again = wrapped.get_job("j")
    assert again is not None and again.checkpoint is not None and again.checkpoint.journal["k"] == {"v": big}


def test_the_per_blob_limit_is_configurable_and_replaces_the_inline_limit(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    wrapped = OffloadingStorage(inner, blobs, max_blob_bytes=MAX_VALUE_BYTES + 2 * 1024 * 1024)
    huge = "y" * (MAX_VALUE_BYTES + 1024 * 1024)  # above the 8 MiB inline limit
    wrapped.create_job(JobRecord(job_id="big", version=1), messages=[{"role": "user", "content": huge}])
    assert wrapped.messages("big")[0]["content"] == huge
    small = OffloadingStorage(inner, blobs, max_blob_bytes=BIG)
    with pytest.raises(ValueTooLargeError, match="per-blob limit"):
        small.create_job(JobRecord(job_id="refused", version=1), messages=[{"role": "user", "content": huge}])
    assert inner.get_job("refused") is None and "refused" not in set(blobs.job_ids())


@pytest.mark.parametrize("bad, error", [
    ({"role": "user", "content": "x" * BIG, BLOB_KEY: {"name": "n"}}, InvalidInputError),
    ({"role": "user", "content": {1, 2}}, StateNotSerializableError),
    ({"content": "no role"}, StateNotSerializableError),
])
def test_bad_messages_are_refused_with_nothing_written(backend: tuple[Any, Any], bad: Any, error: type) -> None:
    inner, blobs = backend
    _, wrapped, _ = make_app(inner, blobs)
    good = {"role": "user", "content": "z" * BIG}  # would be offloaded first if the check came late
    with pytest.raises(error):
        wrapped.create_job(JobRecord(job_id="j", version=1), messages=[good, bad])
    assert inner.get_job("j") is None and list(blobs.job_ids()) == []


def test_settings_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="threshold"):
        OffloadingStorage(MemoryStorage(), MemoryBlobStore(), threshold=0)
    with pytest.raises(InvalidInputError, match="at most the inline limit"):  # between the two: refused inline
        OffloadingStorage(MemoryStorage(), MemoryBlobStore(), threshold=16 * 1024 * 1024)
    with pytest.raises(InvalidInputError, match="BlobStore"):
        OffloadingStorage(MemoryStorage(), object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Storage"):
        OffloadingStorage(object(), MemoryBlobStore())  # type: ignore[arg-type]


def test_blobs_go_with_the_job_on_delete_and_retention(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, _, _ = make_app(inner, blobs)
    for job in ("a", "b"):
        app.run_agent("bot", job_id=job, messages=["read"])
    app.drain()
    app.delete("a")
    assert sorted(blobs.job_ids()) == ["b"]
    app.scheduler.clock.advance(100)  # type: ignore[attr-defined]
    assert app.gc(older_than=10) == ["b"]
    assert list(blobs.job_ids()) == []


def test_a_fork_has_its_own_blobs_and_outlives_the_original(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, _, _ = make_app(inner, blobs)
    app.run_agent("bot", job_id="orig", messages=["read"])
    app.drain()
    app.fork("orig", at_turn=1, new_job_id="f")
    app.delete("orig")
    assert [m["content"] for m in app.messages("f") if m["role"] == "tool"] == [page(0)]
    assert sorted(blobs.job_ids()) == ["f"]


def test_a_missing_or_altered_blob_is_a_clear_error(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, wrapped, _ = make_app(inner, blobs)
    app.run_agent("bot", job_id="j", messages=["q" * BIG])
    name = names_in(inner.messages("j")).pop()
    blobs.delete_job("j")
    with pytest.raises(CorruptRecordError, match="does not hold"):
        wrapped.messages("j")
    blobs.put("j", name, b'"tampered"')
    with pytest.raises(CorruptRecordError, match="content hash"):
        wrapped.messages("j")


def test_orphans_of_a_crash_between_blob_and_job_are_collected(backend: tuple[Any, Any]) -> None:
    inner, blobs = backend
    app, wrapped, _ = make_app(inner, blobs)
    app.run_agent("bot", job_id="live", messages=["read " + "l" * BIG])
    data = b'"orphan"'
    blobs.put("gone", blob_name(data), data)  # its create_job never landed (the process died)
    assert wrapped.collect_orphans(older_than=3600).removed == []  # too recent: a create may be under way
    assert wrapped.collect_orphans(older_than=0).removed == ["gone"]
    assert sorted(blobs.job_ids()) == ["live"]


def test_a_crash_between_the_job_delete_and_its_blobs_leaves_orphans_the_sweep_removes(
        backend: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    inner, blobs = backend
    app, wrapped, _ = make_app(inner, blobs)
    app.run_agent("bot", job_id="j", messages=["read"])
    app.drain()

    def crash(job_id: str) -> int:
        raise SimulatedCrash("after the job's delete, before its blobs")

    monkeypatch.setattr(blobs, "delete_job", crash)
    with pytest.raises(SimulatedCrash):
        app.delete("j")
    monkeypatch.undo()
    assert inner.get_job("j") is None and list(blobs.job_ids()) == ["j"]
    assert wrapped.collect_orphans(older_than=0).removed == ["j"]
    assert list(blobs.job_ids()) == []


def test_a_crash_at_every_boundary_offloads_the_same_blobs_once() -> None:
    stores: dict[Any, MemoryBlobStore] = {}  # per run's storage (kept alive here: ids are not reused)

    def start(storage: Any, scheduler: Any) -> None:
        blobs = stores.setdefault(storage, MemoryBlobStore())
        app = App(storage=OffloadingStorage(storage, blobs), scheduler=scheduler, provenance=False,
                  agents=[Agent(name="bot", model=ScriptedModel(answer), tools=[fetch])])
        app.run_agent("bot", job_id="c", messages=["read " + "s" * BIG])

    report = crash_test(start, job_id="c")
    report.assert_ok()  # every run ends as the clean one, with the same transcript of references
    assert len(report.results) >= 8
    clean = names_in(report.clean_transcript)
    assert len(clean) == 3  # the initial message and two tool results
    (_, clean_store), *crashed = stores.items()
    # The clean run also holds its journaled tool results (a blob each, left under the job until it goes).
    written = set(clean_store._blobs["c"])
    assert clean <= written
    missing = 0
    for storage, blobs in crashed:
        if storage.get_job("c") is None:  # the crash came before create_job: the caller never got a job
            missing += 1
            assert set(blobs._blobs["c"]) <= written  # the initial message's blob, orphaned: the sweep's work
            assert OffloadingStorage(storage, blobs).collect_orphans(older_than=0).removed == ["c"]
            continue
        held = {n for n in clean if blobs.get("c", n) is not None}
        assert held == clean  # every reference resolves, whatever the crash point
        assert set(blobs._blobs["c"]) == written  # and no other blob: a re-run wrote the same names
    assert missing == 1


def test_offloader_refuses_a_reference_name_that_is_not_a_hash() -> None:
    off = Offloader(MemoryBlobStore())
    with pytest.raises(InvalidInputError, match="not a blob name"):
        off.unpack("j", {BLOB_KEY: {"name": "../../etc/passwd"}})


@pytest.mark.parametrize("url_fixture", ["redis_url", "redis_cluster_url"])
def test_a_blob_put_while_its_job_is_deleted_is_not_left_behind_unnamed(
        url_fixture: str, request: pytest.FixtureRequest) -> None:
    # A stale worker offloads a value between delete_job reading the job's blob names and deleting them:
    # the WATCH makes the delete run again and take the new blob too (before, it leaked for ever).
    storage = RedisStorage.from_url(request.getfixturevalue(url_fixture), prefix="race",
                                    cluster=url_fixture == "redis_cluster_url")
    blobs = RedisBlobStore(storage.client, prefix="race")
    blobs.put("j", "sha256-" + "a" * 64, b"first")
    late = "sha256-" + "b" * 64
    calls: list[str] = []

    def sneak(job_id: str) -> None:
        calls.append(job_id)
        if len(calls) == 1:
            other = RedisBlobStore(storage.client, prefix="race")
            other.put(job_id, late, b"late")

    blobs._between_read_and_delete = sneak  # type: ignore[method-assign]
    assert blobs.delete_job("j") == 2 and calls == ["j", "j"]  # the first attempt was retried
    assert blobs.get("j", late) is None and list(blobs.job_ids()) == []
    assert [k for k in storage.client.scan_iter(match="race:*")] == []
    storage.close()


def test_a_fork_whose_source_is_deleted_while_its_blobs_are_read_says_so(tmp_path: Path) -> None:
    # The references were read, then retention deleted the job and its blobs: not found, not "corrupt".
    from pipelines.engine.errors import JobNotFoundError

    hook: list[Any] = []

    class Racing(MemoryStorage):
        def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> Any:
            found = super().messages(job_id, start, stop)
            while hook:
                hook.pop()()
            return found

    app, _, _ = make_app(Racing(), DirectoryBlobStore(tmp_path / "blobs"))
    app.run_agent("bot", job_id="src", messages=["q " + "x" * (BIG + 10)])
    app.drain()
    hook.append(lambda: app.delete("src"))
    with pytest.raises(JobNotFoundError, match="deleted while it was being forked"):
        app.fork("src", at_turn=1, new_job_id="f")
