"""Every storage capability on SQLite: the inbox, decisions (approvals, pause, cancel), large values in blobs,
and flow control, by the same tests memory and Redis pass, plus SQLite's own flow-store checks.

The shared tests are collected here again with this module's fixtures, which give them an SQLite file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.blobs import DirectoryBlobStore
from adapters.memory import MemoryScheduler
from adapters.sqlite import SQLiteStorage
from adapters.sqlite.flow import SQLiteFlowStore
from pipelines import Agent, App, JobStatus
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.flow import LINE_SECONDS
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel
from tests.integration import test_agent_features_backends as features
from tests.integration import test_blobs as blobs
from tests.integration import test_inbox as inbox


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[SQLiteStorage]:
    s = SQLiteStorage(str(tmp_path / "app.db"))
    yield s
    s.close()


@pytest.fixture
def app(storage: SQLiteStorage) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(),
               agents=[Agent(name="a", model=ScriptedModel(inbox.answer), tools=[inbox.lookup])])


@pytest.fixture
def backend(storage: SQLiteStorage, tmp_path: Path) -> tuple[Any, Any]:
    return storage, DirectoryBlobStore(tmp_path / "blobs")


# --- the inbox (app.send) ---------------------------------------------------------------------------
test_inbox_between_turns = inbox.test_a_message_sent_between_turns_joins_before_the_next_answer
test_inbox_during_the_last_turn = inbox.test_a_message_sent_during_the_last_turn_starts_the_next_run_at_once
test_inbox_bad_sends = inbox.test_bad_sends_are_clear_errors
test_inbox_while_the_last_turn_commits = inbox.test_a_message_sent_while_the_last_turn_commits_joins_the_conversation
test_inbox_refused_when_finished = inbox.test_storage_refuses_a_message_to_a_finished_job_with_nothing_appended
test_inbox_end_refused_whole = inbox.test_a_commit_that_would_end_the_run_past_waiting_messages_is_refused_whole

# --- decisions: structured output, approvals, pause / resume / cancel, budgets ------------------------------
test_structured_output = features.test_structured_output
test_approve_and_reject = features.test_approve_and_reject
test_pause_resume_cancel = features.test_pause_resume_cancel_at_the_turn_boundary
test_token_budget = features.test_token_budget_and_prepare_turn

# --- large values in a blob store beside the file ------------------------------------------------------
test_blobs_large_tool_results = blobs.test_large_tool_results_are_stored_once_and_read_back_whole
test_blobs_inline_below_threshold = blobs.test_below_the_threshold_values_stay_inline
test_blobs_initial_and_journal = blobs.test_a_large_initial_message_and_journal_entry_are_offloaded
test_blobs_deleted_with_the_job = blobs.test_blobs_go_with_the_job_on_delete_and_retention
test_blobs_missing_is_clear = blobs.test_a_missing_or_altered_blob_is_a_clear_error


# --- flow control: one store for every process on the file -----------------------------------------------
@pytest.fixture
def flows(tmp_path: Path) -> tuple[SQLiteFlowStore, SQLiteFlowStore]:
    """Two flow stores on one file, as two processes would have."""
    path = str(tmp_path / "flow.db")
    return SQLiteStorage(path).flow_store(), SQLiteStorage(path).flow_store()


def test_a_rate_bucket_is_shared_by_every_store_on_the_file(flows: tuple[SQLiteFlowStore, SQLiteFlowStore]) -> None:
    a, b = flows
    limit: dict[str, Any] = {"rpm": 120.0, "tpm": None, "burst": 1.0}  # 2 a second, a bucket of 2
    assert a.take_rate("m", **limit, tokens=1, now=100.0) == 0.0
    assert b.take_rate("m", **limit, tokens=1, now=100.0) == 0.0
    assert 0.0 < a.take_rate("m", **limit, tokens=1, now=100.0) <= 0.5 + 1e-9  # refills in half a second
    assert b.take_rate("m", **limit, tokens=1, now=100.5) == 0.0
    b.block_rate("m", 30.0, now=100.5)  # a 429 seen by one worker blocks the model for all
    assert 29.0 < a.take_rate("m", **limit, tokens=1, now=101.0) <= 29.5
    a.adjust_rate("other", 5)  # no bucket yet: nothing to correct
    assert a.take_rate("other", rpm=None, tpm=600.0, burst=1.0, tokens=5, now=0.0) == 0.0
    b.adjust_rate("other", 20)  # the call used 25, not 5: the bucket is in debt
    assert 1.9 < a.take_rate("other", rpm=None, tpm=600.0, burst=1.0, tokens=5, now=0.0) <= 2.0


def test_slots_hold_at_most_the_limit_across_stores_and_expire(flows: tuple[SQLiteFlowStore, SQLiteFlowStore]) -> None:
    a, b = flows
    assert a.take_slot("k", "w1", limit=2, ttl=10.0, now=0.0) == 0.0
    assert b.take_slot("k", "w2", limit=2, ttl=30.0, now=0.0) == 0.0
    assert 0.0 < a.take_slot("k", "w3", limit=2, ttl=30.0, now=1.0) <= 9.0
    assert b.slots("k", 1.0) == ["w1", "w2"]
    assert a.renew_slot("k", "w1", ttl=20.0, now=5.0) is True
    assert b.take_slot("k", "w3", limit=2, ttl=30.0, now=15.0) > 0  # w1 renewed: still full
    assert b.take_slot("k", "w3", limit=2, ttl=30.0, now=26.0) == 0.0  # w1's worker died: its slot ran out
    assert a.renew_slot("k", "w1", ttl=20.0, now=26.0) is False  # nothing comes back past the limit
    a.release_slot("k", "w2")
    assert a.slots("k", 26.0) == ["w3"]
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(InvalidInputError, match="slot's ttl"):
            a.take_slot("k", "w4", limit=2, ttl=bad, now=0.0)
        with pytest.raises(InvalidInputError, match="a model's block"):
            a.block_rate("m", bad, now=0.0)


def test_an_app_on_sqlite_defers_a_turn_over_its_concurrency_limit(storage: SQLiteStorage) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"t-": 1},
              agents=[Agent(name="w", model=ScriptedModel(lambda m: "done"), stream=False)])
    store = storage.flow_store()
    now = app.scheduler.now()
    store.take_slot("t-1", "elsewhere", limit=1, ttl=30.0, now=now)
    app.run_agent("w", job_id="j", user="go", concurrency_key="t-1")
    assert app.advance("j") is AdvanceResult.DEFERRED
    record = storage.get_job("j")
    assert record is not None and record.status is JobStatus.RUNNING and record.version == 1
    store.release_slot("t-1", "elsewhere")
    assert app.advance("j") is AdvanceResult.COMPLETED
    assert store.slots("t-1", app.scheduler.now()) == []


def _rows(store: SQLiteFlowStore) -> list[tuple[str, str]]:
    return sorted(store._db.read(lambda c: c.execute("SELECT key, member FROM flow_slots").fetchall(), "rows"))


def test_rows_that_ran_out_go_whatever_their_key(flows: tuple[SQLiteFlowStore, SQLiteFlowStore],
                                                 tmp_path: Path) -> None:
    # With a key per user, a key may never be taken again: its rows still go, at another key's take or the sweep.
    a, b = flows
    assert a.take_slot("user-1", "dead tok", limit=1, ttl=1.0, now=100.0) == 0.0  # its worker is then killed
    assert a.take_slot("user-2", "holder", limit=1, ttl=1000.0, now=100.0) == 0.0
    assert a.take_slot("user-2", "gone", limit=1, ttl=30.0, now=100.0) > 0  # in line, then stops asking
    assert a.take_slot("user-3", "dead2 tok", limit=1, ttl=1.0, now=100.0) == 0.0
    assert len(_rows(a)) == 5
    later = 100.0 + LINE_SECONDS + 1
    assert b.take_slot("user-4", "w", limit=1, ttl=30.0, now=later) == 0.0  # another key's take
    assert _rows(b) == [("user-2", "holder"), ("user-4", "w")]
    # The sweep (the local scheduler's reap_dead_processes) drops them too, at the storage's clock (the wall's).
    now = time.time()
    assert a.take_slot("user-5", "dead3 tok", limit=1, ttl=1.0, now=now - 5.0) == 0.0  # a's last pass: just now
    assert a.take_slot("user-6", "live tok", limit=1, ttl=100.0, now=now) == 0.0
    SQLiteStorage(str(tmp_path / "flow.db")).reap_dead_processes()
    assert _rows(b) == [("user-6", "live tok")]


def test_a_deleted_job_leaves_no_place_in_line(storage: SQLiteStorage) -> None:
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False, concurrency={"t-": 1},
              agents=[Agent(name="w", model=ScriptedModel(lambda m: "done"), stream=False)])
    store = storage.flow_store()
    store.take_slot("t-1", "elsewhere", limit=1, ttl=30.0, now=app.scheduler.now())
    app.run_agent("w", job_id="j", user="go", concurrency_key="t-1")
    assert app.advance("j") is AdvanceResult.DEFERRED
    assert store.line("t-1", app.scheduler.now()) == ["j"]
    app.cancel("j", wait=0)
    app.delete("j")
    assert _rows(store) == [("t-1", "elsewhere")]
