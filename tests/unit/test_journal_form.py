"""How the agent turn journals the model's answer: without the fields that hold their defaults.

The journal write crosses to storage every turn (a whole ``ModelResponse``), so ``None`` fields and zero
counts are left out; any reader fills them in again. An answer journaled whole, as an older version wrote
it, replays the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from phases import journal
from pipelines import JobStatus, run_agent, tool
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import Crash, memory


def _crashing_after_the_answer(job_id: str) -> tuple[Any, Any, ScriptedModel, list[int]]:
    """A job whose first turn journals the model's answer, then dies inside its one tool call."""
    storage, scheduler, _ = memory()
    ran: list[int] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add; the worker dies the first time."""
        ran.append(a)
        if len(ran) == 1:
            raise Crash()
        return a + b

    model = ScriptedModel([reply("adding", call("add", a=2, b=3)), "5"])
    run_agent(job_id=job_id, model=model, tools=[add], initial_messages=["2+3"], storage=storage,
              scheduler=scheduler)
    with pytest.raises(Crash):
        scheduler.run_next()
    return storage, scheduler, model, ran


def _answer(storage: Any, job_id: str) -> dict[str, Any]:
    job = storage.get_job(job_id)
    assert job.checkpoint is not None
    answer = job.checkpoint.journal[journal.MODEL]
    assert isinstance(answer, dict)
    return answer


def test_the_journaled_answer_holds_no_field_at_its_default() -> None:
    storage, scheduler, model, _ = _crashing_after_the_answer("jf-1")
    answer = _answer(storage, "jf-1")
    # ScriptedModel gives no provider response and offers every tool: ``raw`` and ``tools_offered`` are None.
    assert "raw" not in answer and "tools_offered" not in answer
    assert answer["finish_reason"] == "tool_calls" and answer["model"] == "scripted"
    assert answer["request"] == {"messages": 1, "tools": ["add"]}
    assert 0 not in answer["usage"].values() and answer["usage"]["model_calls"] == 1
    assert "unknown_cost_calls" not in answer["usage"] and "cost_usd" not in answer["usage"]
    assert answer["message"]["content"] == "adding"

    scheduler.schedule_advance("jf-1", pipeline="agent")  # the sweep, or a redelivery
    scheduler.drain()
    assert len(model.calls) == 2  # the journaled answer was reused, read back with its defaults
    job = storage.get_job("jf-1")
    assert job.status is JobStatus.COMPLETE and job.usage.model_calls == 2
    assert storage.messages("jf-1")[1] == answer["message"]


def test_an_answer_journaled_whole_by_an_older_version_replays_the_same() -> None:
    storage, scheduler, model, ran = _crashing_after_the_answer("jf-2")
    short = _answer(storage, "jf-2")
    whole: dict[str, Any] = {"raw": None, "tools_offered": None, **short,
                             "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
                                       "unknown_cost_calls": 0, **short["usage"]}}
    job = storage.get_job("jf-2")
    storage.record_step("jf-2", version=job.version, owner=None, key=journal.MODEL, value=whole)
    scheduler.schedule_advance("jf-2", pipeline="agent")
    scheduler.drain()
    assert len(model.calls) == 2 and ran == [2, 2]  # the old form's answer was reused: its call ran again
    assert storage.get_job("jf-2").status is JobStatus.COMPLETE
    assert storage.messages("jf-2")[1] == short["message"]
    assert storage.messages("jf-2")[2]["content"] == "5"
