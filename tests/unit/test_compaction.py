"""Compaction: older turns summarised for the model, the transcript kept whole, crash-safe."""

from __future__ import annotations

import json
from typing import Any

import pytest

from phases.compaction import MARKER_KEY, Compaction, compacted_view, estimate_tokens, find_cut
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.testing import ScriptedModel, call, crash_test, reply
from tests.unit.helpers import memory

TURNS = 30
CRASH_TURNS = 12  # crash_test re-runs the whole job for each of its ~100 crash points: a shorter job, compacted twice


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


def script(messages: list[dict[str, Any]], turns: int = TURNS) -> Any:
    """Counts with the tool up to ``turns``; asked to summarise, it says how far it got (deterministic per request)."""
    if messages[-1]["role"] == "user" and messages[-1]["content"].startswith("Summarise"):
        sums = [json.loads(m["content"])["sum"] for m in messages if m["role"] == "tool"]
        return f"counted up to {max(sums) if sums else 0} so far " + "x" * 40
    done = sum(1 for m in messages if m["role"] == "tool")
    summary = next((m["content"] for m in messages if "counted up to" in str(m.get("content"))), "")
    base = int(summary.split("counted up to ")[1].split()[0]) if summary else 0
    n = base + done if summary else done
    if n >= turns:
        return "done"
    return reply("adding one more, as asked " * 3, call("add", a=n, b=1))


def agent(model: Any, turns: int = TURNS, max_tokens: int = 900) -> Agent:
    return Agent(name="c", model=model, tools=[add], system="You count.", max_turns=turns + 5,
                 compaction=Compaction(max_tokens=max_tokens, keep_recent=4), stream=False)


def test_a_long_conversation_keeps_its_model_view_bounded_and_its_transcript_whole() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel(script)
    app = App(storage=storage, scheduler=scheduler, agents=[agent(model)])
    app.run_agent("c", job_id="long", messages=["count to 30"])
    view = app.handle("long").wait(timeout=10)
    assert view.status is JobStatus.COMPLETE and view.result == "done"
    msgs = app.messages("long")
    markers = [i for i, m in enumerate(msgs) if MARKER_KEY in m]
    assert len(markers) >= 2  # compacted more than once
    assert [json.loads(m["content"])["sum"] for m in msgs if m["role"] == "tool"] == list(range(1, TURNS + 1))
    for i in markers:
        upto = msgs[i][MARKER_KEY]["upto"]
        assert msgs[upto]["role"] != "tool"  # a cut never separates a call from its result
    turn_requests = [r for r in model.calls if not r.messages[-1]["content"] or
                     not str(r.messages[-1]["content"]).startswith("Summarise")]
    late = turn_requests[-5:]
    assert all(estimate_tokens(r.messages) <= 900 + 600 for r in late)  # bounded, not growing with the history
    assert all(sum(1 for m in r.messages if m["role"] == "system") == 1 for r in late)
    assert all(MARKER_KEY not in m for r in model.calls for m in r.messages)  # bookkeeping never sent
    assert any(e.type == "compacted" for e in app.events("long"))


def test_the_view_is_rebuilt_from_the_transcript_exactly() -> None:
    past = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                                   "function": {"name": "add", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "1"}, {"role": "assistant", "content": "a"}]
    assert find_cut(past, 2) == 2  # not 3: the tool result stays with its call
    note = {"role": "user", "content": "summary", MARKER_KEY: {"upto": 2}}
    assert compacted_view([*past, note]) == [past[0], {"role": "user", "content": "summary"}, *past[2:]]
    with pytest.raises(InvalidInputError):
        Compaction(max_tokens=0)


def test_compaction_survives_a_crash_at_every_boundary_without_summarising_twice() -> None:
    def model() -> ScriptedModel:
        return ScriptedModel(lambda messages: script(messages, CRASH_TURNS))

    report = crash_test(lambda storage, scheduler: agent(model(), CRASH_TURNS, max_tokens=500).run(
        job_id="t", messages=["count"], storage=storage, scheduler=scheduler), job_id="t")
    report.assert_ok()
    assert report.clean_status == "complete"
    assert sum(1 for m in report.clean_transcript if MARKER_KEY in m) >= 2  # crashes around two compactions
    assert [json.loads(m["content"])["sum"] for m in report.clean_transcript if m["role"] == "tool"] == \
        list(range(1, CRASH_TURNS + 1))


def test_a_tool_preview_shows_the_model_the_start_of_a_long_result_and_the_transcript_keeps_it_whole() -> None:
    @tool(preview=50)
    def dump(order: str) -> str:
        """A very long report."""
        return "line of the report " * 200

    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, call("dump", order="A")), "read it"])
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="p", model=model, tools=[dump])])
    app.run_agent("p", job_id="pv", messages=["report"]).wait(timeout=5)
    stored = next(m for m in app.messages("pv") if m["role"] == "tool")
    seen = next(m for m in model.calls[1].messages if m["role"] == "tool")
    assert len(stored["content"]) == len("line of the report ") * 200
    assert seen["content"].startswith(stored["content"][:50]) and "more characters not shown" in seen["content"]
    assert len(seen["content"]) < 120
    def echo(x: str) -> str:
        """Echo."""
        return x

    with pytest.raises(InvalidInputError, match="preview"):
        tool(preview=0)(echo)


def test_call_ids_stay_unique_in_the_whole_transcript_when_the_provider_repeats_them_past_a_compaction() -> None:
    def repeating(messages: list[dict[str, Any]]) -> Any:
        answer = script(messages)
        if isinstance(answer, dict) and answer.get("tool_calls"):
            answer["tool_calls"] = [{**c, "id": "call_0"} for c in answer["tool_calls"]]  # a provider that reuses ids
        return answer

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[agent(ScriptedModel(repeating))])
    assert app.run_agent("c", job_id="ids", messages=["count to 30"]).wait(timeout=10).status is JobStatus.COMPLETE
    ids = [c["id"] for m in app.messages("ids") for c in m.get("tool_calls") or []]
    assert len(ids) == TURNS and len(set(ids)) == TURNS  # idempotency keys and child jobs never collide


@pytest.mark.parametrize("kind", ["transient", "permanent"])
def test_a_failed_compaction_call_is_handled_as_the_turns_own_model_call(kind: str) -> None:
    # A 429 / 5xx in the summary call failed the job outright, where the turn's own call is run again later.
    from pipelines.engine.errors import PermanentModelError, TransientModelError

    error = (TransientModelError("unavailable for now: 503", retry_after=0.0) if kind == "transient"
             else PermanentModelError("bad request: 400"))
    failed: list[bool] = []

    def flaky(messages: list[dict[str, Any]]) -> Any:
        if not failed and messages[-1]["role"] == "user" and str(messages[-1]["content"]).startswith("Summarise"):
            failed.append(True)
            raise error
        return script(messages, turns=8)

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[agent(ScriptedModel(flaky), turns=8, max_tokens=300)])
    app.run_agent("c", job_id="f", messages=["count to 8"])
    view = app.handle("f").wait(timeout=10)
    assert failed
    if kind == "permanent":
        assert view.status is JobStatus.ERROR and view.record.error == "model error: bad request: 400"
        return
    assert view.status is JobStatus.COMPLETE and view.result == "done"
    assert any(MARKER_KEY in m for m in app.messages("f"))
