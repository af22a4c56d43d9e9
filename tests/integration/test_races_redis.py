"""Races on a real redis-server: two people deciding one call, two people recording one outcome.

Each race releases two threads together (``threading.Barrier``) on a fresh
job, many times over: exactly one caller wins, the other is told who did,
and the job goes on as the winner decided (the tool runs at most once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, JobStatus, tool
from pipelines.app import App
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.redis

TRIES = 20


class Crash(BaseException):
    """Stands for the process dying inside a tool: not an Exception, so nothing inside catches it."""


wired: list[str] = []  # one entry per run of the approval-gated wire tool (job id)
charged: list[str] = []  # one entry per run of the charge tool (job id)
armed: set[str] = set()  # job ids whose next charge "dies" mid-call, after its effect


def _wire(job: str) -> str:
    """Send money (not idempotent: it must never run twice)."""
    wired.append(job)
    return f"sent for {job}"


wire = tool(_wire, name="wire", needs_approval=True, idempotent=False)


def _charge(job: str) -> str:
    charged.append(job)
    if job in armed:
        armed.discard(job)
        raise Crash()
    return f"charged {job}"


def _note(job: str) -> str:
    """Write a note (runs fine; its result is journaled before the charge)."""
    return f"noted {job}"


note = tool(_note, name="note", idempotent=False)


charge_ask = tool(_charge, name="charge_ask", description="Charge (ask a person if interrupted).",
                  idempotent=False, on_interrupted="ask")
charge_fail = tool(_charge, name="charge_fail", description="Charge (fail if interrupted).", idempotent=False)


def _job_of(messages: list[Message]) -> str:
    return str(messages[0]["content"]).split()[-1]


def _model(*tools: str) -> Callable[[list[Message]], Message]:
    """First turn: one call per tool named (ids c0, c1, ...) with the job id; then "done"."""

    def answer(messages: list[Message]) -> Message:
        if any(m["role"] == "tool" for m in messages):
            return reply("done")
        job = _job_of(messages)
        return reply(None, *({**call(name, job=job), "id": f"c{i}"} for i, name in enumerate(tools)))

    return answer


@pytest.fixture
def app(redis_url: str) -> Iterator[App]:
    storage = RedisStorage.from_url(redis_url, prefix="races")
    # A real queue nobody consumes: the test drives every advance itself.
    scheduler = RQScheduler.for_storage(storage, queue="races")
    agents = [
        Agent(name="desk", model=ScriptedModel(_model("wire")), tools=[wire]),
        Agent(name="ask", model=ScriptedModel(_model("note", "charge_ask")), tools=[note, charge_ask]),
        Agent(name="fail", model=ScriptedModel(_model("charge_fail")), tools=[charge_fail]),
    ]
    wired.clear()
    charged.clear()
    armed.clear()
    yield App(storage=storage, scheduler=scheduler, agents=agents)
    storage.close()


def race(first: Callable[[], Any], second: Callable[[], Any]) -> list[Any]:
    """Run both at once (released by a barrier); each slot holds the return value or the exception raised."""
    barrier = threading.Barrier(2)
    out: list[Any] = [None, None]

    def run(i: int, fn: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def drive(app: App, job_id: str, limit: int = 10) -> JobStatus:
    """Advance the job (as the sweep would) until it stops running."""
    for _ in range(limit):
        app.advance_due()
        view = app.get(job_id)
        assert view is not None
        if view.status is not JobStatus.RUNNING:
            return view.status
    pytest.fail(f"job {job_id} still running after {limit} sweeps")


def waiting_for_approval(app: App, job_id: str) -> None:
    app.run_agent("desk", job_id=job_id, messages=[f"pay {job_id}"])
    app.advance(job_id)
    view = app.get(job_id)
    assert view is not None and view.status is JobStatus.WAITING
    assert [c["call_id"] for c in view.pending_calls] == ["c0"]


def decision_events(app: App, job_id: str) -> list[str]:
    return [e.type for e in app.events(job_id) if e.type in ("call_approved", "call_rejected")]


@pytest.mark.parametrize("second", ["approve", "reject"])
def test_two_concurrent_decisions_on_one_call_one_wins(app: App, second: str) -> None:
    decide: dict[str, Callable[[str], Any]] = {"approve": lambda j: app.approve(j, "c0"),
              "reject": lambda j: app.reject(j, "c0", reason="payee unknown")}
    winners: set[str] = set()
    for i in range(TRIES):
        job_id = f"race-{second}-{i}"
        waiting_for_approval(app, job_id)
        out = race(partial(decide["approve"], job_id), partial(decide[second], job_id))
        kinds = ["approve", second]
        ok = [k for k, o in zip(kinds, out, strict=True) if not isinstance(o, BaseException)]
        lost = [o for o in out if isinstance(o, BaseException)]
        assert len(ok) == 1 and len(lost) == 1, out
        winner = {"approve": "approved", "reject": "rejected"}[ok[0]]
        winners.add(winner)
        assert isinstance(lost[0], JobConflictError), lost[0]
        assert f"already {winner}" in str(lost[0])
        assert decision_events(app, job_id) == [f"call_{winner}"]

        assert drive(app, job_id) is JobStatus.COMPLETE
        assert wired.count(job_id) == (1 if winner == "approved" else 0)
        tool_msgs = [m["content"] for m in app.messages(job_id) if m["role"] == "tool"]
        assert len(tool_msgs) == 1
        if winner == "approved":
            assert tool_msgs[0] == f"sent for {job_id}"
        else:
            assert "payee unknown" in tool_msgs[0]
        assert decision_events(app, job_id) == [f"call_{winner}"]
    assert len(wired) == len(set(wired))  # no job's wire ran twice


def interrupted(app: App, agent: str, job_id: str) -> None:
    """Start ``job_id`` and let its charge "die" mid-call, then advance again: the interrupt policy applies."""
    armed.add(job_id)
    app.run_agent(agent, job_id=job_id, messages=[f"pay {job_id}"])
    with pytest.raises(Crash):
        app.advance(job_id)
    app.advance(job_id)  # the lease was released; the policy (ask / fail) decides now


def snapshot(app: App, job_id: str) -> tuple[Any, ...]:
    record = app.storage.get_job(job_id)
    assert record is not None and record.checkpoint is not None
    cp = record.checkpoint
    return record.version, record.status, dict(cp.inputs), dict(cp.journal), app.messages(job_id)


def test_record_tool_result_refuses_a_call_that_already_has_a_result(app: App) -> None:
    interrupted(app, "ask", "rec-has")
    view = app.get("rec-has")
    assert view is not None and view.status is JobStatus.WAITING
    before = snapshot(app, "rec-has")
    with pytest.raises(JobConflictError, match=r"'c0'.*already has a result"):
        app.record_tool_result("rec-has", "c0", "overwritten")
    assert snapshot(app, "rec-has") == before
    # The interrupted call still takes its outcome, and the first call keeps its real one.
    app.record_tool_result("rec-has", "c1", "charged by hand")
    assert drive(app, "rec-has") is JobStatus.COMPLETE
    assert [m["content"] for m in app.messages("rec-has") if m["role"] == "tool"] == [
        "noted rec-has", "charged by hand"]
    assert charged == ["rec-has"]  # the interrupted charge never ran again


def test_record_tool_result_refuses_a_call_awaiting_approval(app: App) -> None:
    waiting_for_approval(app, "rec-appr")
    before = snapshot(app, "rec-appr")
    with pytest.raises(JobConflictError, match=r"'c0'.*awaits an approval"):
        app.record_tool_result("rec-appr", "c0", "done by hand")
    assert snapshot(app, "rec-appr") == before
    view = app.get("rec-appr")
    assert view is not None and [c["call_id"] for c in view.pending_calls] == ["c0"]
    assert wired == []


@pytest.mark.parametrize("policy", ["ask", "fail"])
def test_two_concurrent_record_tool_results_one_wins(app: App, policy: str) -> None:
    call_id = {"ask": "c1", "fail": "c0"}[policy]
    expected = {"ask": JobStatus.WAITING, "fail": JobStatus.ERROR}[policy]
    for i in range(TRIES // 2):
        job_id = f"rec-{policy}-{i}"
        interrupted(app, policy, job_id)
        view = app.get(job_id)
        assert view is not None and view.status is expected
        out = race(partial(app.record_tool_result, job_id, call_id, "first"),
                   partial(app.record_tool_result, job_id, call_id, "second"))
        ok = [v for v, o in zip(("first", "second"), out, strict=True) if not isinstance(o, BaseException)]
        lost = [o for o in out if isinstance(o, BaseException)]
        assert len(ok) == 1 and len(lost) == 1, out
        assert isinstance(lost[0], JobConflictError), lost[0]
        assert [e.type for e in app.events(job_id)].count("tool_result_recorded") == 1
        if policy == "fail":
            assert "already has a result" in str(lost[0])
            app.retry(job_id, mode="resume")
        assert drive(app, job_id) is JobStatus.COMPLETE
        tool_msgs = [m["content"] for m in app.messages(job_id) if m["role"] == "tool"]
        assert tool_msgs[-1] == ok[0]
        assert charged.count(job_id) == 1  # recorded, never run again


@pytest.mark.parametrize("kind", ["pause", "cancel"])
def test_a_control_applied_by_the_call_is_not_reported_pending(app: App, kind: str) -> None:
    # An earlier pause/cancel whose wait ran out while a turn was in flight left its request stored;
    # the turn has since ended (no lease held), so this call applies it itself.
    app.run_agent("desk", job_id=f"ctl-{kind}", messages=[f"pay ctl-{kind}"])
    assert app.storage.request_control(f"ctl-{kind}", kind)
    view = app.pause(f"ctl-{kind}", wait=0) if kind == "pause" else app.cancel(f"ctl-{kind}", wait=0)
    assert view.status is (JobStatus.PAUSED if kind == "pause" else JobStatus.CANCELLED)
    stored = app.storage.get_job(f"ctl-{kind}")
    assert stored is not None and stored.control is None
    assert view.control is None  # applied: not "requested and not yet applied"
