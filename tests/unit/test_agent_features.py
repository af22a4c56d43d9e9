"""Structured output, budgets and the prepare_turn hook (issue 7) on the memory adapters."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from phases.model import ModelRequest
from pipelines import Agent, JobStatus, TurnPlan, tool
from pipelines.engine.errors import InvalidInputError
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory


class Weather(BaseModel):
    city: str
    celsius: float


@tool
def forecast(city: str) -> dict[str, Any]:
    """Today's forecast for a city."""
    return {"city": city, "celsius": 21.5}


def go(agent: Agent, job_id: str = "w") -> tuple[Any, Any]:
    storage, scheduler, _ = memory()
    agent.run(job_id=job_id, messages=["Weather in Oslo?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    return storage, storage.get_job(job_id)


def test_without_tools_the_provider_is_asked_for_json_and_the_result_is_an_instance() -> None:
    model = ScriptedModel(['{"city": "Oslo", "celsius": 3}'])
    agent = Agent(model=model, output_schema=Weather)
    storage, job = go(agent)
    assert model.calls[0].response_format is Weather
    assert job.status is JobStatus.COMPLETE and job.result == {"city": "Oslo", "celsius": 3.0}
    assert agent.result("w", storage=storage) == Weather(city="Oslo", celsius=3)


def test_with_tools_no_response_format_is_sent_and_a_follow_up_asks_for_the_object() -> None:
    model = ScriptedModel([reply(None, call("forecast", city="Oslo")), "It is 21.5 degrees in Oslo.",
                           '```json\n{"city": "Oslo", "celsius": 21.5}\n```'])
    agent = Agent(model=model, tools=[forecast], output_schema=Weather)
    storage, job = go(agent)
    assert [c.response_format for c in model.calls] == [None, None, Weather]
    assert model.calls[2].tools == []  # the follow-up offers no tools
    assert job.status is JobStatus.COMPLETE and job.result == {"city": "Oslo", "celsius": 21.5}
    roles = [m["role"] for m in storage.messages("w")]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_valid_json_in_the_final_answer_needs_no_follow_up() -> None:
    model = ScriptedModel([reply(None, call("forecast", city="Oslo")), '{"city": "Oslo", "celsius": 21.5}'])
    _, job = go(Agent(model=model, tools=[forecast], output_schema=Weather))
    assert len(model.calls) == 2 and job.result == {"city": "Oslo", "celsius": 21.5}


def test_an_answer_that_still_does_not_validate_fails_the_job_with_the_text() -> None:
    model = ScriptedModel(["sunny, I think", "still not json"])
    _, job = go(Agent(model=model, output_schema=Weather))
    assert job.status is JobStatus.ERROR
    assert "does not validate against Weather" in job.error and "still not json" in job.error


def test_per_call_output_schema_on_run_agent() -> None:
    from pipelines import run_agent

    storage, scheduler, _ = memory()
    run_agent(job_id="r", model=ScriptedModel(['{"city": "Rome", "celsius": 30}']), output_schema=Weather,
              initial_messages=["?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("r").result == {"city": "Rome", "celsius": 30.0}


def test_a_token_budget_stops_the_job_and_is_counted_across_runs() -> None:
    model = ScriptedModel(lambda msgs: reply("x" * 400, call("forecast", city="Oslo")))
    agent = Agent(model=model, tools=[forecast], max_turns=50, max_tokens=300)
    storage, job = go(agent)
    assert job.status is JobStatus.COMPLETE and job.stop_reason == "budget"
    assert job.usage.total_tokens >= 300
    assert any("max_tokens=300" in e.message and e.level == "warn" for e in storage.logs("w"))
    calls = len(model.calls)
    assert calls < 50
    # Continuing the conversation: the budget already spent still counts, so no model call is made.
    scheduler_storage = storage
    from adapters.memory import MemoryScheduler

    scheduler = MemoryScheduler()
    agent.run(job_id="w", messages=["more?"], storage=scheduler_storage, scheduler=scheduler)
    scheduler.drain()
    assert len(model.calls) == calls
    assert scheduler_storage.get_job("w").stop_reason == "budget"


def test_a_cost_budget_stops_the_job() -> None:
    from phases.model import ModelResponse
    from pipelines import Usage

    def priced(msgs: list[dict[str, Any]]) -> ModelResponse:
        msg = reply(None, {**call("forecast", city="Oslo"), "id": f"c{len(msgs)}"})
        return ModelResponse(message=msg, finish_reason="tool_calls", usage=Usage(cost_usd=0.4, model_calls=1))

    _, job = go(Agent(model=ScriptedModel(priced), tools=[forecast], max_turns=20, max_cost_usd=1.0))
    assert job.stop_reason == "budget" and job.usage.cost_usd == pytest.approx(1.2)


def test_prepare_turn_changes_tools_messages_and_params_for_one_turn() -> None:
    @tool
    def secret() -> str:
        """Not offered after the first turn."""
        return "s"

    seen: list[TurnPlan] = []

    def prepare(plan: TurnPlan) -> TurnPlan:
        seen.append(plan)
        if plan.turn >= 1:
            plan.tools = [t for t in plan.tools if t.name != "secret"]
            plan.messages = [*plan.messages, {"role": "user", "content": "be brief"}]
            plan.params = {**plan.params, "temperature": 0}
        return plan

    model = ScriptedModel([reply(None, call("forecast", city="Oslo")), reply(None, call("secret")), "done"])
    storage, job = go(Agent(model=model, tools=[forecast, secret], prepare_turn=prepare, model_params={"seed": 1}))
    assert [len(c.tools) for c in model.calls] == [2, 1, 1]
    assert model.calls[1].messages[-1] == {"role": "user", "content": "be brief"}
    assert model.calls[1].params == {"seed": 1, "temperature": 0}
    # The model called a tool it was not offered: it gets an error, not an execution.
    assert "unknown tool 'secret'" in storage.messages("w")[4]["content"]
    # The hook's changes are for the call only: the transcript keeps no "be brief".
    assert all(m.get("content") != "be brief" for m in storage.messages("w"))
    assert job.status is JobStatus.COMPLETE and [p.turn for p in seen] == [0, 1, 2]


def test_prepare_turn_cannot_add_tools_the_agent_does_not_have() -> None:
    @tool
    def other() -> str:
        """Not the agent's."""
        return ""

    def prepare(plan: TurnPlan) -> TurnPlan:
        plan.tools = [*plan.tools, other]
        return plan

    _, job = go(Agent(model=ScriptedModel(["x"]), tools=[forecast], prepare_turn=prepare))
    assert job.status is JobStatus.ERROR and "does not have: ['other']" in job.error


@pytest.mark.parametrize("kw", [{"max_tokens": 0}, {"max_cost_usd": -1}, {"output_schema": dict},
                                {"prepare_turn": 3}])
def test_bad_feature_options_are_rejected(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        Agent(model=ScriptedModel([]), **kw)


def test_model_objects_see_the_response_format_field() -> None:
    assert ModelRequest(messages=[]).response_format is None


def test_a_runs_options_resolve_to_one_config_per_distinct_options_and_bad_ones_fail_every_time() -> None:
    import pydantic

    from phases.agent_config import AgentConfig

    @tool
    def ping(x: int) -> int:
        """Echo."""
        return x

    cfg = AgentConfig(model=ScriptedModel([]), tools=[ping], max_turns=5)
    tagged = cfg.for_run({"tags": ["a"]}, {})
    # Options that change no field leave the agent's own config, with its tool map (and schemas) as built.
    assert tagged is cfg and tagged.tmap is cfg.tmap
    longer = cfg.for_run({"max_turns": 9, "tags": ["a"]}, {})
    assert longer.max_turns == 9 and cfg.max_turns == 5
    assert cfg.for_run({"tags": ["a"], "max_turns": 9}, {}) is longer  # the same options, in another order
    assert cfg.for_run({"max_turns": 3}, {}).max_turns == 3
    for _ in range(2):  # an error is not remembered as an answer
        with pytest.raises(pydantic.ValidationError, match="max_turns"):
            cfg.for_run({"max_turns": 0}, {})


def test_a_run_whose_options_rebuild_the_config_does_not_rebuild_the_tool_schemas_each_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from phases.tools import Tool

    @tool
    def ping(x: int) -> int:
        """Echo."""
        return x

    from pipelines import App

    storage, scheduler, _ = memory()
    turns = [reply("", call("ping", x=i)) for i in range(3)] + ["done"]
    app = App(storage=storage, scheduler=scheduler,
              agents=[Agent(name="a", model=ScriptedModel(turns), tools=[ping], max_turns=5)])
    built: list[str] = []
    real = Tool.schema

    def counting(self: Tool) -> dict[str, Any]:
        built.append(self.name)
        return real(self)

    monkeypatch.setattr(Tool, "schema", counting)
    app.run_agent("a", job_id="j", messages=["go"], max_turns=8)  # an option that changes the config
    app.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.COMPLETE and job.phases_done == 4
    assert job.options.get("max_turns") == 8
    assert built == []  # the agent's schemas, built with it, served every one of the 4 turns


def _failing_once(script: list[Any], fails: Any, error: Exception) -> Any:
    """A model script that answers ``script`` in order, but raises ``error`` the first time ``fails(messages)``."""
    answers = iter(script)
    failed: list[bool] = []

    def answer(messages: list[dict[str, Any]]) -> Any:
        if fails(messages) and not failed:
            failed.append(True)
            raise error
        return next(answers)
    return answer


def _is_follow_up(messages: list[dict[str, Any]]) -> bool:
    return str(messages[-1].get("content")).startswith("Now reply with only a JSON object")


@pytest.mark.parametrize("kind", ["transient", "permanent"])
def test_a_failed_structured_follow_up_is_handled_as_the_turns_own_model_call(kind: str) -> None:
    # A 429 / 5xx in the follow-up failed the job outright, where the turn's own call is run again later.
    from pipelines.engine.errors import PermanentModelError, TransientModelError

    error = (TransientModelError("unavailable for now: 503", retry_after=0.0) if kind == "transient"
             else PermanentModelError("bad request: 400"))
    model = ScriptedModel(_failing_once([reply(None, call("forecast", city="Oslo")), "It is 21.5 degrees.",
                                         '{"city": "Oslo", "celsius": 21.5}'], _is_follow_up, error))
    storage, job = go(Agent(model=model, tools=[forecast], output_schema=Weather, stream=False))
    if kind == "permanent":
        assert job.status is JobStatus.ERROR and job.error == "model error: bad request: 400"
        return
    assert job.status is JobStatus.COMPLETE and job.result == {"city": "Oslo", "celsius": 21.5}
    assert len(model.calls) == 4  # the turn's answer and the tool's result were journaled: only the follow-up again
    assert [m["role"] for m in storage.messages("w")] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert job.usage.model_calls == 3


def test_a_structured_follow_up_failing_past_max_model_attempts_fails_the_job() -> None:
    from pipelines.engine.errors import TransientModelError

    def answer(messages: list[dict[str, Any]]) -> Any:
        if _is_follow_up(messages):
            raise TransientModelError("unavailable for now: 503", retry_after=0.0)
        return "It is 21.5 degrees."

    _, job = go(Agent(model=ScriptedModel(answer), output_schema=Weather, max_model_attempts=2, stream=False))
    assert job.status is JobStatus.ERROR
    assert job.error.startswith("the structured-output call failed 2 times, last: unavailable for now: 503")


@pytest.mark.parametrize("content", ['{"city": "Oslo", "celsius": 21.5}', None], ids=["with-text", "calls-only"])
def test_tool_calls_in_the_structured_follow_up_are_dropped_not_left_unanswered(content: str | None) -> None:
    # No tools are offered to the follow-up: a call it makes anyway stayed in the transcript unanswered, and the
    # provider refused every later request of the conversation.
    from pipelines.testing import transcript_problems

    model = ScriptedModel([reply(None, call("forecast", city="Oslo")), "It is 21.5 degrees.",
                           reply(content, call("forecast", city="Rome"))])
    storage, job = go(Agent(model=model, tools=[forecast], output_schema=Weather, stream=False))
    messages = storage.messages("w")
    assert transcript_problems(messages) == []
    logs = [entry.message for entry in storage.logs("w") if entry.level == "warn"]
    assert any("called tools ['forecast'] though none were offered" in line for line in logs), logs
    if content is None:  # no text to validate: the job fails saying so (a failed turn appends none of its messages)
        assert job.status is JobStatus.ERROR and "does not validate against Weather" in job.error
        return
    assert job.status is JobStatus.COMPLETE and job.result == {"city": "Oslo", "celsius": 21.5}
    assert messages[-1] == {"role": "assistant", "content": content}
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
