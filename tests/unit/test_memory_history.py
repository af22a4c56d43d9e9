"""MemoryStorage keeps a record's turn history apart, a mark a line (adapters.memory.history), as Redis does."""

from __future__ import annotations

import uuid

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent
from pipelines.engine.errors import StateNotSerializableError
from pipelines.engine.models import Commit, JobRecord, TurnMark
from pipelines.testing import ScriptedModel


def counting_job(storage: MemoryStorage, turns: int) -> None:
    def reply(messages: list[dict[str, object]]) -> dict[str, object]:
        k = sum(1 for m in messages if m.get("role") == "assistant")
        if k >= turns - 1:
            return {"role": "assistant", "content": "done"}
        call = {"id": f"c{k}", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    from pipelines import tool

    @tool
    def noop() -> str:
        """Nothing."""
        return "ok"

    agent = Agent(name="a", model=ScriptedModel(reply), tools=[noop], max_turns=turns + 1, stream=False)
    scheduler = MemoryScheduler()
    agent.run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()


def test_a_late_turn_writes_one_mark_not_the_whole_history() -> None:
    storage = MemoryStorage()
    sizes: list[int] = []
    commit = storage.commit

    def spy(c: Commit) -> object:
        before = storage.bytes_written
        reply = commit(c)
        sizes.append(storage.bytes_written - before)
        return reply

    storage.commit = spy  # type: ignore[method-assign,assignment]
    counting_job(storage, 40)
    rec = storage.get_job("j")
    assert rec is not None and rec.status.value == "complete" and len(rec.history) == 41  # job start + 40 turns
    # Turn 5 and turn 35 write about as much: the history (36 marks by then) is not rewritten.
    assert sizes[34] < sizes[4] * 1.5
    stored = storage.inspect("j")["record"]
    assert [m[0] for m in stored["history"]] == [m.phases_done for m in rec.history]
    assert JobRecord.model_validate(stored) == rec.model_copy(update={"dropped": rec.dropped})


def test_a_history_rebuilt_from_other_objects_is_checked_whole_and_named_by_place() -> None:
    storage = MemoryStorage()
    counting_job(storage, 3)
    rec = storage.get_job("j")
    assert rec is not None
    # Equal marks but new objects, one of them bad: nothing is taken on trust.
    marks = [TurnMark.model_validate(m.model_dump()) for m in rec.history]
    marks[1] = marks[1].model_copy(update={"state": {"n": ("a", "tuple")}})
    bad = Commit(job_id="j", expected_version=rec.version, token=uuid.uuid4().hex,
                 record=rec.model_copy(update={"version": rec.version + 1, "history": marks}))
    with pytest.raises(StateNotSerializableError, match=r"history\[1\]\.state does not"):
        storage.commit(bad)
    assert storage.get_job("j") == rec
    marks[1] = TurnMark.model_validate(rec.history[1].model_dump())
    storage.commit(bad.model_copy(update={"record": bad.record.model_copy(update={"history": marks})}))
    again = storage.get_job("j")
    assert again is not None and again.history == rec.history and again.version == rec.version + 1
