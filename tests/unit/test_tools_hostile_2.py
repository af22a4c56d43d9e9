"""More hostile tool calls: what a tool raises or returns, what a model sends, and the ledger after a signal.

Each case once failed the whole job (or the next attempt) where the tool runner's promise is an error
message the model reads and a transcript that answers every call once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapters.memory import MemoryStorage
from pipelines import Agent, JobStatus, ToolContext, tool
from pipelines.engine import models
from pipelines.engine.errors import JobConflictError
from pipelines.engine.phase import RetryLater
from pipelines.testing import ScriptedModel, call, crash_test, reply, transcript_problems
from tests.unit.helpers import memory
from tests.unit.helpers import run_scripted as run


def result(storage: MemoryStorage, job_id: str = "j") -> str:
    """The one tool result of the job, after checking it completed with a transcript that answers every call."""
    rec = storage.get_job(job_id)
    assert rec is not None and rec.status is JobStatus.COMPLETE, rec and rec.error
    msgs = storage.messages(job_id)
    assert transcript_problems(msgs) == []
    [content] = [m["content"] for m in msgs if m["role"] == "tool"]
    return str(content)


class Unspeakable(Exception):  # noqa: N818 - named for what it does
    def __str__(self) -> str:
        raise RuntimeError("no words")


@tool
def mute(x: int) -> str:
    """Raises an exception whose message cannot be read."""
    raise Unspeakable


def test_an_exception_whose_message_cannot_be_read_is_still_the_models_error_message() -> None:
    got = result(run([reply(None, call("mute", x=1)), "done"], [mute]))
    assert got == "Error: tool 'mute' raised Unspeakable: (its message could not be read: RuntimeError)"


@tool
def echo(text: str) -> str:
    """Echo."""
    return text


def test_a_result_holding_a_lone_surrogate_is_an_error_message_not_the_jobs_end() -> None:
    got = result(run([reply(None, call("echo", '{"text": "a\\ud800b"}')), "done"], [echo]))
    assert got.startswith("Error: tool 'echo' returned a value that is not JSON") and "lone surrogate" in got


def test_an_int_too_long_to_read_in_the_arguments_is_the_models_to_fix() -> None:
    got = result(run([reply(None, call("echo", '{"text": "a", "n": 1' + "0" * 5000 + "}")), "done"], [echo]))
    assert got.startswith("Error: arguments for tool 'echo' are not valid JSON: Exceeds the limit")
    assert got.endswith("Fix the arguments and call the tool again.")


def test_arguments_a_model_adapter_nested_too_deeply_to_write_are_the_models_to_fix() -> None:
    deep: Any = 1
    for _ in range(100_000):
        deep = {"a": deep}
    answer = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "echo", "arguments": deep}}]}
    got = result(run([answer, "done"], [echo]))
    assert got.startswith("Error: arguments for tool 'echo'")


@tool
def huge(x: int) -> str:
    """A result larger than storage keeps."""
    return "x" * (models.MAX_VALUE_BYTES + 10)


def test_a_result_too_large_to_keep_tells_the_model_instead_of_failing_the_job_that_ran_it() -> None:
    got = result(run([reply(None, call("huge", x=1)), "done"], [huge]))
    assert got.startswith("Error: tool 'huge' ran, but its result could not be kept: ")
    assert "MiB limit" in got and got.endswith("Ask for less.")


def _refuses(args: Any) -> bool:
    return 1 / 0 > 0


@tool(needs_approval=_refuses)
def pay(amount: int) -> str:
    """Pay."""
    return "paid"


def test_a_needs_approval_hook_that_raises_fails_the_job_naming_the_tool_and_the_hook() -> None:
    storage = run([reply(None, {**call("pay", amount=5), "id": "c1"}), "done"], [pay])
    rec = storage.get_job("j")
    assert rec is not None and rec.status is JobStatus.ERROR
    assert rec.error == "needs_approval of tool 'pay' raised ZeroDivisionError for call c1: division by zero"


charges: list[int] = []


@tool(idempotent=False)
def charge(x: int) -> str:
    """Charges; the payment API asks to be called later the first time."""
    charges.append(x)
    if len(charges) == 1:
        raise RetryLater(1.0, "rate limited")
    return "charged"


def test_a_tool_that_asks_to_run_later_runs_again_and_is_not_taken_for_interrupted() -> None:
    # Its on_interrupted policy is "fail" (not idempotent): a call left "started" would end the job as unknown.
    charges.clear()
    got = result(run([reply(None, call("charge", x=1)), "done"], [charge]))
    assert got == "charged" and charges == [1, 1]


@tool(idempotent=False)
def ship(x: int) -> str:
    """Ships."""
    return f"shipped {x}"


def test_a_crash_around_a_call_whose_arguments_never_parsed_runs_it_again_whatever_its_policy() -> None:
    def script(msgs: list[dict[str, Any]]) -> Any:
        if any(m["role"] == "tool" for m in msgs):
            return "done"
        return reply(None, {**call("ship", '{"x": "zz"}'), "id": "s"}, {**call("echo", text="a"), "id": "e"})

    def start(storage: Any, scheduler: Any) -> None:
        Agent(model=ScriptedModel(script), tools=[ship, echo]).run(job_id="t", messages=["hi"], storage=storage,
                                                                   scheduler=scheduler)

    report = crash_test(start, job_id="t", policies={"ship": "fail"})
    assert report.clean_status == "complete"
    assert [(r.point.operation, r.problems) for r in report.results if r.problems] == []
    # Between "started" and its result the call never reached its tool: it runs again (the model reads why).
    interrupted = [r for r in report.results if r.point.operation == "record_step:tool:s" and r.point.when == "before"]
    assert interrupted and all(r.status == "complete" for r in interrupted)
    shipped = next(m for m in report.clean_transcript if m.get("tool_call_id") == "s")
    assert json.dumps(shipped).count("Fix the arguments") == 1


def test_a_call_abandoned_past_its_timeout_stays_unknown_until_a_person_records_it() -> None:
    import threading

    from phases.approvals import record_tool_result
    from pipelines.lowlevel import run_agent

    release, runs = threading.Event(), []

    @tool(idempotent=False, timeout=0.05)
    def wire(amount: int) -> str:
        """Wires money; hangs past its timeout."""
        runs.append(amount)
        release.wait(5)
        return "wired"

    storage, scheduler, _ = memory()
    model = ScriptedModel([reply(None, {**call("wire", amount=5), "id": "c1"}), "done"])
    run_agent(job_id="w", model=model, tools=[wire], messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    try:
        rec = storage.get_job("w")
        assert rec is not None and rec.status is JobStatus.ERROR
        assert "whether it took effect is unknown" in str(rec.error)
        # A resume without the outcome must not run it again: its policy ("fail") applies to it as interrupted.
        run_agent(job_id="w", model=model, tools=[wire], storage=storage, scheduler=scheduler, retry_mode="resume")
        scheduler.drain()
        rec = storage.get_job("w")
        assert rec is not None and rec.status is JobStatus.ERROR and runs == [5]
        record_tool_result("w", "c1", "wired, says the bank", storage=storage, scheduler=scheduler)
        run_agent(job_id="w", model=model, tools=[wire], storage=storage, scheduler=scheduler, retry_mode="resume")
        scheduler.drain()
        assert result(storage, "w") == "wired, says the bank" and runs == [5]
    finally:
        release.set()


@tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refunds."""
    return "refunded"


def test_a_result_is_recorded_only_for_a_call_cut_off_mid_call_not_one_that_never_started() -> None:
    from phases.approvals import approve, record_tool_result

    storage, scheduler, _ = memory()
    charged: list[int] = []

    @tool(idempotent=False)
    def bill(amount: int) -> str:
        """Bills."""
        charged.append(amount)
        return "billed"

    Agent(model=ScriptedModel([reply(None, {**call("refund", amount=5), "id": "c1"},
                                     {**call("bill", amount=7), "id": "c2"}), "done"]),
          tools=[refund, bill]).run(job_id="r", messages=["go"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    with pytest.raises(JobConflictError, match="call 'c2' of job 'r' was not interrupted: it never started"):
        record_tool_result("r", "c2", "I say it was billed", storage=storage, scheduler=scheduler)
    approve("r", "c1", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert charged == [7]  # it ran, as the job went on


def test_a_tool_that_asks_for_the_context_twice_or_maybe_is_refused_when_defined() -> None:
    from pipelines.engine.errors import InvalidInputError

    def twice(x: int, first: ToolContext, second: ToolContext) -> str:
        """Two contexts: the second would be a required argument nobody gives."""
        return "x"

    def maybe(x: int, ctx: ToolContext | None = None) -> str:
        """An optional context: pydantic would make a field of it."""
        return "x"

    with pytest.raises(InvalidInputError, match="parameters 'first' and 'second' both ask for the ToolContext"):
        tool(twice)
    with pytest.raises(InvalidInputError, match="ask for the context as 'ctx: ToolContext'"):
        tool(maybe)


def test_a_reconcile_that_asks_to_be_called_later_reconciles_again_and_never_reruns_the_abandoned_call() -> None:
    import threading

    from pipelines.engine.phase import RetryLater as Later

    release, runs, checks = threading.Event(), [], []

    def reconcile(args: Any, ctx: Any) -> str:
        checks.append(1)
        if len(checks) == 1:
            raise Later(1.0, "the bank's API is busy")
        return "the bank says: wired once"

    @tool(idempotent=False, on_interrupted="reconcile", reconcile=reconcile, timeout=0.05)
    def wire(amount: int) -> str:
        """Wires money; hangs past its timeout."""
        runs.append(amount)
        release.wait(5)
        return "wired"

    try:
        got = result(run([reply(None, {**call("wire", amount=5), "id": "c1"}), "done"], [wire]))
    finally:
        release.set()
    assert got == "the bank says: wired once" and runs == [5] and len(checks) == 2


def test_a_needs_approval_hook_that_asks_to_be_called_later_is_asked_again() -> None:
    from pipelines.engine.phase import RetryLater as Later

    asked: list[int] = []

    def busy_once(args: Any) -> bool:
        asked.append(1)
        if len(asked) == 1:
            raise Later(1.0, "the policy service is busy")
        return False

    @tool(needs_approval=busy_once)
    def pay2(amount: int) -> str:
        """Pays."""
        return "paid"

    assert result(run([reply(None, call("pay2", amount=5)), "done"], [pay2])) == "paid" and len(asked) == 2


def test_crash_test_tells_a_tools_own_error_text_from_the_runners_argument_error() -> None:
    @tool(idempotent=False)
    def pay3(amount: int) -> str:
        """Its own refusal reads like the runner's argument error."""
        return "Error: amount over the limit. Fix the arguments and call the tool again."

    def script(msgs: list[dict[str, Any]]) -> Any:
        return "done" if any(m["role"] == "tool" for m in msgs) else reply(None, {**call("pay3", amount=5), "id": "p"})

    def start(storage: Any, scheduler: Any) -> None:
        Agent(model=ScriptedModel(script), tools=[pay3]).run(job_id="t", messages=["hi"], storage=storage,
                                                             scheduler=scheduler)

    report = crash_test(start, job_id="t", policies={"pay3": "fail"})
    assert [(r.point.operation, r.problems) for r in report.results if r.problems] == []


def test_a_call_made_again_after_a_full_retry_gets_an_idempotency_key_of_its_own() -> None:
    # A provider that gives its calls no ids: the ids made for them were numbered by the run's turn, so after a
    # full retry (the transcript cut back) the new call got an old call's id, and its idempotency key: an API
    # deduplicating on it would have skipped the second charge.
    from phases.model import ModelRequest, ModelResponse
    from pipelines.app import App

    keys: list[tuple[str, int]] = []

    @tool(idempotent=False)
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charges."""
        keys.append((ctx.idempotency_key, amount))
        return "charged"

    amounts = iter([50, 7000])

    class NoIds:
        def complete(self, request: ModelRequest) -> ModelResponse:
            if request.messages[-1]["role"] == "tool":
                return ModelResponse(message={"role": "assistant", "content": "done"})
            call_without_id = {"type": "function", "function": {"name": "charge",
                                                                "arguments": f'{{"amount": {next(amounts)}}}'}}
            return ModelResponse(message={"role": "assistant", "content": None, "tool_calls": [call_without_id]})

    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=NoIds(), tools=[charge])])
    app.run_agent("a", job_id="k", user="pay")
    scheduler.drain()
    app.retry("k", mode="full")
    scheduler.drain()
    assert [amount for _, amount in keys] == [50, 7000]
    assert keys[0][0] != keys[1][0], keys


@pytest.mark.parametrize("calls", [1, 2], ids=["inline", "concurrent"])
def test_a_result_whose_tool_message_is_too_large_to_commit_tells_the_model(monkeypatch: pytest.MonkeyPatch,
                                                                           calls: int) -> None:
    # The bare result fitted its journal step, the tool message around it not the commit: the job failed, and a
    # resume replayed the journaled result into the same failure for good.
    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 64 * 1024)

    @tool
    def near(x: int) -> str:
        """A result just under the storage limit."""
        return "x" * (models.MAX_VALUE_BYTES - 10)

    ids = [f"call-{'i' * 60}-{n}" for n in range(calls)]
    storage = run([reply(None, *[{**call("near", x=n), "id": i} for n, i in enumerate(ids)]), "done"], [near])
    rec = storage.get_job("j")
    assert rec is not None and rec.status is JobStatus.COMPLETE, rec and rec.error
    msgs = storage.messages("j")
    assert transcript_problems(msgs) == []
    for m in (m for m in msgs if m["role"] == "tool"):
        assert m["content"].startswith("Error: tool 'near' ran, but its result could not be kept: the tool message ")
        assert "MiB limit" in m["content"] and m["content"].endswith("Ask for less.")


def test_a_journaled_result_too_large_for_its_tool_message_no_longer_fails_every_resume(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A result an earlier version journaled (it checked only the step): the commit failed, and so did each resume.
    import phases.tool_runner.calls as calls

    monkeypatch.setattr(models, "MAX_VALUE_BYTES", 64 * 1024)

    @tool
    def near(x: int) -> str:
        """A result just under the storage limit."""
        return "x" * (models.MAX_VALUE_BYTES - 10)

    storage, scheduler, _ = memory()
    agent = Agent(model=ScriptedModel([reply(None, {**call("near", x=1), "id": "c1"}), "done"]), tools=[near])
    with monkeypatch.context() as old:
        old.setattr(calls, "storable_result", lambda call, content: content)  # as the version before the check
        old.setattr("phases.tool_runner.execute.storable_result", lambda call, content: content)
        agent.run(job_id="j", messages=["go"], storage=storage, scheduler=scheduler)
        scheduler.drain()
    rec = storage.get_job("j")
    assert rec is not None and rec.status is JobStatus.ERROR and "could not be committed" in (rec.error or "")
    agent.run(job_id="j", storage=storage, scheduler=scheduler, retry_mode="resume")
    scheduler.drain()
    got = result(storage)
    assert got.startswith("Error: tool 'near' ran, but its result could not be kept: the tool message answering ")
