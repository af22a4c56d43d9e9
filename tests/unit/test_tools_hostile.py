"""Tool calls that must not collide, hang or poison the worker: ids, keys, exceptions, names, timeouts."""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryStorage
from phases.approvals import record_tool_result
from phases.model import ModelResponse
from phases.tool_runner import run_tools
from phases.tools import tool_map
from pipelines import Agent, JobStatus, Tool, ToolContext, run_pipeline, tool
from pipelines.engine.errors import InvalidInputError, PermanentModelError
from pipelines.engine.phase import Done, Phase, PhaseContext
from pipelines.testing import ScriptedModel, SimulatedCrash, call, reply, transcript_problems
from tests.unit.helpers import Crash, memory, run_scripted

seen_keys: list[str] = []


@tool
def echo(text: str, ctx: ToolContext) -> str:
    """Echo the text; remembers the idempotency key it ran under."""
    seen_keys.append(ctx.idempotency_key)
    return f"echo:{text}"


@tool
async def aecho(text: str) -> str:
    """Echo, async."""
    await asyncio.sleep(0)
    return f"aecho:{text}"


def with_id(c: dict[str, Any], cid: Any) -> dict[str, Any]:
    return {**c, "id": cid}


run = run_scripted


def answers(storage: MemoryStorage, job_id: str = "j") -> dict[str, str]:
    """Tool results by call id, after checking the transcript answers every call once, in order."""
    msgs = storage.messages(job_id)
    assert transcript_problems(msgs) == []
    return {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}


def assistant_ids(storage: MemoryStorage, job_id: str = "j") -> list[str]:
    return [c["id"] for m in storage.messages(job_id) if m["role"] == "assistant" for c in m.get("tool_calls") or []]


@pytest.fixture(autouse=True)
def _clear_keys() -> Iterator[None]:
    seen_keys.clear()
    yield
    seen_keys.clear()


# --- 1. call ids unique before anything is journaled; malformed calls answered --------------------------


def test_two_calls_with_the_same_id_each_get_their_own_result_and_key() -> None:
    storage = run([reply(None, with_id(call("echo", text="A"), "dup"), with_id(call("echo", text="B"), "dup")),
                   "ok"], [echo])
    ids = assistant_ids(storage)
    assert ids[0] == "dup" and len(set(ids)) == 2
    assert answers(storage) == {ids[0]: "echo:A", ids[1]: "echo:B"}
    assert sorted(seen_keys) == sorted(f"j/{i}" for i in ids)
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_a_missing_id_never_takes_an_id_the_provider_gave_another_call() -> None:
    storage = run([reply(None, with_id(call("echo", text="A"), ""), with_id(call("echo", text="B"), "call_0_0")),
                   "ok"], [echo])
    ids = assistant_ids(storage)
    assert ids[1] == "call_0_0" and ids[0] != "call_0_0" and ids[0]
    assert answers(storage) == {ids[0]: "echo:A", "call_0_0": "echo:B"}


def test_an_id_used_in_an_earlier_turn_is_renamed_so_keys_stay_distinct() -> None:
    storage = run([reply(None, with_id(call("echo", text="A"), "c1")),
                   reply(None, with_id(call("echo", text="B"), "c1")), "ok"], [echo])
    ids = assistant_ids(storage)
    assert ids[0] == "c1" and ids[1] != "c1"
    assert answers(storage) == {"c1": "echo:A", ids[1]: "echo:B"}
    assert seen_keys == ["j/c1", f"j/{ids[1]}"]


def test_the_fixed_ids_are_journaled_so_a_rerun_after_a_crash_answers_the_same_ids() -> None:
    armed = {"on": True}

    @tool
    def fragile(text: str) -> str:
        """Dies mid-call the first time."""
        if armed["on"]:
            armed["on"] = False
            raise Crash()
        return f"fragile:{text}"

    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, with_id(call("echo", text="A"), "dup"),
                                 with_id(call("fragile", text="B"), "dup")), "ok"])
    Agent(model=model, tools=[echo, fragile]).run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    with pytest.raises(Crash):
        scheduler.run_next()
    journaled = storage.inspect("j")["journal"]["model"]["message"]["tool_calls"]
    scheduler.schedule_advance("j", pipeline="agent")  # the sweep finds the job due again
    scheduler.drain()
    ids = assistant_ids(storage)
    assert ids == [c["id"] for c in journaled] and len(set(ids)) == 2
    assert answers(storage) == {ids[0]: "echo:A", ids[1]: "fragile:B"}
    assert len(model.calls) == 2  # the crashed turn's answer was replayed, not asked again


@pytest.mark.parametrize(
    ("tool_calls", "expected"),
    [
        pytest.param(["echo"], "names no tool", id="call-not-a-dict"),
        pytest.param([5], "names no tool", id="call-is-a-number"),
        pytest.param([{"function": "echo"}], "names no tool", id="function-not-a-dict"),
        pytest.param([{"function": {"name": ["echo"], "arguments": "{}"}}], "names no tool", id="name-not-a-string"),
        pytest.param([{"function": {"name": "echo", "arguments": 123}}], "must be a JSON object", id="arguments-123"),
        pytest.param([{"function": {"name": "echo", "arguments": ["A"]}}], "must be a JSON object",
                     id="arguments-list"),
        pytest.param([{"function": {"name": "echo", "arguments": '{"text": ' + "[" * 5000 + "]" * 5000 + "}"}}],
                     "nest lists/objects too deeply", id="arguments-nested-past-the-parser"),
    ],
)
def test_malformed_calls_become_errors_the_model_reads(tool_calls: Any, expected: str) -> None:
    storage = run([{"role": "assistant", "content": None, "tool_calls": tool_calls}, "ok"], [echo])
    (content,) = answers(storage).values()
    assert content.startswith("Error:") and expected in content
    assert seen_keys == []
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


@pytest.mark.parametrize("tool_calls", [
    pytest.param({"id": "c1", "function": {"name": "echo", "arguments": "{\"text\": \"A\"}"}}, id="one-dict"),
    pytest.param("echo", id="a-string"),
    pytest.param({}, id="an-empty-dict"),
    pytest.param("", id="an-empty-string"),
])
def test_tool_calls_that_are_not_a_list_fail_the_job_naming_tool_calls_and_run_nothing(tool_calls: Any) -> None:
    # Not coerced: list() makes a dict its keys and a string its characters, and wrapping one bare
    # call hides the broken model adapter. The job ends as data (status error, a readable reason).
    storage = run([{"role": "assistant", "content": None, "tool_calls": tool_calls}, "ok"], [echo])
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert "tool_calls as a " + type(tool_calls).__name__ in str(job.error) and "expected a list" in str(job.error)
    assert seen_keys == [] and [m["role"] for m in storage.messages("j")] == ["user"]
    with pytest.raises(PermanentModelError, match="tool_calls as a"):
        _ = ModelResponse(message={"role": "assistant", "tool_calls": tool_calls}).tool_calls


def test_arguments_given_as_an_object_are_stored_as_text_and_run() -> None:
    # A dict is what the model meant; the transcript keeps the JSON text a provider expects back.
    storage = run([{"role": "assistant", "content": None,
                    "tool_calls": [{"id": "c1", "function": {"name": "echo", "arguments": {"text": "A"}}}]}, "ok"],
                  [echo])
    assert answers(storage) == {"c1": "echo:A"}
    sent = storage.messages("j")[1]["tool_calls"][0]["function"]["arguments"]
    assert isinstance(sent, str) and json.loads(sent) == {"text": "A"}


# --- 2. idempotency keys are unambiguous ----------------------------------------------------------------


def test_idempotency_keys_of_different_job_and_call_pairs_differ() -> None:
    one = ToolContext(job_id="a:b", call_id="c", tool_name="t").idempotency_key
    other = ToolContext(job_id="a", call_id="b:c", tool_name="t").idempotency_key
    assert one != other
    assert (one, other) == ("a:b/c", "a/b:c")


# --- 3. whatever a tool raises stays in its call; the thread is clean for the next job -------------------


def raising(exc: BaseException, *, is_async: bool) -> Tool:
    if is_async:
        async def bad_async() -> str:
            """Raises."""
            await asyncio.sleep(0)
            raise exc

        return tool(bad_async, name="bad")

    def bad() -> str:
        """Raises."""
        raise exc

    return tool(bad, name="bad")


def second_job_succeeds() -> None:
    """Job B, next in this thread, with other storage and good tools (sync and async, several calls)."""
    storage = run([reply(None, call("echo", text="x"), call("aecho", text="y")), reply(None, call("echo", text="z")),
                   "fine"], [echo, aecho], job_id="b")
    job = storage.get_job("b")
    assert job is not None and job.status is JobStatus.COMPLETE and job.result == "fine"
    assert sorted(answers(storage, "b").values()) == ["aecho:y", "echo:x", "echo:z"]


CONTAINED = [
    pytest.param(SystemExit("from job A"), "SystemExit: from job A", id="SystemExit"),
    pytest.param(asyncio.CancelledError("from job A"), "CancelledError: from job A", id="CancelledError"),
    pytest.param(GeneratorExit("from job A"), "GeneratorExit: from job A", id="GeneratorExit"),
    pytest.param(ValueError("from job A"), "ValueError: from job A", id="ValueError"),
    pytest.param(BaseExceptionGroup("from job A", [SystemExit(1)]), "BaseExceptionGroup: from job A (1 sub-exception)",
                 id="BaseExceptionGroup"),
]


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async"])
@pytest.mark.parametrize("calls", [1, 3], ids=["one-call", "three-calls"])
@pytest.mark.parametrize(("exc", "text"), CONTAINED)
def test_what_a_tool_raises_is_reported_to_the_model_and_the_next_job_is_clean(
    exc: BaseException, text: str, is_async: bool, calls: int
) -> None:
    storage = run([reply(None, *(call("bad") for _ in range(calls))), "sorry"],
                  [raising(exc, is_async=is_async)], job_id="a")
    assert list(answers(storage, "a").values()) == [f"Error: tool 'bad' raised {text}"] * calls
    assert storage.get_job("a").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    second_job_succeeds()


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async"])
@pytest.mark.parametrize("calls", [1, 3], ids=["one-call", "three-calls"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt("stop"), SimulatedCrash("killed"), Crash()],
                         ids=["KeyboardInterrupt", "SimulatedCrash", "test-Crash"])
def test_process_ending_exceptions_propagate_and_leave_the_thread_clean(
    exc: BaseException, is_async: bool, calls: int
) -> None:
    storage, scheduler, _ = memory()
    Agent(model=ScriptedModel([reply(None, *(call("bad") for _ in range(calls))), "sorry"]),
          tools=[raising(exc, is_async=is_async)]).run(job_id="a", messages=["go"], storage=storage,
                                                       scheduler=scheduler)
    with pytest.raises(type(exc)):
        scheduler.drain()
    second_job_succeeds()


def test_a_signal_stopping_the_loop_mid_turn_cancels_what_is_left_of_that_turn() -> None:
    seen: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt("Ctrl-C")  # what the loop's signal handling does on SIGINT

    @tool
    async def waits(n: int) -> str:
        """Waits for an event nobody sets; a signal arrives meanwhile."""
        if n == 0:
            asyncio.get_running_loop().call_soon(interrupt)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append(f"cancelled {n}")
            raise
        return "never"

    storage, scheduler, _ = memory()
    Agent(model=ScriptedModel([reply(None, call("waits", n=0), call("waits", n=1))]), tools=[waits]).run(
        job_id="a", messages=["go"], storage=storage, scheduler=scheduler)
    with pytest.raises(KeyboardInterrupt):
        scheduler.drain()
    assert sorted(seen) == ["cancelled 0", "cancelled 1"]  # nothing of job A left to run inside job B
    second_job_succeeds()


def test_tasks_a_tool_leaves_behind_do_not_run_inside_the_next_job() -> None:
    wake: list[asyncio.Event] = []
    seen: list[str] = []

    async def stray() -> None:
        try:
            await wake[0].wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        raise SystemExit("stray task of job A")

    @tool
    async def spawns() -> str:
        """Starts a background task and returns."""
        wake.append(asyncio.Event())
        asyncio.get_running_loop().create_task(stray())
        return "started"

    @tool
    async def wakes() -> str:
        """Job B's tool sets the event the stray task waits for."""
        if wake:
            wake[0].set()
        await asyncio.sleep(0)
        return "woke"

    storage = run([reply(None, call("spawns"), call("spawns")), "ok"], [spawns], job_id="a")
    assert list(answers(storage, "a").values()) == ["started", "started"]
    assert seen == ["cancelled", "cancelled"]
    storage = run([reply(None, call("wakes"), call("wakes")), "fine"], [wakes], job_id="b")
    assert storage.get_job("b").status is JobStatus.COMPLETE  # type: ignore[union-attr]


# --- 4. parameter names pydantic reserves are refused ---------------------------------------------------


@pytest.mark.parametrize("pname", ["model_config", "_x", "model_dump", "model_fields", "model_extra", "json",
                                   "copy", "dict", "schema", "validate", "construct"])
def test_parameter_names_pydantic_reserves_are_refused_when_the_tool_is_defined(pname: str) -> None:
    def f(**kwargs: Any) -> int:
        """A function whose one parameter is called ``pname``."""
        return 1

    # The signature and annotations of `def f(<pname>: int) -> int`, without generating source.
    f.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int)], return_annotation=int)
    f.__annotations__ = {pname: int, "return": int}
    with pytest.raises(InvalidInputError, match=f"parameter name '{pname}' is reserved"):
        tool(f)


def test_a_context_parameter_may_have_any_name_and_ordinary_names_stay_allowed() -> None:
    @tool
    def fine(fields: int, title: str, _ctx: ToolContext) -> str:
        """Names pydantic does not reserve."""
        return f"{fields}{title}{_ctx.call_id}"

    assert sorted(fine.schema()["function"]["parameters"]["properties"]) == ["fields", "title"]


# --- 5. timeouts ----------------------------------------------------------------------------------------


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # releases every abandoned thread


def blocking(gate: threading.Event, **options: Any) -> Tool:
    def slow(n: int = 0) -> str:
        """Blocks until the gate opens."""
        gate.wait()
        return "late"

    return tool(slow, **options)


def test_a_hung_sync_tool_times_out_and_the_model_is_told(gate: threading.Event) -> None:
    storage = run([reply(None, with_id(call("slow"), "c1")), "ok"], [blocking(gate, timeout=0.05)])
    assert answers(storage) == {"c1": "Error: tool 'slow' timed out after 0.05 s"}
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_a_hung_async_tool_times_out_and_is_cancelled() -> None:
    seen: list[str] = []

    @tool(timeout=0.05)
    async def stuck() -> str:
        """Awaits an event nobody sets."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "never"

    storage = run([reply(None, with_id(call("stuck"), "c1"), with_id(call("aecho", text="x"), "c2")), "ok"],
                  [stuck, aecho])
    assert answers(storage) == {"c1": "Error: tool 'stuck' timed out after 0.05 s", "c2": "aecho:x"}
    assert seen == ["cancelled"]


def test_hung_calls_never_hold_the_shared_pool(gate: threading.Event) -> None:
    # More hung calls than the pool has threads: were they on the pool, job B's
    # three calls could never run at the same time and its barrier would break.
    storage = run([reply(None, *(call("slow", n=i) for i in range(20))), "ok"], [blocking(gate, timeout=0.05)],
                  job_id="a")
    assert set(answers(storage, "a").values()) == {"Error: tool 'slow' timed out after 0.05 s"}
    barrier = threading.Barrier(3, timeout=10)

    @tool
    def together(i: int) -> int:
        """Returns once all three calls are running at once."""
        barrier.wait()
        return i

    storage = run([reply(None, *(call("together", i=i) for i in range(3))), "ok"], [together], job_id="b")
    assert sorted(answers(storage, "b").values()) == ["0", "1", "2"]


def test_a_timed_out_call_of_a_fail_tool_fails_the_job(gate: threading.Event) -> None:
    storage = run([reply(None, with_id(call("slow"), "c1")), "ok"], [blocking(gate, idempotent=False, timeout=0.05)])
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.ERROR
    assert "timed out after 0.05 s" in (job.error or "") and "record_tool_result" in (job.error or "")


def test_a_timed_out_call_of_an_ask_tool_waits_for_its_outcome(gate: threading.Event) -> None:
    storage, scheduler, _ = memory()
    Agent(model=ScriptedModel([reply(None, with_id(call("slow"), "c1")), "ok"]),
          tools=[blocking(gate, idempotent=False, on_interrupted="ask", timeout=0.05)]).run(
        job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("j")
    assert job is not None and job.status is JobStatus.WAITING and job.waiting is not None
    assert job.waiting["call_id"] == "c1"
    record_tool_result("j", "c1", "done by hand", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert answers(storage) == {"c1": "done by hand"}
    assert storage.get_job("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]


@pytest.mark.parametrize(("found", "expected"), [
    ("charged (found)", "charged (found)"),
    (None, "Error: tool 'slow' timed out after 0.05 s; reconcile found no effect of it yet"),
])
def test_a_timed_out_call_of_a_reconcile_tool_asks_reconcile(gate: threading.Event, found: str | None,
                                                             expected: str) -> None:
    asked: list[str] = []

    def reconcile(args: Any, ctx: ToolContext) -> str | None:
        asked.append(ctx.idempotency_key)
        return found

    t = blocking(gate, idempotent=False, on_interrupted="reconcile", reconcile=reconcile, timeout=0.05)
    storage = run([reply(None, with_id(call("slow"), "c1")), "ok"], [t])
    assert asked == ["j/c1"]
    assert answers(storage) == {"c1": expected}


def test_a_timeout_error_the_tool_raises_itself_is_not_taken_for_a_timeout() -> None:
    @tool(timeout=30)
    def remote() -> str:
        """Its socket timed out."""
        raise TimeoutError("socket read")

    storage = run([reply(None, with_id(call("remote"), "c1")), "ok"], [remote])
    assert answers(storage) == {"c1": "Error: tool 'remote' raised TimeoutError: socket read"}


def test_run_tools_applies_its_default_timeout_to_tools_without_one(gate: threading.Event) -> None:
    slow = blocking(gate)
    own = blocking(gate, name="own", timeout=0.02)

    def phase(ctx: PhaseContext[Any]) -> Done:
        calls = [with_id(call("slow"), "c1"), with_id(call("own"), "c2")]
        msgs = run_tools(ctx, tool_map([slow, own]), calls, 0, default_timeout=0.05)
        return Done(result=[m["content"] for m in msgs])

    storage, scheduler, _ = memory()
    run_pipeline(job_id="p", phases=[Phase("tools", phase)], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("p").result == [  # type: ignore[union-attr]
        "Error: tool 'slow' timed out after 0.05 s", "Error: tool 'own' timed out after 0.02 s"]


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, True, "5"])
def test_timeouts_must_be_finite_positive_seconds(bad: Any) -> None:
    def quick() -> str:
        """Returns at once."""
        return "ok"

    with pytest.raises(InvalidInputError, match="tool 'quick': timeout must be a finite number of seconds"):
        tool(quick, timeout=bad)
    with pytest.raises(InvalidInputError, match="tool 'quick': timeout must be"):
        Tool(name="quick", description="", input_model=echo.input_model, execute=quick, timeout=bad)
    with pytest.raises(InvalidInputError, match="default_timeout must be a finite number"):
        run_tools(None, {}, [], 0, default_timeout=bad)  # type: ignore[arg-type]


# --- 6. a result that is not JSON is named as such ------------------------------------------------------


@pytest.mark.parametrize("value", [{1, 2}, object()], ids=["set", "object"])
def test_a_tool_returning_a_value_that_is_not_json_says_so(value: Any) -> None:
    @tool
    def odd() -> Any:
        """Returns something JSON cannot carry."""
        return value

    storage = run([reply(None, with_id(call("odd"), "c1")), "ok"], [odd])
    content = answers(storage)["c1"]
    assert content.startswith("Error: tool 'odd' returned a value that is not JSON: ")
    assert "raised" not in content


@pytest.mark.parametrize("empty", [[], None], ids=["empty-list", "null"])
def test_an_empty_tool_calls_field_is_taken_out_of_the_answer(empty: Any) -> None:
    # OpenAI refuses an assistant message with "tool_calls": [] when the transcript is sent back.
    from phases.tool_calls import normalise_tool_calls

    answer = {"role": "assistant", "content": "hi", "tool_calls": empty}
    assert normalise_tool_calls(answer, 0) == {"role": "assistant", "content": "hi"}
    plain = {"role": "assistant", "content": "hi"}
    assert normalise_tool_calls(plain, 0) is plain
