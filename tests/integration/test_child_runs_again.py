"""A finished child run its parent still waits for is not run again by anyone: its outcome is the parent's to read.

Refused as ``App.delete`` refuses it (``children.check_not_awaited``), on memory, SQLite and a real redis-server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, JobStatus
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply


@pytest.fixture(params=["memory", "sqlite", "redis"])
def storage(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    if request.param == "sqlite":
        from adapters.sqlite import SQLiteStorage

        s: Any = SQLiteStorage(str(tmp_path / "runs.db"))
    else:
        from adapters.redis import RedisStorage

        s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"ra{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def boss_answer(messages: list[Message]) -> Any:
    if messages[-1]["role"] == "tool":
        return "boss read: " + " / ".join(str(m["content"]) for m in messages if m["role"] == "tool")
    return reply(None, call("helper", input="what the boss asked"), call("helper", input="boom"),
                 call("slow", input="x"))


def waiting_boss(storage: Any) -> tuple[App, dict[str, str], list[str]]:
    """The boss waits for three children: one complete, one failed, one (``slow``) not run yet; and what the
    helper agent was asked, in order."""
    asks: list[str] = []

    def helper_answer(messages: list[Message]) -> str:
        asked = str([m["content"] for m in messages if m["role"] == "user"][-1])
        asks.append(asked)
        if asked == "boom":
            raise ValueError("the helper's model is down")
        return f"answer to {asked!r}"

    helper = Agent(name="helper", model=ScriptedModel(helper_answer))
    slow = Agent(name="slow", model=ScriptedModel(lambda m: "slow done"))
    boss = Agent(name="boss", model=ScriptedModel(boss_answer),
                 tools=[helper.as_tool(description="Help."), slow.as_tool(description="Slowly.")])
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[boss], provenance=False)
    app.run_agent("boss", job_id="B", messages=["go"])
    app.advance("B")  # its turn starts the three children and waits for them
    kids = {v.record.parent_call: v.job_id for v in app.jobs() if v.job_id != "B"}
    ok, failed, slow_id = (kids[c] for c in ("call_0_0", "call_0_1", "call_0_2"))
    app.advance(ok)
    app.advance(failed)
    assert app.get(ok).status is JobStatus.COMPLETE and app.get(failed).status is JobStatus.ERROR
    assert app.get("B").status is JobStatus.WAITING
    return app, {"ok": ok, "failed": failed, "slow": slow_id}, asks


def test_a_child_its_parent_waits_for_is_not_run_again_and_the_parent_reads_its_own_answer(storage: Any) -> None:
    app, kid, asks = waiting_boss(storage)
    before = {k: (app.get(j).record.version, app.messages(j)) for k, j in kid.items()}
    attempts = {
        "a continuation": lambda: app.run_agent("helper", job_id=kid["ok"], messages=["something else entirely"]),
        "a message sent": lambda: app.send(kid["ok"], ["something else entirely"]),
        "a full run again": lambda: app.run_agent("helper", job_id=kid["ok"], retry_mode="full"),
        "a retry": lambda: app.retry(kid["failed"]),
        "a full retry": lambda: app.retry(kid["failed"], mode="full"),
    }
    for what, attempt in attempts.items():
        with pytest.raises(JobConflictError, match="its parent 'B' still waits for") as refused:
            attempt()
        assert "run it again once the parent has woken" in str(refused.value), what
    with pytest.raises(JobConflictError):  # a fork onto its id: the id is taken
        app.fork(kid["ok"], at_turn=1, new_job_id=kid["failed"])
    assert {k: (app.get(j).record.version, app.messages(j)) for k, j in kid.items()} == before  # nothing written
    assert asks == ["what the boss asked", "boom"]

    app.drain()
    assert app.get("B").result == ("boss read: answer to 'what the boss asked' / Error: child job "
                                   f"{kid['failed']!r} failed: ValueError: the helper's model is down / slow done")


def test_once_the_parent_has_read_it_the_child_runs_again_as_any_conversation(storage: Any) -> None:
    app, kid, asks = waiting_boss(storage)
    app.drain()
    assert app.get("B").status is JobStatus.COMPLETE
    app.send(kid["ok"], ["and then?"])
    app.retry(kid["failed"])
    app.drain()
    assert app.get(kid["ok"]).result == "answer to 'and then?'"
    assert app.get(kid["failed"]).status is JobStatus.ERROR
    assert sorted(asks[2:]) == ["and then?", "boom"]  # both ran again: nothing refused
