"""A transcript deleted or evicted outside the app (a Redis that evicts keys, a hand-run DEL) fails its job clearly.

Found by a hostile review: the next turn asked its model with no system prompt and no history, and the record
went on counting messages that did not exist (`status`: 11 messages, 4 stored).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, JobStatus
from pipelines.testing import ScriptedModel


def _lose_transcript(kind: str, app: App, job_id: str, where: Any) -> None:
    storage: Any = app.storage
    if kind == "memory":
        storage._jobs[job_id].messages.clear()
    elif kind == "sqlite":
        with sqlite3.connect(where) as conn:
            conn.execute("DELETE FROM messages WHERE job_id = ?", (job_id,))
    else:
        storage.client.delete(storage.conn.keys(job_id).messages)  # what an evicting maxmemory-policy does


@pytest.fixture(params=["memory", "sqlite", "redis"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any, Any]:
    if request.param == "memory":
        return "memory", MemoryStorage(), None
    if request.param == "sqlite":
        from adapters.sqlite import SQLiteStorage

        path = str(tmp_path / "t.db")
        return "sqlite", SQLiteStorage(path), path
    from adapters.redis import RedisStorage

    url = request.getfixturevalue("redis_url")
    return "redis", RedisStorage.from_url(url, prefix="lost"), None


def test_a_turn_on_a_transcript_lost_outside_the_app_fails_the_job_naming_it(setup: tuple[str, Any, Any]) -> None:
    kind, storage, where = setup
    model = ScriptedModel(["first answer", "second answer"])
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, system="be brief")])
    app.run_agent("a", job_id="c", messages=["hello"])
    app.drain()
    assert len(app.messages("c")) == 3 and len(model.calls) == 1
    _lose_transcript(kind, app, "c", where)
    app.run_agent("a", job_id="c", messages=["and now?"])  # a continuation: the record still counts 3
    app.drain()
    view = app.get("c")
    assert view is not None and view.status is JobStatus.ERROR
    assert "holds 1 of the 4 messages" in str(view.record.error)  # the continuation appended one
    assert "deleted or evicted outside the app" in str(view.record.error)
    assert len(model.calls) == 1  # the model was not asked without its history
