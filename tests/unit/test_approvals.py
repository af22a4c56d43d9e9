"""Human approval of tool calls (issue 7) on the memory adapters."""

from __future__ import annotations

from typing import Any

import pytest

from phases.approvals import approve, pending_calls, reject
from pipelines import Agent, JobStatus, tool
from pipelines.engine.errors import InvalidInputError, JobConflictError
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import memory

refunds: list[int] = []


@tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    refunds.append(amount)
    return f"refunded {amount} on {order}"


@tool(needs_approval=lambda args: args.amount > 100)
def small_refund(order: str, amount: int) -> str:
    """Refunds above 100 need a person."""
    refunds.append(amount)
    return f"refunded {amount}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    refunds.clear()


def start(*turns: Any, tools: Any = (refund,)) -> tuple[Any, Any, ScriptedModel]:
    storage, scheduler, _ = memory()
    model = ScriptedModel(list(turns))
    Agent(model=model, tools=list(tools)).run(job_id="r", messages=["refund please"], storage=storage,
                                              scheduler=scheduler)
    scheduler.drain()
    return storage, scheduler, model


def refund_call(amount: int = 50, cid: str = "c1") -> dict[str, Any]:
    return reply(None, {**call("refund", order="o-1", amount=amount), "id": cid})


def test_a_call_needing_approval_waits_with_the_pending_call_readable() -> None:
    storage, _, model = start(refund_call(), "done")
    job = storage.get_job("r")
    assert job.status is JobStatus.WAITING and refunds == []
    assert job.waiting["kind"] == "approval"
    (pending,) = pending_calls("r", storage=storage)
    assert {k: v for k, v in pending.items() if k != "digest"} == {
        "call_id": "c1", "tool": "refund", "arguments": '{"order": "o-1", "amount": 50}'}
    assert len(pending["digest"]) == 64  # what a decision on exactly these arguments passes back
    assert len(model.calls) == 1
    assert storage.messages("r") == [{"role": "user", "content": "refund please"}]  # nothing of the turn yet


def test_approve_runs_the_call_once_and_the_job_goes_on() -> None:
    storage, scheduler, model = start(refund_call(), "done")
    approve("r", "c1", storage=storage, scheduler=scheduler)
    scheduler.drain()
    job = storage.get_job("r")
    assert job.status is JobStatus.COMPLETE and refunds == [50]
    assert storage.messages("r")[2]["content"] == "refunded 50 on o-1"
    assert len(model.calls) == 2  # the approved turn reused its journaled model answer
    with pytest.raises(JobConflictError):
        approve("r", "c1", storage=storage, scheduler=scheduler)  # consumed: the job moved on


def test_reject_sends_the_reason_to_the_model_and_nothing_runs() -> None:
    storage, scheduler, model = start(refund_call(), "ok, no refund")
    reject("r", "c1", reason="amount too high for this customer", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert refunds == []
    tool_msg = storage.messages("r")[2]
    assert tool_msg["role"] == "tool" and "amount too high for this customer" in tool_msg["content"]
    assert "rejected" in model.calls[1].messages[2]["content"]
    assert storage.get_job("r").result == "ok, no refund"


def test_a_decision_taken_on_what_was_shown_is_refused_when_the_call_now_asks_something_else() -> None:
    # A stale page: the job was cancelled and retried from the start meanwhile, and the new turn's call got the
    # same id (providers reuse them) with other arguments. Deciding on the digest shown refuses it.
    storage, scheduler, _ = start(refund_call(50), refund_call(7000), "done")
    (shown,) = pending_calls("r", storage=storage)
    from pipelines.app import App

    app = App.for_adapters(storage, scheduler)  # the App the agent's run went through
    app.cancel("r")
    app.retry("r", mode="full")
    scheduler.drain()
    (now,) = pending_calls("r", storage=storage)
    assert now["call_id"] == shown["call_id"] and now["digest"] != shown["digest"]
    for decide in (lambda: approve("r", "c1", digest=shown["digest"], storage=storage, scheduler=scheduler),
                   lambda: reject("r", "c1", reason="no", digest=shown["digest"], storage=storage,
                                  scheduler=scheduler)):
        with pytest.raises(JobConflictError, match="asks something other than what was shown"):
            decide()
    assert storage.get_job("r").status is JobStatus.WAITING and refunds == []
    approve("r", "c1", digest=now["digest"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert refunds == [7000]


def test_an_approval_is_bound_to_the_exact_arguments_it_was_shown() -> None:
    storage, scheduler, _ = start(refund_call(50), "done")
    # The open turn's call changes (here: its journaled answer is edited, as a re-run would produce).
    rec = storage.get_job("r")
    storage.record_step("r", version=rec.version, owner=None, key="approval:c1",
                        value={"decision": "approved", "digest": "for-other-arguments"})
    storage.commit(_resume_commit(rec))
    scheduler.schedule_advance("r", pipeline="agent")
    scheduler.drain()
    assert storage.get_job("r").status is JobStatus.WAITING and refunds == []


def _resume_commit(rec: Any) -> Any:
    from pipelines.engine.models import Commit

    new = rec.model_copy(update={"status": JobStatus.RUNNING, "waiting": None, "version": rec.version + 1,
                                 "checkpoint": rec.checkpoint.model_copy(update={"version": rec.version + 1})})
    return Commit(job_id="r", expected_version=rec.version, token="t", record=new, keep_journal=True)


def test_needs_approval_can_be_a_function_of_the_arguments() -> None:
    small = reply(None, {**call("small_refund", order="o", amount=20), "id": "a"})
    storage, _, _ = start(small, "done", tools=[small_refund])
    assert storage.get_job("r").status is JobStatus.COMPLETE and refunds == [20]
    big = reply(None, {**call("small_refund", order="o", amount=500), "id": "b"})
    storage, _, _ = start(big, "done", tools=[small_refund])
    assert storage.get_job("r").status is JobStatus.WAITING and refunds == [20]


def test_bad_decisions_are_rejected_clearly() -> None:
    storage, scheduler, _ = start(refund_call(), "done")
    with pytest.raises(InvalidInputError, match="call 'nope'"):
        approve("r", "nope", storage=storage, scheduler=scheduler)
    with pytest.raises(InvalidInputError, match="non-empty reason"):
        reject("r", "c1", reason=" ", storage=storage, scheduler=scheduler)
    assert storage.get_job("r").status is JobStatus.WAITING


def test_several_calls_needing_approval_wait_for_every_decision() -> None:
    two = reply(None, {**call("refund", order="a", amount=1), "id": "x"},
                {**call("refund", order="b", amount=2), "id": "y"})
    storage, scheduler, _ = start(two, "done")
    assert [c["call_id"] for c in pending_calls("r", storage=storage)] == ["x", "y"]
    approve("r", "x", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("r").status is JobStatus.WAITING and refunds == []  # still one to decide
    assert [c["call_id"] for c in pending_calls("r", storage=storage)] == ["y"]
    with pytest.raises(JobConflictError, match="already approved"):
        approve("r", "x", storage=storage, scheduler=scheduler)
    reject("r", "y", reason="duplicate", storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("r").status is JobStatus.COMPLETE and refunds == [1]


def test_a_cancel_that_an_approval_overtakes_still_cancels() -> None:
    # The approval lands between the cancel's read and its write (two people on the page at once): the
    # cancel reads the job again and cancels it as it is now, not "changed during the cancel; try again".
    from adapters.memory import MemoryStorage
    from pipelines.engine.control import cancel_job

    storage, scheduler, _ = memory()
    real = MemoryStorage.commit

    def racing(self: MemoryStorage, commit: Any) -> Any:
        if commit.record.status is JobStatus.CANCELLED and racing.pending:  # type: ignore[attr-defined]
            racing.pending = False  # type: ignore[attr-defined]
            approve("r", "c1", storage=storage, scheduler=scheduler)
        return real(self, commit)

    racing.pending = True  # type: ignore[attr-defined]
    Agent(model=ScriptedModel([refund_call(), "done"]), tools=[refund]).run(
        job_id="r", messages=["refund please"], storage=storage, scheduler=scheduler)
    scheduler.drain()
    assert storage.get_job("r").status is JobStatus.WAITING
    storage.commit = racing.__get__(storage)  # type: ignore[method-assign]
    done = cancel_job("r", storage=storage, scheduler=scheduler, wait=1.0)
    assert not racing.pending  # type: ignore[attr-defined]  # the approval did overtake it
    assert done.status is JobStatus.CANCELLED and storage.get_job("r").status is JobStatus.CANCELLED
    scheduler.drain()
    assert refunds == [] and storage.get_job("r").status is JobStatus.CANCELLED  # the approved call never ran
