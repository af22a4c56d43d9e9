"""The agent loop on the memory adapters with a scripted model (issue 3)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from phases.model import ModelRequest
from pipelines import Agent, JobStatus, Tool, ToolContext, build_agent_phase, has_tool_call, max_turns, run_agent, tool
from pipelines.engine.errors import InvalidInputError, PermanentModelError, TransientModelError
from pipelines.engine.phase import FailJob
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import Crash, memory


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


def run(model: Any, *, tools: Any = (add,), job_id: str = "chat-1", **kw: Any) -> tuple[Any, Any]:
    storage, scheduler, _ = memory()
    run_agent(job_id=job_id, model=model, tools=tools, initial_messages=kw.pop("messages", ["what is 2+3?"]),
              storage=storage, scheduler=scheduler, **kw)
    scheduler.drain()
    return storage, scheduler


def test_a_tool_turn_then_an_answer_completes_with_a_valid_transcript() -> None:
    model = ScriptedModel([reply(None, call("add", a=2, b=3)), "It is 5."])
    storage, _ = run(model, system="You add numbers.")
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE and job.result == "It is 5."
    msgs = storage.messages("chat-1")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[3] == {"role": "tool", "tool_call_id": msgs[2]["tool_calls"][0]["id"], "content": '{"sum": 5}'}
    # The system prompt is pinned as the conversation's first message, and sent once on every call.
    assert msgs[0] == {"role": "system", "content": "You add numbers."}
    assert model.calls[0].messages[0] == {"role": "system", "content": "You add numbers."}
    assert [m["role"] for m in model.calls[1].messages].count("system") == 1
    assert model.calls[0].tools[0]["function"]["name"] == "add"
    assert job.usage.model_calls == 2


def test_run_agent_only_writes_and_enqueues() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel(["hi"])
    run_agent(job_id="a", model=model, initial_messages=["hello"], storage=storage, scheduler=scheduler)
    assert model.calls == [] and scheduler.pending() == 1
    assert storage.messages("a") == [{"role": "user", "content": "hello"}]


def test_a_crash_after_the_model_step_does_not_call_the_model_again() -> None:
    storage, scheduler, _ = memory()
    ran: list[int] = []
    crash = {"armed": True}

    @tool
    def slow_add(a: int, b: int) -> int:
        """Add, then the worker dies once."""
        ran.append(a)
        if crash["armed"]:
            crash["armed"] = False
            raise Crash()
        return a + b

    model = ScriptedModel([reply(None, call("slow_add", a=1, b=1)), "2"])
    run_agent(job_id="c", model=model, tools=[slow_add], initial_messages=["1+1"], storage=storage,
              scheduler=scheduler)
    with pytest.raises(Crash):
        scheduler.run_next()
    assert len(model.calls) == 1
    assert storage.messages("c") == [{"role": "user", "content": "1+1"}]  # nothing of the turn is visible (I4)
    scheduler.schedule_advance("c", pipeline="agent")  # the sweep or a redelivery
    scheduler.drain()
    assert len(model.calls) == 2  # once for turn 1 (journaled, reused), once for turn 2
    assert ran == [1, 1]  # the tool died inside its call, so it ran again (policy: retry)
    assert storage.get_job("c").status is JobStatus.COMPLETE


def test_a_finished_tool_is_not_run_again_after_a_crash() -> None:
    storage, scheduler, _ = memory()
    effects: list[str] = []
    crash = {"armed": True}

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        effects.append(to)
        return "sent"

    @tool
    def checkpoint_then_die() -> str:
        """Dies after send_email has finished."""
        if crash["armed"] and effects:
            crash["armed"] = False
            raise Crash()
        return "ok"

    model = ScriptedModel([reply(None, call("send_email", to="a@b.c")), reply(None, call("checkpoint_then_die")),
                           "done"])
    run_agent(job_id="e", model=model, tools=[send_email, checkpoint_then_die], initial_messages=["go"],
              storage=storage, scheduler=scheduler)
    scheduler.run_next()  # turn 1: send_email, committed
    with pytest.raises(Crash):
        scheduler.run_next()
    scheduler.schedule_advance("e", pipeline="agent")
    scheduler.drain()
    assert effects == ["a@b.c"]
    assert len(model.calls) == 3


def test_tools_get_the_job_id_and_an_idempotency_key() -> None:
    seen: list[tuple[str, str]] = []

    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card."""
        seen.append((ctx.job_id, ctx.idempotency_key))
        return "ok"

    model = ScriptedModel([reply(None, {**call("charge", amount=5), "id": "call_abc"}), "charged"])
    run(model, tools=[charge], job_id="pay-7")
    assert seen == [("pay-7", "pay-7/call_abc")]


def test_several_sync_tool_calls_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=5)

    @tool
    def wait_for_others(i: int) -> int:
        """Returns only when all three calls are running at once."""
        barrier.wait()
        return i

    model = ScriptedModel([reply(None, *(call("wait_for_others", i=i) for i in range(3))), "ok"])
    storage, _ = run(model, tools=[wait_for_others])
    assert [m["content"] for m in storage.messages("chat-1")[2:5]] == ["0", "1", "2"]
    assert storage.get_job("chat-1").status is JobStatus.COMPLETE


def test_async_tools_run_concurrently_on_one_loop() -> None:
    state: dict[str, Any] = {"running": 0, "peak": 0}

    @tool
    async def fetch(url: str) -> str:
        """Fetch a URL."""
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
        await asyncio.sleep(0.05)
        state["running"] -= 1
        return url.upper()

    model = ScriptedModel([reply(None, call("fetch", url="a"), call("fetch", url="b")), "ok"])
    storage, _ = run(model, tools=[fetch])
    assert state["peak"] == 2
    assert [m["content"] for m in storage.messages("chat-1")[2:4]] == ["A", "B"]


def test_tool_definitions_from_functions_and_explicit_form() -> None:
    class Lookup(BaseModel):
        order_id: str

    explicit = Tool(name="lookup", description="Find an order.", input_model=Lookup,
                    execute=lambda args, ctx: {"order": args.order_id, "job": ctx.job_id})
    schema = add.schema()["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two integers."
    assert schema["parameters"]["properties"]["a"]["type"] == "integer"
    assert schema["parameters"]["required"] == ["a", "b"]
    model = ScriptedModel([reply(None, call("lookup", order_id="o-1"), call("add", a=1, b=2)), "ok"])
    storage, _ = run(model, tools={"lookup": explicit, "add": add})
    contents = [json.loads(m["content"]) for m in storage.messages("chat-1")[2:4]]
    assert contents == [{"order": "o-1", "job": "chat-1"}, {"sum": 3}]


@pytest.mark.parametrize(
    ("bad_call", "expected"),
    [
        (call("add", "{not json"), "not valid JSON"),
        (call("add", a="x", b=1), "invalid arguments for tool 'add'"),
        (call("add", a=1), "b: Field required"),
        (call("subtract", a=1, b=1), "unknown tool 'subtract'; available tools: add"),
    ],
)
def test_bad_tool_calls_go_back_to_the_model_which_corrects_itself(bad_call: dict[str, Any], expected: str) -> None:
    model = ScriptedModel([reply(None, bad_call), reply(None, call("add", a=2, b=3)), "5"])
    storage, _ = run(model)
    msgs = storage.messages("chat-1")
    assert msgs[2]["role"] == "tool" and expected in msgs[2]["content"]
    assert msgs[2]["content"].startswith("Error:")
    assert msgs[4]["content"] == '{"sum": 5}'
    assert storage.get_job("chat-1").status is JobStatus.COMPLETE


def test_a_tool_that_raises_is_reported_to_the_model_and_in_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    # Only the model was told: the job's log and the process's log said nothing, and no traceback was anywhere.
    @tool
    def flaky() -> str:
        """Always fails."""
        raise ValueError("backend down")

    model = ScriptedModel([reply(None, call("flaky")), "sorry"])
    with caplog.at_level("WARNING", logger="pipelines"):
        storage, _ = run(model, tools=[flaky])
    assert storage.messages("chat-1")[2]["content"] == "Error: tool 'flaky' raised ValueError: backend down"
    assert storage.get_job("chat-1").status is JobStatus.COMPLETE
    logged = [r for r in caplog.records if "tool 'flaky'" in r.getMessage()]
    # A warning; the traceback only at DEBUG (its chained causes may quote a secret the message leaves out).
    assert len(logged) == 1 and logged[0].exc_info is None and "chat-1" in logged[0].getMessage()
    caplog.clear()
    with caplog.at_level("DEBUG", logger="pipelines"):
        run(ScriptedModel([reply(None, call("flaky")), "sorry"]), tools=[flaky])
    logged = [r for r in caplog.records if "tool 'flaky'" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None and str(logged[0].exc_info[1]) == "backend down"
    lines = [e for e in storage.logs("chat-1") if "raised ValueError" in e.message]
    assert len(lines) == 1 and lines[0].level == "warn" and "call 'call_0_0'" in lines[0].message


def test_a_tool_can_fail_the_job_on_purpose() -> None:
    @tool
    def refund(amount: int) -> str:
        """Refund."""
        raise FailJob(f"refund of {amount} needs a human")

    model = ScriptedModel([reply(None, call("refund", amount=500))])
    storage, _ = run(model, tools=[refund])
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.ERROR and job.error == "refund of 500 needs a human"
    assert job.checkpoint is not None  # kept for a retry


def test_max_turns_completes_with_a_warning() -> None:
    model = ScriptedModel(lambda msgs: reply(None, call("add", a=1, b=1)))
    storage, _ = run(model, max_turns=3)
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE
    assert len(model.calls) == 3
    warn = [e for e in storage.logs("chat-1") if e.level == "warn"]
    assert warn and "max_turns" in warn[0].message


def test_a_truncated_answer_completes_with_a_warning_and_a_valid_transcript() -> None:
    model = ScriptedModel([{**reply("partial", call("add", a=1, b=1)), "finish_reason": "length"}])
    storage, _ = run(model)
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE and job.result == "partial"
    assert any("truncated" in e.message and e.level == "warn" for e in storage.logs("chat-1"))
    msgs = storage.messages("chat-1")
    assert msgs[-1]["role"] == "tool" and "truncated" in msgs[-1]["content"]


def test_stop_when_helpers_and_callables_combine() -> None:
    @tool
    def final_answer(text: str) -> str:
        """Give the final answer."""
        return text

    loop = ScriptedModel(lambda msgs: reply(None, call("add", a=1, b=1)))
    storage, _ = run(loop, stop_when=[max_turns(2)], max_turns=10)
    assert len(loop.calls) == 2

    finisher = ScriptedModel([reply(None, call("add", a=1, b=1)), reply(None, call("final_answer", text="42"))])
    storage, _ = run(finisher, tools=[add, final_answer], stop_when=[has_tool_call("final_answer")])
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE and job.result == "42"
    assert any("has_tool_call('final_answer')" in e.message for e in storage.logs("chat-1"))

    by_state = ScriptedModel(lambda msgs: reply(None, call("add", a=1, b=1)))
    run(by_state, stop_when=lambda turn: turn.state.turn >= 3)
    assert len(by_state.calls) == 4  # stops after the turn whose starting state had turn == 3


def test_a_completed_conversation_goes_on_with_new_messages() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel(["Hello!", "Your name is Ada."])
    agent = Agent(name="chat", model=model)
    agent.run(job_id="conv", messages=["Hi, I am Ada"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    agent.run(job_id="conv", messages=["What is my name?"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    msgs = storage.messages("conv")
    assert [m["content"] for m in msgs] == ["Hi, I am Ada", "Hello!", "What is my name?", "Your name is Ada."]
    assert [m["content"] for m in model.calls[1].messages] == ["Hi, I am Ada", "Hello!", "What is my name?"]
    assert storage.get_job("conv").result == "Your name is Ada."


def test_usage_accumulates_over_turns_and_retried_attempts() -> None:
    attempts = {"n": 0}

    class Flaky(ScriptedModel):
        def complete(self, request: ModelRequest) -> Any:
            attempts["n"] += 1
            if attempts["n"] == 2:
                raise TransientModelError("rate limited", retry_after=3)
            return super().complete(request)

    model = Flaky([reply(None, call("add", a=1, b=2)), "3"])
    storage, _ = run(model)
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE
    assert job.usage.model_calls == 2
    assert job.usage.prompt_tokens > 0 and job.usage.completion_tokens > 0
    assert any("retrying phase in 3.0s" in e.message for e in storage.logs("chat-1"))


def test_transient_model_errors_give_up_after_max_attempts() -> None:
    class Down:
        def complete(self, request: ModelRequest) -> Any:
            raise TransientModelError("503 from provider")

    storage, scheduler, _ = memory()
    phase = build_agent_phase(model=Down(), max_model_attempts=3)
    from pipelines import run_pipeline

    run_pipeline(job_id="down", phases=[phase], storage=storage, scheduler=scheduler, initial_state={},
                 pipeline="agent")
    scheduler.drain()
    job = storage.get_job("down")
    assert job.status is JobStatus.ERROR and "3 times" in job.error and "503" in job.error


def test_permanent_model_errors_fail_the_job_and_resume_retries_the_turn() -> None:
    outcomes: list[Any] = [PermanentModelError("context window exceeded"), "recovered"]

    class Model:
        def complete(self, request: ModelRequest) -> Any:
            nxt = outcomes.pop(0)
            if isinstance(nxt, Exception):
                raise nxt
            return ScriptedModel([nxt]).complete(request)

    storage, scheduler, _ = memory()
    agent = Agent(model=Model())
    agent.run(job_id="p", messages=["hi"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("p")
    assert job.status is JobStatus.ERROR and job.error == "model error: context window exceeded"
    agent.run(job_id="p", storage=storage, scheduler=scheduler)  # resume
    scheduler.drain()
    assert storage.get_job("p").result == "recovered"


def test_provider_fields_survive_the_round_trip() -> None:
    model = ScriptedModel([reply(None, call("add", a=1, b=1), reasoning_content="think", thinking_blocks=[{"t": 1}]),
                           "2"])
    storage, _ = run(model)
    assistant = storage.messages("chat-1")[1]
    assert assistant["reasoning_content"] == "think" and assistant["thinking_blocks"] == [{"t": 1}]
    assert model.calls[1].messages[1]["reasoning_content"] == "think"


def test_model_params_never_reach_storage() -> None:
    storage, scheduler, _ = memory()
    model = ScriptedModel(["ok"])
    run_agent(job_id="s", model=model, model_params={"api_key": "sk-SENTINEL-123"},
              initial_messages=["hi"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("s").status is JobStatus.COMPLETE
    dumped = json.dumps(storage.inspect("s"))
    assert "SENTINEL" not in dumped


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_max_turns_must_be_positive(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="max_turns"):
        Agent(model=ScriptedModel([]), max_turns=bad)


def test_duplicate_tool_names_and_unsupported_signatures_are_rejected() -> None:
    with pytest.raises(InvalidInputError, match="duplicate tool name 'add'"):
        Agent(model=ScriptedModel([]), tools=[add, add])
    with pytest.raises(InvalidInputError, match=r"\*args"):
        tool(lambda *args: None)
    with pytest.raises(InvalidInputError, match="needs a type annotation"):

        @tool
        def untyped(x) -> None:  # type: ignore[no-untyped-def]
            """No annotation."""

    with pytest.raises(InvalidInputError, match="not a Tool"):
        Agent(model=ScriptedModel([]), tools=[lambda: None])  # type: ignore[list-item]


def test_a_worker_that_runs_the_next_turn_reads_no_history_but_never_a_stale_one() -> None:
    storage, scheduler, _ = memory()
    reads: list[tuple[int, int | None]] = []
    real = storage.messages

    def counting(job_id: str, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        reads.append((start, stop))
        return real(job_id, start, stop)

    storage.messages = counting  # type: ignore[method-assign]
    model = ScriptedModel(lambda msgs: reply(None, call("add", a=len(msgs), b=0)) if len(msgs) < 7 else "ok")
    agent = Agent(model=model, max_turns=10, tools=[add])
    agent.run(job_id="h", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert len(reads) == 1  # only the first turn read the transcript from storage
    assert [len(c.messages) for c in model.calls] == [1, 3, 5, 7]
    # Another writer (here: a full retry that cuts the transcript back) invalidates the cache.
    agent.run(job_id="h", storage=storage, scheduler=scheduler, retry_mode="full")
    scheduler.drain()
    assert len(reads) == 2
    assert [len(c.messages) for c in model.calls[4:]] == [1, 3, 5, 7]


def test_the_history_cache_is_bounded_by_messages_and_drops_finished_jobs() -> None:
    from phases.history_cache import HistoryCache

    cache = HistoryCache(size=10, max_messages=5)
    hooks: list[Any] = []

    class Ctx:
        def __init__(self, job_id: str) -> None:
            self.job_id = job_id

        def on_commit(self, fn: Any, *, reads_only: bool = False) -> None:
            hooks.append(fn)

    class Cp:
        commit_id = "c"
        transcript_epoch = "e"

    for job in ("a", "b", "c"):
        cache.remember_after_commit(Ctx(job), [{"role": "user", "content": job}] * 2, frozenset())  # type: ignore[arg-type]
        hooks.pop()(Cp())
    assert list(cache._entries) == ["b", "c"] and cache._held == 4  # "a" went: 6 messages > 5
    cache.forget("b")
    assert list(cache._entries) == ["c"] and cache._held == 2


def test_an_agent_says_whether_workers_should_preload_litellm() -> None:
    assert Agent(model=ScriptedModel(["x"])).uses_litellm is False
    assert Agent(model="openai/gpt-4o-mini").uses_litellm is True


def test_an_answer_stopped_by_the_content_filter_ends_the_run_saying_so_and_runs_none_of_its_calls() -> None:
    ran: list[int] = []

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        ran.append(amount)
        return "charged"

    model = ScriptedModel([{**reply("I will cha", call("charge", amount=5)), "finish_reason": "content_filter"}])
    storage, _ = run(model, tools=[charge])
    job = storage.get_job("chat-1")
    assert job.status is JobStatus.COMPLETE and job.stop_reason == "content_filter" and job.result == "I will cha"
    assert ran == []  # arguments of a filtered answer are not acted on
    assert any("content filter" in e.message and e.level == "warn" for e in storage.logs("chat-1"))
    msgs = storage.messages("chat-1")
    assert msgs[-1]["role"] == "tool" and "content filter" in msgs[-1]["content"]
    assert len(model.calls) == 1


def test_a_filtered_answer_without_calls_is_no_plain_done() -> None:
    storage, _ = run(ScriptedModel([{**reply("Sorry"), "finish_reason": "content_filter"}]))
    assert storage.get_job("chat-1").stop_reason == "content_filter"
