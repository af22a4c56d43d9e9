"""Two workers alternating a job's turns read only the messages they lack, and never a stale prefix (memory, Redis).

Each worker is its own App with its own agent (so its own transcript cache)
on a storage handle of its own onto one store: a second ``RedisStorage`` on
the same prefix, or the same ``MemoryStorage`` behind a proxy. Every read of
the transcript is counted per worker. The oracle for what the model must see
is the stored transcript itself, and a run of the same turns with the cache
switched off.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from adapters.redis.record_format import stored_text
from phases import agent_run
from phases.compaction import MARKER_KEY, Compaction
from phases.history_cache import HistoryCache
from pipelines import Agent, App, tool
from pipelines.engine.runner import AdvanceResult
from pipelines.testing import ScriptedModel, call, reply

Store = Callable[[], Any]  # a new handle onto the test's one store


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        shared = MemoryStorage()
        yield lambda: shared
        return
    url, prefix = request.getfixturevalue("redis_url"), f"hc{uuid.uuid4().hex[:8]}"
    made: list[RedisStorage] = []

    def handle() -> RedisStorage:
        made.append(RedisStorage.from_url(url, prefix=prefix))
        return made[-1]

    yield handle
    for s in made:
        s.close()


class Counting:
    """A worker's storage handle that records every transcript read: (job, start, stop, messages read)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int, int | None, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def messages(self, job_id: str, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.inner.messages(job_id, start, stop)
        self.reads.append((job_id, start, stop, len(out)))
        return out


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add."""
    return {"sum": a + b}


TAG = {"run": "first"}  # what the model writes into its answers: tells one run's messages from another's


def count_to(last: int) -> Callable[[list[dict[str, Any]]], Any]:
    """Counts with the tool, always under the call id "c" (the turn must make it unique), then says done.

    Asked to summarise (compaction), it says how far it got.
    """

    def fn(messages: list[dict[str, Any]]) -> Any:
        if str(messages[-1].get("content") or "").startswith("Summarise"):
            return f"counted {sum(1 for m in messages if m['role'] == 'tool')} times so far"
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k >= last:
            return "done"
        return reply(f"{TAG['run']}: step {k} " + "x" * 60, {**call("add", a=k, b=1), "id": "c"})

    return fn


class Worker:
    def __init__(self, store: Store, clock: VirtualClock, *, last: int = 6, cache: bool = True,
                 **agent: Any) -> None:
        self.storage = Counting(store())
        self.model = ScriptedModel(count_to(last))
        options = {"system": "You count.", "max_turns": 50, "stream": False, **agent}
        self.agent = Agent(name="bot", model=self.model, tools=[add], **options)
        if not cache:
            self.agent._turn.history = HistoryCache(size=0)  # every turn reads the whole transcript
        self.app = App(storage=self.storage, scheduler=MemoryScheduler(clock=clock), agents=[self.agent],
                       provenance=False)

    def turn(self, job_id: str) -> AdvanceResult:
        result = self.app.advance(job_id)
        assert result in (AdvanceResult.ADVANCED, AdvanceResult.COMPLETED), result
        return result

    def stored(self, job_id: str) -> list[dict[str, Any]]:
        """The job's whole stored transcript (a read the counts leave out)."""
        out: list[dict[str, Any]] = self.storage.inner.messages(job_id)
        return out

    def reads_of(self, job_id: str) -> list[tuple[int, int | None, int]]:
        return [(start, stop, n) for job, start, stop, n in self.storage.reads if job == job_id]


def alternate(workers: list[Worker], job_id: str, turns: int | None = None) -> int:
    """Advance ``job_id`` turn by turn, turn k on ``workers[k % len]``, until it completes (or ``turns``)."""
    done = 0
    while turns is None or done < turns:
        result = workers[done % len(workers)].turn(job_id)
        done += 1
        if result is AdvanceResult.COMPLETED:
            break
    return done


def assert_model_saw_the_stored_transcript(workers: list[Worker], job_id: str, stored: list[dict[str, Any]]) -> None:
    """Every turn's request was exactly the stored transcript as it stood (the pin is its first message)."""
    seen = [r.messages for w in workers for r in w.model.calls if r.job_id == job_id]
    assert seen
    for messages in seen:
        assert messages == stored[:len(messages)]


def test_two_workers_alternating_read_only_the_other_workers_turn_and_the_model_sees_it_all(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualClock(start=1_000_000.0)
    a, b = Worker(store, clock, last=10), Worker(store, clock, last=10)
    views: list[int] = []
    whole = agent_run.turn_messages

    def counted(cfg: Any, past: list[dict[str, Any]]) -> list[dict[str, Any]]:
        views.append(len(past))
        return whole(cfg, past)

    monkeypatch.setattr(agent_run, "turn_messages", counted)
    a.app.run_agent("bot", job_id="j", messages=["count"])
    assert alternate([a, b], "j") == 11
    assert views == [2, 4]  # the model view is built whole once per worker, then extended by what it reads
    stored = a.stored("j")
    assert len(stored) == 2 + 2 * 10 + 1
    # Each worker reads the whole transcript once (its first turn), then only the other worker's last turn.
    assert a.reads_of("j")[0] == (0, 2, 2) and b.reads_of("j")[0] == (0, 4, 4)
    later = a.reads_of("j")[1:] + b.reads_of("j")[1:]
    assert len(later) == 11 - 2 and all(stop is not None and stop - start == 2 == n for start, stop, n in later)
    assert sorted(start for start, _, _ in later) == list(range(4, 4 + 2 * len(later), 2))
    assert_model_saw_the_stored_transcript([a, b], "j", stored)
    # The call ids came out unique across both workers' turns, exactly as without any cache.
    ids = [c["id"] for m in stored for c in m.get("tool_calls") or []]
    assert ids == ["c", *(f"c_{n}" for n in range(2, 11))]
    solo = Worker(store, clock, last=10, cache=False)
    solo.app.run_agent("bot", job_id="oracle", messages=["count"])
    assert alternate([solo], "oracle") == 11
    assert solo.stored("oracle") == stored


def test_a_full_retry_cuts_the_transcript_and_a_cold_worker_holding_as_many_messages_reads_it_all(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)
    a, b = Worker(store, clock, last=2), Worker(store, clock, last=2)
    TAG["run"] = "first"
    a.app.run_agent("bot", job_id="r", messages=["count"])
    a.turn("r"), a.turn("r")  # a now holds 6 messages of the first run
    assert b.turn("r") is AdvanceResult.COMPLETED
    TAG["run"] = "second"
    try:
        a.app.retry("r", mode="full")  # back to [pin, "count"]: a fresh epoch
        b.turn("r"), b.turn("r")  # 6 messages again, the second run's
        assert len(b.stored("r")) == 6
        a.model.calls.clear(), b.model.calls.clear()
        reads_before = len(a.reads_of("r"))
        assert a.turn("r") is AdvanceResult.COMPLETED
    finally:
        TAG["run"] = "first"
    assert a.reads_of("r")[reads_before:] == [(0, 6, 6)]  # same length, other epoch: the whole transcript
    stored = a.stored("r")
    assert_model_saw_the_stored_transcript([a], "r", stored)
    assert not [m for m in stored if "first:" in str(m.get("content"))]
    assert [m["content"][:15] for m in stored if m["role"] == "assistant"][:2] == ["second: step 0 ", "second: step 1 "]


def test_a_job_deleted_and_created_again_under_its_id_with_as_many_messages_is_never_served_the_old_one(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)
    a, b = Worker(store, clock, last=2), Worker(store, clock, last=2)
    a.app.run_agent("bot", job_id="d", messages=["old job"])
    a.turn("d"), a.turn("d")  # a holds 6 messages of the old job
    assert b.turn("d") is AdvanceResult.COMPLETED
    b.app.delete("d")
    b.app.run_agent("bot", job_id="d", messages=["new job"])
    b.turn("d"), b.turn("d")  # 6 messages again, the new job's
    a.model.calls.clear()
    reads_before = len(a.reads_of("d"))
    assert a.turn("d") is AdvanceResult.COMPLETED
    assert a.reads_of("d")[reads_before:] == [(0, 6, 6)]
    stored = a.stored("d")
    assert stored[1] == {"role": "user", "content": "new job"} and "old job" not in json.dumps(stored)
    assert_model_saw_the_stored_transcript([a], "d", stored)


Steps = Callable[[Worker, Worker, str], None]


def cached_and_plain(store: Store, clock: VirtualClock, job_id: str, steps: Steps,
                     **agent: Any) -> tuple[list[Worker], list[dict[str, Any]]]:
    """The same turns run by two caching workers and by two that read everything: transcripts and requests match."""
    cached = [Worker(store, clock, **agent), Worker(store, clock, **agent)]
    plain = [Worker(store, clock, cache=False, **agent), Worker(store, clock, cache=False, **agent)]
    for (a, b), job in ((cached, job_id), (plain, f"{job_id}-plain")):
        a.app.run_agent("bot", job_id=job, messages=["count"])
        steps(a, b, job)
    got = cached[0].stored(job_id)
    assert got == plain[0].stored(f"{job_id}-plain")
    assert [r.messages for w in cached for r in w.model.calls] == [r.messages for w in plain for r in w.model.calls]
    return cached, got


def test_messages_sent_between_turns_reach_the_model_once_and_the_other_worker_reads_only_them_and_the_turn(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)

    def steps(a: Worker, b: Worker, job: str) -> None:
        a.turn(job)
        a.app.send(job, ["also say hello"])
        b.turn(job)  # reads everything once; takes the message
        b.app.send(job, ["and goodbye"])
        alternate([a, b], job)

    (a, b), stored = cached_and_plain(store, clock, "inbox", steps, last=5)
    assert [m["content"] for m in stored if m["role"] == "user"] == ["count", "also say hello", "and goodbye"]
    assert_model_saw_the_stored_transcript([a, b], "inbox", stored)
    # After its first read, each worker reads the other's turn: with the message it took, then without.
    assert a.reads_of("inbox") == [(0, 2, 2), (4, 7, 3), (10, 12, 2)]
    assert b.reads_of("inbox") == [(0, 4, 4), (7, 10, 3), (12, 14, 2)]


def test_compaction_markers_are_read_like_any_appended_message_and_the_view_matches_a_cacheless_run(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)

    def steps(a: Worker, b: Worker, job: str) -> None:
        alternate([a, b], job)

    cached, stored = cached_and_plain(store, clock, "comp", steps, last=12,
                                      compaction=Compaction(max_tokens=300, keep_recent=4))
    assert len([m for m in stored if MARKER_KEY in m]) >= 2
    for w in cached:
        assert all(start > 0 and stop is not None and stop - start <= 3 for start, stop, _ in w.reads_of("comp")[1:])


def test_a_view_migration_by_newer_workers_is_read_on_from_the_cached_prefix_and_matches_a_cacheless_run(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)

    def upgrade(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": "You count, v2."}, *messages[1:]]

    def run(job: str, cache: bool) -> tuple[list[Worker], list[dict[str, Any]]]:
        old = [Worker(store, clock, last=8, cache=cache, version="1") for _ in range(2)]
        new = [Worker(store, clock, last=8, cache=cache, version="2", view_migrations={"1": upgrade})
               for _ in range(2)]
        old[0].app.run_agent("bot", job_id=job, messages=["count"])
        alternate(old, job, turns=3)  # the old workers hold the job's first turns
        alternate([*new, *old], job, turns=2)  # the newer ones take over: the first to run migrates it
        alternate(new, job)
        return [*old, *new], old[0].stored(job)

    cached, got = run("mig", True)
    plain, want = run("mig-plain", False)
    assert got == want and len([m for m in got if MARKER_KEY in m]) == 1
    assert [r.messages for w in cached for r in w.model.calls] == [r.messages for w in plain for r in w.model.calls]
    last = cached[-1].model.calls[-1].messages
    assert last[0] == {"role": "system", "content": "You count, v2."}


def strip_epoch(storage: Any, job_id: str) -> None:
    """Make the stored record look as a version before epochs wrote it: no ``transcript_epoch``."""
    if isinstance(storage, MemoryStorage):
        job = storage._jobs[job_id]
        data = json.loads(job.record)
        del data["checkpoint"]["transcript_epoch"]
        job.record = json.dumps(data)
        return
    key = storage.keys(job_id).record
    data = json.loads(stored_text(*storage.client.hmget(key, ["data", "base", "dx"])) or "")
    del data["checkpoint"]["transcript_epoch"]
    # Record format 1, the only one those versions wrote, under a token of the write that wrote it.
    storage.client.hset(key, mapping={"data": json.dumps(data), "token": uuid.uuid4().hex})
    storage.client.hdel(key, "base", "dx")


def test_a_record_from_before_epochs_is_served_only_its_exact_commit_and_gets_an_epoch_at_its_next_turn(
        store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)
    a, b = Worker(store, clock, last=7), Worker(store, clock, last=7)
    a.app.run_agent("bot", job_id="o", messages=["count"])
    alternate([a, b, a], "o", turns=3)  # a holds 8 messages, b 6, both under the job's first epoch
    first = a.storage.inner.get_job("o").checkpoint.transcript_epoch
    strip_epoch(a.storage.inner, "o")
    assert a.storage.inner.get_job("o").checkpoint.transcript_epoch == ""  # an older record still reads
    reads = len(a.reads_of("o")), len(b.reads_of("o"))
    a.turn("o")  # the exact checkpoint a committed: nothing read
    minted = a.storage.inner.get_job("o").checkpoint.transcript_epoch
    assert minted not in ("", first)
    b.turn("o")  # b's entry is of the first epoch: the whole transcript
    a.turn("o")  # a's entry is of the minted one: only b's turn
    assert a.reads_of("o")[reads[0]:] == [(10, 12, 2)]
    assert b.reads_of("o")[reads[1]:] == [(0, 10, 10)]
    alternate([b, a], "o")
    assert_model_saw_the_stored_transcript([a, b], "o", a.stored("o"))


def test_a_fork_runs_on_its_own_transcript_while_the_workers_hold_the_originals(store: Store) -> None:
    clock = VirtualClock(start=1_000_000.0)
    a, b = Worker(store, clock, last=5), Worker(store, clock, last=5)
    a.app.run_agent("bot", job_id="src", messages=["count"])
    alternate([a, b], "src", turns=4)
    a.app.fork("src", at_turn=2, new_job_id="fork", run=True)
    assert alternate([b, a], "fork") == 4  # turns 3-6 of the fork's life
    src, fork = a.stored("src"), a.stored("fork")
    assert fork[:6] == src[:6] and len(fork) == 6 + 2 * 3 + 1
    assert b.reads_of("fork")[0] == (0, 6, 6) and a.reads_of("fork")[0] == (0, 8, 8)
    assert b.reads_of("fork")[1:] == [(8, 10, 2)]
    assert_model_saw_the_stored_transcript([a, b], "fork", fork)
    assert a.storage.inner.get_job("fork").checkpoint is None  # complete
