"""Agents and pipelines as tools: durable child runs, on memory and on a real redis-server (issue 13)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.redis import RedisStorage
from phases.children import agent_phase, pipeline_tool
from pipelines import Agent, JobStatus
from pipelines.app import App
from pipelines.engine import writer
from pipelines.engine.children import child_job_id
from pipelines.engine.models import JOB_ID_PATTERN, Message
from pipelines.engine.phase import Done, Phase, PhaseContext
from pipelines.testing import ScriptedModel, call, crash_test, reply
from tests.unit.helpers import child_the_cancel_misses


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    redis_storage = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"kids{id(request)}")
    yield redis_storage
    redis_storage.close()  # each thread's kept connection too: an unclosed socket is a ResourceWarning (an error)


def _last(messages: list[Message]) -> Message:
    return messages[-1]


def child_agent(fail: bool = False) -> Agent:
    """Answers its one user message; with ``fail``, its model raises (the child job ends in error)."""

    def script(messages: list[Message]) -> Any:
        if fail:
            raise ValueError("the child's model is down")
        return f"child says: {_last(messages)['content']}"

    return Agent(name="researcher", model=ScriptedModel(script))


def parent_agent(child: Agent, *, asks: tuple[str, ...] = ("look up X",), **tool_options: Any) -> Agent:
    """Calls the child tool once per entry of ``asks`` (in one turn), then repeats the tool results."""

    def script(messages: list[Message]) -> Any:
        last = _last(messages)
        if last["role"] == "user":
            return reply(None, *({**call("researcher", input=a), "id": f"c{i}"} for i, a in enumerate(asks)))
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return "parent heard: " + " | ".join(results)

    tool = child.as_tool(description="Research a question.", **tool_options)
    return Agent(name="boss", model=ScriptedModel(script), tools=[tool])


def _app(storage: Any, *agents: Agent, **kw: Any) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(), agents=agents, **kw)


def test_child_job_id_is_stable_valid_and_unambiguous() -> None:
    assert child_job_id("p", "c1") == child_job_id("p", "c1") == "p:c:c1"
    assert child_job_id("p", "c1") != child_job_id("p", "c2")
    # Colons or foreign characters in a call id, or a long parent, give a hashed id, still valid.
    for parent, call_id in [("a", "x:c:y"), ("a:c:x", "y"), ("p", "toolu/01 é"), ("j" * 200, "c1")]:
        assert JOB_ID_PATTERN.fullmatch(child_job_id(parent, call_id)), (parent, call_id)
    assert child_job_id("a", "x:c:y") != child_job_id("a:c:x", "y")


def test_agent_tool_runs_a_child_job_and_its_answer_is_the_tool_result(storage: Any) -> None:
    child = child_agent()
    app = _app(storage, parent_agent(child))  # the child agent is registered through the tool
    assert "researcher" in app.agents
    app.run_agent("boss", job_id="p1", user="go")
    app.drain()
    parent = storage.get_job("p1")
    kid = child_job_id("p1", "c0")
    assert parent.status is JobStatus.COMPLETE, parent.error
    assert parent.result == "parent heard: child says: look up X"
    assert parent.children == [kid]
    rec = storage.get_job(kid)
    assert (rec.status, rec.parent_job, rec.parent_call) == (JobStatus.COMPLETE, "p1", "c0")
    assert storage.messages(kid)[-1]["content"] == "child says: look up X"
    # The child's model call counts toward the parent's usage (and so its budget): 2 + 1 calls.
    assert parent.usage.model_calls == 3
    events = [e.type for e in storage.events("p1")]
    assert "job_waiting" in events and "children_finished" in events


def test_the_parent_waits_without_a_worker_and_the_childs_final_commit_wakes_it(storage: Any) -> None:
    app = _app(storage, parent_agent(child_agent()))
    app.run_agent("boss", job_id="p2", user="go")
    kid = child_job_id("p2", "c0")
    app.advance("p2")  # the parent's turn starts the child and parks
    parent = storage.get_job("p2")
    assert parent.status is JobStatus.WAITING
    assert parent.waiting["kind"] == "children"
    assert [(c["call_id"], c["child"]) for c in parent.waiting["calls"]] == [("c0", kid)]
    assert storage.lease_owner("p2") is None
    assert storage.get_job(kid).status is JobStatus.RUNNING
    assert app.advance("p2").value == "waiting"  # a duplicate message changes nothing
    app.advance(kid)  # the child's final commit sends the parent's advance
    assert storage.get_job(kid).status is JobStatus.COMPLETE
    app.drain()
    assert storage.get_job("p2").status is JobStatus.COMPLETE


def test_several_child_calls_in_one_turn_wait_as_one(storage: Any) -> None:
    app = _app(storage, parent_agent(child_agent(), asks=("one", "two")))
    app.run_agent("boss", job_id="p3", user="go")
    app.advance("p3")
    waiting = storage.get_job("p3").waiting
    assert sorted(c["call_id"] for c in waiting["calls"]) == ["c0", "c1"]
    app.drain()
    parent = storage.get_job("p3")
    assert parent.result == "parent heard: child says: one | child says: two"
    assert sorted(parent.children) == sorted(child_job_id("p3", c) for c in ("c0", "c1"))


def test_a_failed_child_gives_the_model_an_error_result(storage: Any) -> None:
    app = _app(storage, parent_agent(child_agent(fail=True)))
    app.run_agent("boss", job_id="p4", user="go")
    app.drain()
    parent = storage.get_job("p4")
    assert parent.status is JobStatus.COMPLETE
    tool_result = next(m["content"] for m in storage.messages("p4") if m["role"] == "tool")
    assert tool_result.startswith("Error: child job") and "the child's model is down" in tool_result


def test_on_child_error_fail_fails_the_parent(storage: Any) -> None:
    app = _app(storage, parent_agent(child_agent(fail=True), on_child_error="fail"))
    app.run_agent("boss", job_id="p5", user="go")
    app.drain()
    parent = storage.get_job("p5")
    assert parent.status is JobStatus.ERROR
    assert child_job_id("p5", "c0") in parent.error and "model is down" in parent.error
    assert parent.checkpoint is not None  # kept: retry the child, then the parent


def test_a_lost_wake_up_is_recovered_by_the_sweep(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(storage, parent_agent(child_agent()))
    app.run_agent("boss", job_id="p6", user="go")
    kid = child_job_id("p6", "c0")
    # Every message to the parent is lost (a process that died right after each commit).
    monkeypatch.setattr(writer, "_wake_family", lambda *a: None)
    app.drain()
    monkeypatch.undo()
    assert storage.get_job(kid).status is JobStatus.COMPLETE
    assert storage.get_job("p6").status is JobStatus.WAITING
    assert dict(app.advance_due())["p6"].value == "advanced"  # woken, and its turn ran
    app.drain()
    assert storage.get_job("p6").status is JobStatus.COMPLETE


def test_requeue_overdue_sends_ready_parents_to_the_queue(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(storage, parent_agent(child_agent()))
    app.run_agent("boss", job_id="p7", user="go")
    monkeypatch.setattr(writer, "_wake_family", lambda *a: None)
    app.drain()
    monkeypatch.undo()
    assert storage.get_job("p7").status is JobStatus.WAITING
    assert app.requeue_overdue(grace=0.0) == ["p7"]
    app.drain()
    assert storage.get_job("p7").status is JobStatus.COMPLETE


def test_cancel_and_pause_of_the_parent_reach_its_children(storage: Any) -> None:
    app = _app(storage, parent_agent(child_agent()))
    app.run_agent("boss", job_id="p8", user="go")
    app.advance("p8")
    kid = child_job_id("p8", "c0")
    app.pause("p8")
    assert storage.get_job(kid).status is JobStatus.PAUSED
    assert storage.get_job("p8").status is JobStatus.WAITING
    app.resume("p8")
    assert storage.get_job(kid).status is JobStatus.RUNNING
    app.cancel("p8")
    assert storage.get_job("p8").status is JobStatus.CANCELLED
    assert storage.get_job(kid).status is JobStatus.CANCELLED
    app.drain()
    assert storage.get_job("p8").status is JobStatus.CANCELLED  # the child's end does not wake it



@pytest.mark.parametrize("kind", ["pause", "cancel"])
def test_a_pause_or_cancel_asked_while_the_parents_turn_ends_in_a_wait_reaches_its_children(
        storage: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Asked while the turn that starts the child runs: that turn commits a wait, not a boundary where the
    # request applies; the request then applies to the waiting parent as it would have from the start.
    import threading
    import time

    import phases.children

    started = threading.Event()
    real = phases.children.start_child

    def slow_start(*args: Any, **kwargs: Any) -> Any:
        child_id = real(*args, **kwargs)
        started.set()
        time.sleep(0.3)  # the rest of the turn
        return child_id

    monkeypatch.setattr(phases.children, "start_child", slow_start)
    app = _app(storage, parent_agent(child_agent()))
    app.run_agent("boss", job_id="p9", user="go")
    turn = threading.Thread(target=app.advance, args=("p9",))
    turn.start()
    assert started.wait(10)
    view = app.pause("p9", wait=10) if kind == "pause" else app.cancel("p9", wait=10)
    turn.join(10)
    kid = storage.get_job(child_job_id("p9", "c0"))
    parent = storage.get_job("p9")
    if kind == "pause":
        assert view.status is JobStatus.WAITING and view.record.control is None
        assert kid.status is JobStatus.PAUSED and parent.status is JobStatus.WAITING and parent.control is None
    else:
        assert view.status is JobStatus.CANCELLED
        assert kid.status is JobStatus.CANCELLED and parent.status is JobStatus.CANCELLED


def test_a_child_its_parents_cancel_could_not_reach_is_cancelled_at_its_next_turn(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parent's turn started the child and was forced off before its wait committed: the parent does not
    # list the child, so the cancel's walk cannot reach it. The child sees its parent cancelled and stops.
    app = _app(storage, parent_agent(child_agent()))
    kid = child_the_cancel_misses(app, monkeypatch, "p10", user="go")
    assert app.advance(kid).value == "cancelled"
    assert storage.get_job(kid).status is JobStatus.CANCELLED and storage.get_job(kid).result is None


def test_a_child_whose_parent_was_deleted_stops_at_its_next_turn(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # As above, and the operator then deleted the cancelled parent: nothing will read the child's outcome, so
    # it must not run on (it did, to its end, paying for every model call).
    app = _app(storage, parent_agent(child_agent()))
    kid = child_the_cancel_misses(app, monkeypatch, "p11", user="go")
    app.delete("p11")
    assert storage.get_job("p11") is None
    assert app.advance(kid).value == "cancelled"
    assert storage.get_job(kid).status is JobStatus.CANCELLED and storage.get_job(kid).result is None


class Topic(BaseModel):
    topic: str


def test_a_registered_pipeline_as_a_tool(storage: Any) -> None:
    def shout(ctx: PhaseContext[Any]) -> Done:
        return Done(result={"loud": ctx.state["topic"].upper()})

    def script(messages: list[Message]) -> Any:
        if _last(messages)["role"] == "user":
            return reply(None, {**call("shouter", topic="cats"), "id": "t1"})
        return f"got {_last(messages)['content']}"

    tool = pipeline_tool("shouter", description="Shout a topic.", input_model=Topic)
    boss = Agent(name="boss", model=ScriptedModel(script), tools=[tool])
    app = App(storage=storage, scheduler=MemoryScheduler(), agents=[boss], pipelines={"shouter": [Phase("s", shout)]})
    app.run_agent("boss", job_id="p9", user="go")
    app.drain()
    assert storage.get_job("p9").result == 'got {"loud": "CATS"}'
    kid = storage.get_job(child_job_id("p9", "t1"))
    assert (kid.pipeline, kid.result, kid.parent_job) == ("shouter", {"loud": "CATS"}, "p9")
    assert json.loads(storage.messages("p9")[-2]["content"]) == {"loud": "CATS"}


def test_an_agent_as_one_phase_of_a_pipeline(storage: Any) -> None:
    def prepare(ctx: PhaseContext[Any]) -> Any:
        from pipelines.engine.phase import Next

        return Next("ask", state={"q": f"about {ctx.state['q']}"})

    def finish(ctx: PhaseContext[Any]) -> Done:
        return Done(result={"final": ctx.state})

    researcher = child_agent()
    ask = agent_phase(researcher, name="ask", next_phase="finish", map_run=lambda s: {"user": s["q"]},
                      map_result=lambda s, result: {**s, "answer": result})
    app = App(storage=storage, scheduler=MemoryScheduler(),
              pipelines={"flow": [Phase("prepare", prepare), ask, Phase("finish", finish)]})
    assert "researcher" in app.agents
    app.run_pipeline("flow", job_id="f1", initial_state={"q": "owls"})
    app.drain()
    rec = storage.get_job("f1")
    assert rec.status is JobStatus.COMPLETE, rec.error
    assert rec.result == {"final": {"q": "about owls", "answer": "child says: about owls"}}
    assert len(rec.children) == 1 and storage.messages(rec.children[0])[-1]["content"] == "child says: about owls"


def test_exactly_one_child_per_call_after_a_crash_at_any_boundary() -> None:
    runs: list[Any] = []

    def start(storage: Any, scheduler: Any) -> None:
        runs.append(storage)
        app = App(storage=storage, scheduler=scheduler, agents=[parent_agent(child_agent(), asks=("a", "b"))])
        app.run_agent("boss", job_id="cp", user="go")

    report = crash_test(start, job_id="cp")
    report.assert_ok()
    assert report.clean_status == "complete"
    assert any("children" in r.point.operation or r.point.operation == "create_job" for r in report.results)
    kids = [child_job_id("cp", c) for c in ("c0", "c1")]
    for storage in runs[1:]:
        if storage.get_job("cp") is None:
            continue  # crashed before the parent existed
        # Each call has its one child, run once: one answer in its transcript, the parent's name on it.
        listed = sorted(r.job_id for r in storage.list_jobs() if r.parent_job == "cp")
        assert listed == sorted(kids)
        for kid in kids:
            assert [m["role"] for m in storage.messages(kid)] == ["user", "assistant"]


def test_status_and_jobs_show_parent_and_children(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from pipelines.cli import main
    from tests.apps import children_app

    monkeypatch.delenv("PIPELINES_APP", raising=False)
    app = children_app.reset()
    app.run_agent("boss", job_id="fam", user="go")
    app.drain()
    kid = child_job_id("fam", "c0")

    def run(*argv: str) -> str:
        out = io.StringIO()
        assert main([*argv, "--app", "tests.apps.children_app:app"], out=out, err=io.StringIO()) == 0
        return out.getvalue()

    assert f"children:    {kid}" in run("status", "fam")
    assert "parent:      fam (call c0)" in run("status", kid)
    rows = {line.split("\t")[0]: line.split("\t") for line in run("jobs").splitlines()}
    assert rows["fam"][-1] == "children=1" and rows[kid][-1] == "parent=fam"


def test_the_turn_woken_by_its_children_reuses_its_journal_and_runs_no_finished_sibling_again(storage: Any) -> None:
    # A child call beside a non-idempotent tool in one answer: the turn waits for the child, then wakes in the
    # same worker. The woken turn ran on a record without its open journal: the model was asked again, and the
    # sibling ran twice (with a provider's fresh call ids, a new child started at every wake).
    from pipelines import tool

    shipped: list[int] = []

    @tool(idempotent=False)
    def ship(x: int) -> str:
        """Ships a parcel."""
        shipped.append(x)
        return f"shipped {x}"

    asked: list[str] = []

    def script(messages: list[Message]) -> Any:
        asked.append(_last(messages)["role"])
        if _last(messages)["role"] == "user":
            return reply(None, {**call("researcher", input="q"), "id": "c0"}, {**call("ship", x=1), "id": "s1"})
        return "parent heard: " + " | ".join(m["content"] for m in messages if m["role"] == "tool")

    child = child_agent()
    boss = Agent(name="boss", model=ScriptedModel(script), tools=[child.as_tool(description="r"), ship])
    app = _app(storage, boss, child)
    app.run_agent("boss", job_id="p", user="go")
    app.drain()
    rec = app.get("p")
    assert rec.status is JobStatus.COMPLETE and rec.result == "parent heard: child says: q | shipped 1"
    assert shipped == [1] and asked == ["user", "tool"]
