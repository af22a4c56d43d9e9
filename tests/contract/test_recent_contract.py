"""A job's history read from its end (``Feature.RECENT``, issue 35): every backend pages the latest events
and log lines the same way, and the pages put together are the whole history, newest first."""

from __future__ import annotations

from typing import Any

import pytest

from adapters.base import Feature, RecentHistory
from adapters.memory import MemoryScheduler
from pipelines import Agent, App, tool
from pipelines.engine.capabilities import as_feature
from pipelines.engine.models import Checkpoint, Event, JobRecord, JobStatus, LogEntry
from pipelines.testing import ScriptedModel, reply
from tests.contract.ports import covers

TURNS = 6


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _answer(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    n = sum(1 for m in msgs if m.get("role") == "assistant")
    if n >= TURNS:
        return reply("done")
    return reply(f"turn {n}", {"id": f"c{n}", "type": "function",
                               "function": {"name": "add", "arguments": f'{{"a": {n}, "b": 1}}'}})


def _recent(storage: Any) -> RecentHistory:
    recent = as_feature(storage, Feature.RECENT, RecentHistory)  # type: ignore[type-abstract]
    if recent is None:
        pytest.skip(f"{type(storage).__name__} does not read history from its end")
    return recent


def _check(storage: Any, job_id: str) -> None:
    recent = _recent(storage)
    events = storage.events(job_id)
    assert len(events) > 3 * TURNS
    pages, before = [], None
    while True:
        page = recent.recent_events(job_id, before=before, limit=5)
        if not page:
            break
        assert len(page) <= 5
        pages.extend(page)
        before = page[-1].id
    assert pages == events[::-1]
    assert recent.recent_events(job_id, limit=0) == []
    logs = storage.logs("j2")
    assert len(logs) >= 5
    last, total = recent.recent_logs("j2", limit=2)
    assert total == len(logs) and last == logs[-2:]
    middle, _ = recent.recent_logs("j2", skip=1, limit=2)
    assert middle == logs[-3:-1]
    assert recent.recent_logs("j2", skip=len(logs), limit=5) == ([], len(logs))
    assert recent.recent_logs("j2", skip=len(logs) - 1, limit=5) == (logs[:1], len(logs))
    assert recent.recent_logs(job_id, limit=1000) == (storage.logs(job_id), len(storage.logs(job_id)))
    assert recent.recent_events("nobody") == [] and recent.recent_logs("nobody") == ([], 0)


@covers("RecentHistory.recent_events", "RecentHistory.recent_logs")
def test_latest_events_and_logs_page_back_to_the_start(make_storage: Any) -> None:
    storage = make_storage()
    _recent(storage)
    app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False,
              agents=[Agent(name="a", model=ScriptedModel(_answer), tools=[add], max_turns=TURNS + 2)])
    app.run_agent("a", job_id="j1", user="count")
    app.drain()
    assert app.get("j1").status.value == "complete"  # type: ignore[union-attr]
    storage.create_job(JobRecord(job_id="j2", status=JobStatus.COMPLETE),
                       logs=[LogEntry(timestamp=float(n), phase="p", message=f"line {n}") for n in range(7)])
    assert [e.message for e in _recent(storage).recent_logs("j2", skip=2, limit=3)[0]] == ["line 2", "line 3",
                                                                                          "line 4"]
    _check(storage, "j1")  # on Redis: from the archive a finished job's events moved into
    cp = Checkpoint[Any](next_phase="a", state={}, due_at=1.0)
    storage.create_job(JobRecord(job_id="j3", status=JobStatus.RUNNING, checkpoint=cp),
                       events=[Event(timestamp=float(n), type="note", data={"n": n}) for n in range(12)])
    newest = _recent(storage).recent_events("j3", limit=5)  # on Redis: from the stream of a running job
    assert [e.data["n"] for e in newest] == [11, 10, 9, 8, 7]  # type: ignore[index]
    assert _recent(storage).recent_events("j3", before=newest[-1].id, limit=100) == storage.events("j3")[:7][::-1]
    archive = getattr(storage, "archive_events", None)  # Redis: a finished job's events move into its record
    if archive is not None and archive("j1"):
        _check(storage, "j1")
