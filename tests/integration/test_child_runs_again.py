"""A finished child run its parent still waits for is not run again by anyone: its outcome is the parent's to read.

Refused as ``App.delete`` refuses it (``children.check_not_awaited``), on memory, SQLite and a real redis-server.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from pipelines import Agent, App, JobStatus
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply


@pytest.fixture
def storage(each_storage: Any) -> Any:
    return each_storage


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


def test_a_conversations_title_job_is_no_child_its_parent_waits_for() -> None:
    # A title job (a child of the conversation's whole life, never listed, never waited for by name) runs
    # when a later run of the conversation fails, and a failed one is retried while the conversation runs.
    from pydantic import BaseModel

    from phases.titles import title_job_id
    from pipelines.testing import ScriptedModel
    from tests.unit.helpers import memory

    class Title(BaseModel):
        title: str

    named = {"n": 0}

    def namer(messages: Any) -> str:
        named["n"] += 1
        if named["n"] == 1:
            raise ValueError("namer down")  # the first title job fails
        return '{"title": "Parcel"}'

    def chat(messages: Any) -> str:
        if messages[-1]["content"] == "boom":
            raise ValueError("the model refuses")  # fails the conversation's run
        return "answer to " + str(messages[-1]["content"])

    storage, scheduler, _ = memory()
    title_agent = Agent(name="namer", model=ScriptedModel(namer), output_schema=Title, stream=False)
    app = App(storage=storage, scheduler=scheduler, agents=[
        Agent(name="chat", model=ScriptedModel(chat), title_agent=title_agent), title_agent])
    app.run_agent("chat", job_id="u", messages=["where is my parcel?"])
    app.drain()
    assert app.get(title_job_id("u")).status is JobStatus.ERROR  # type: ignore[union-attr]
    app.run_agent("chat", job_id="u", messages=["boom"])  # the conversation runs again...
    assert app.retry(title_job_id("u")).status is JobStatus.RUNNING  # ...and its failed title job is retried
    app.drain()
    assert app.get("u").status is JobStatus.ERROR  # type: ignore[union-attr]  # that run failed
    assert app.get(title_job_id("u")).status is JobStatus.COMPLETE  # type: ignore[union-attr]  # not cancelled
    assert app.get("u").title == "Parcel"  # type: ignore[union-attr]
