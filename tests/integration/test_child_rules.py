"""Issue 30 (defects 5-8): the rules of child runs and forks, on memory and on a real redis-server.

A cross-record invariant is checked where the write happens (fork and rerun
identity, child ownership); nothing recursive over a depth a model controls;
every fan-out has a limit (see :mod:`pipelines.engine.children`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.redis import RedisStorage
from phases.children import agent_phase, start_child
from pipelines import Agent, App, Done, JobStatus, Next, Phase, PhaseContext, tool
from pipelines.crash_harness import SimulatedCrash
from pipelines.engine import children
from pipelines.engine.children import child_job_id
from pipelines.engine.errors import InvalidInputError, JobConflictError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply
from tests.unit.helpers import child_the_cancel_misses


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStorage()
        return
    s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"cr{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


def _app(storage: Any, *agents: Agent, **kw: Any) -> App:
    return App(storage=storage, scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)), agents=agents,
               provenance=False, **kw)


def tool_results(app: App, job_id: str) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in app.messages(job_id) if m["role"] == "tool"}


# --- defect 5: a fork or rerun onto a taken id compares what was asked ----------------------------
@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def counting(messages: list[Message]) -> Any:
    k = sum(1 for m in messages if m["role"] == "assistant")
    return reply(f"turn {k}", call("add", a=k, b=1)) if k < 3 else "done"


def finished_bot(storage: Any) -> App:
    app = _app(storage, Agent(name="bot", model=ScriptedModel(counting), tools=[add]))
    app.run_agent("bot", job_id="orig", user="count")
    app.drain()
    assert storage.get_job("orig").status is JobStatus.COMPLETE
    return app


def test_a_rerun_onto_an_existing_fork_is_refused_and_a_true_repeat_lands(storage: Any) -> None:
    app = finished_bot(storage)
    app.fork("orig", at_turn=1, new_job_id="f")
    before = storage.get_job("f")
    # The case: it used to return the paused fork, options dropped, nothing running.
    with pytest.raises(JobConflictError, match=r"'f' already exists \(a fork asked with another"):
        app.rerun("orig", from_turn=1, new_job_id="f", max_turns=5)
    with pytest.raises(JobConflictError, match="already exists"):
        app.fork("orig", at_turn=1, new_job_id="f", run=True)
    with pytest.raises(JobConflictError, match="already exists"):
        app.fork("orig", at_turn=1, new_job_id="f", max_turns=5)
    after = storage.get_job("f")
    assert (after.version, after.status, after.options) == (before.version, JobStatus.PAUSED, before.options)
    assert app.fork("orig", at_turn=1, new_job_id="f").job_id == "f"  # the identical request: idempotent
    app.rerun("orig", from_turn=1, new_job_id="r", max_turns=5)
    assert app.rerun("orig", from_turn=1, new_job_id="r", max_turns=5).job_id == "r"
    with pytest.raises(JobConflictError, match="already exists"):
        app.rerun("orig", from_turn=1, new_job_id="r", max_turns=6)
    with pytest.raises(JobConflictError, match="not a fork"):
        app.fork("orig", at_turn=1, new_job_id="orig")


@pytest.mark.parametrize("same", [True, False])
def test_a_fork_that_races_another_to_the_id_is_judged_on_what_that_one_asked(
        storage: Any, monkeypatch: pytest.MonkeyPatch, same: bool) -> None:
    app = finished_bot(storage)
    real = storage.create_job

    def racing(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(storage, "create_job", real)
        # Another caller's fork lands between this fork's look and its create.
        options: dict[str, Any] = {} if same else {"max_turns": 9}
        app.fork("orig", at_turn=1, new_job_id="f", **options)
        real(*args, **kwargs)

    monkeypatch.setattr(storage, "create_job", racing)
    if same:
        assert app.fork("orig", at_turn=1, new_job_id="f").job_id == "f"
    else:
        with pytest.raises(JobConflictError, match="another source, turn, run or options"):
            app.fork("orig", at_turn=1, new_job_id="f")
    assert storage.get_job("f").options.get("max_turns") == (None if same else 9)



def test_a_fork_whose_source_is_deleted_meanwhile_says_so(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.engine.errors import JobNotFoundError

    app = finished_bot(storage)
    real = storage.messages

    def racing(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(storage, "messages", real)
        app.delete("orig")  # retention, or an operator, between the fork's two reads
        return real(*args, **kwargs)

    monkeypatch.setattr(storage, "messages", racing)
    with pytest.raises(JobNotFoundError, match="deleted while it was being forked"):
        app.fork("orig", at_turn=1, new_job_id="f")
    assert storage.get_job("f") is None

# --- defect 6: a child its parent still waits for is not deleted; a gone one is read as failed -------
@tool(needs_approval=True)
def wire(to: str) -> str:
    """Send money."""
    return f"sent to {to}"


def two_children(storage: Any) -> tuple[App, str, str]:
    """A parent waits for a finished child (researcher) and one waiting for approval (clerk)."""

    def researcher(messages: list[Message]) -> Any:
        return f"found: {messages[-1]['content']}"

    def clerk(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("wire", to="bob"), "id": "w1"})
        return f"clerk: {messages[-1]['content']}"

    def boss(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input="x"), "id": "c0"},
                         {**call("clerk", input="pay"), "id": "c1"})
        return "boss: " + " | ".join(m["content"] for m in messages if m["role"] == "tool")

    r = Agent(name="researcher", model=ScriptedModel(researcher))
    c = Agent(name="clerk", model=ScriptedModel(clerk), tools=[wire])
    b = Agent(name="boss", model=ScriptedModel(boss), tools=[r.as_tool(description="Research."),
                                                            c.as_tool(description="Pay.")])
    app = _app(storage, b)
    app.run_agent("boss", job_id="p", user="go")
    app.drain()
    done, waits = child_job_id("p", "c0"), child_job_id("p", "c1")
    assert storage.get_job(done).status is JobStatus.COMPLETE
    assert storage.get_job(waits).status is JobStatus.WAITING
    assert storage.get_job("p").status is JobStatus.WAITING
    return app, done, waits


def test_a_child_its_parent_waits_for_is_not_deleted_by_delete_or_retention(storage: Any) -> None:
    app, done, waits = two_children(storage)
    app.scheduler.clock.advance(3600)  # type: ignore[attr-defined]
    with pytest.raises(JobConflictError, match="child run its parent 'p' still waits for"):
        app.delete(done)
    assert done not in app.gc(older_than=60, scan=True)
    assert storage.get_job(done) is not None
    app.approve(waits, "w1")
    app.drain()
    parent = storage.get_job("p")
    assert parent.status is JobStatus.COMPLETE
    assert parent.result == "boss: found: x | clerk: sent to bob"
    app.delete(done)  # its outcome is in the parent now: nothing waits for it
    assert storage.get_job(done) is None



def test_a_child_whose_parents_wait_never_committed_is_kept_for_the_re_run(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The parent's worker died between the child's create and the parent's wait commit: the parent does not
    # list the child yet, and the re-run of its turn adopts it. Deleted meanwhile, its work would run twice.
    calls: list[str] = []

    def researcher(messages: list[Message]) -> Any:
        calls.append(messages[-1]["content"])
        return f"found: {messages[-1]['content']}"

    def boss(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input="x"), "id": "c0"})
        return "boss: " + messages[-1]["content"]

    r = Agent(name="researcher", model=ScriptedModel(researcher))
    app = _app(storage, Agent(name="boss", model=ScriptedModel(boss), tools=[r.as_tool(description="Research.")]))
    real = storage.commit

    def dying(commit: Any) -> Any:
        if commit.job_id == "p" and commit.record.status is JobStatus.WAITING:
            raise SimulatedCrash("the parent's worker dies before its wait commits")
        return real(commit)

    monkeypatch.setattr(storage, "commit", dying)
    app.run_agent("boss", job_id="p", user="go")
    with pytest.raises(SimulatedCrash):
        app.advance("p")
    monkeypatch.setattr(storage, "commit", real)
    kid = child_job_id("p", "c0")
    assert app.advance(kid).value == "completed"
    app.scheduler.clock.advance(3600)  # type: ignore[attr-defined]
    storage.release_lease("p", storage.lease_owner("p") or "")  # the dead worker's lease ran out
    with pytest.raises(JobConflictError, match="child run its parent 'p' still waits for"):
        app.delete(kid)
    assert kid not in app.gc(older_than=60, scan=True)
    app.drain()
    assert storage.get_job("p").result == "boss: found: x" and calls == ["x"]  # the call's work ran once

def test_a_child_deleted_all_the_same_is_read_as_failed_never_as_running(storage: Any) -> None:
    app, done, waits = two_children(storage)
    assert storage.delete_job(done)  # behind the App's back (another tool, a hand-run script)
    app.approve(waits, "w1")
    app.drain()
    parent = storage.get_job("p")
    assert parent.status is JobStatus.COMPLETE  # it used to wait forever
    assert tool_results(app, "p")["c0"] == (f"Error: child job {done!r} failed: it was deleted before its "
                                            "parent read its outcome")


# --- defect 7: only the job a call started is that call's child ----------------------------------
def echo_agent() -> Agent:
    return Agent(name="researcher", model=ScriptedModel(lambda m: f"researcher: {m[-1]['content']}"))


def boss_of(child: Agent) -> Agent:
    def script(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input="q"), "id": "c0"})
        return "boss heard: " + next(m["content"] for m in messages if m["role"] == "tool")

    return Agent(name="boss", model=ScriptedModel(script), tools=[child.as_tool(description="Research.")])


def test_an_unrelated_job_under_a_childs_id_is_not_adopted(storage: Any) -> None:
    app = _app(storage, boss_of(echo_agent()))
    kid = child_job_id("p", "c0")
    app.run_agent("researcher", job_id=kid, user="someone else's question")  # created first, by anyone
    app.run_agent("boss", job_id="p", user="go")
    app.advance("p")  # the boss's turn: its call is refused, the model reads why
    app.cancel("p")
    assert storage.get_job(kid).status is JobStatus.RUNNING  # the parent's cancel does not reach it
    app.drain()
    assert storage.get_job(kid).result == "researcher: someone else's question"
    assert storage.get_job("p").children == []
    result = tool_results(app, "p")["c0"]
    assert result.startswith("Error:") and "JobConflictError" in result
    assert f"job {kid!r} is not the child run of call c0 of job 'p': it belongs to no parent" in result


def test_a_job_that_takes_the_childs_id_during_its_start_is_not_adopted(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    researcher = echo_agent()
    app = _app(storage, boss_of(researcher))
    kid = child_job_id("p", "c0")
    real = storage.create_job

    def racing(record: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(storage, "create_job", real)
        app.run_agent("researcher", job_id=kid, user="mine")  # wins the race for the id
        real(record, **kwargs)

    monkeypatch.setattr(storage, "create_job", racing)
    with pytest.raises(JobConflictError, match="it belongs to no parent"):
        start_child(app, parent_job="p", call_id="c0", target=researcher, run={"user": "q"})
    assert storage.get_job(kid).parent_job is None
    # A duplicate worker's create of the same child is still the one child (exactly one per call).
    monkeypatch.setattr(storage, "create_job", lambda *a, **k: (
        monkeypatch.setattr(storage, "create_job", real),
        start_child(app, parent_job="p", call_id="c1", target=researcher, run={"user": "q"}),
        real(*a, **k)))
    assert start_child(app, parent_job="p", call_id="c1", target=researcher,
                       run={"user": "q"}) == child_job_id("p", "c1")


def waiting_parent_with_a_stranger(storage: Any, finish: bool) -> tuple[App, str]:
    """A parent waits for its child; the child is deleted behind its back and a stranger takes the id."""
    app = _app(storage, boss_of(echo_agent()))
    app.run_agent("boss", job_id="p", user="go")
    app.advance("p")
    kid = child_job_id("p", "c0")
    assert storage.get_job("p").status is JobStatus.WAITING
    assert storage.delete_job(kid)
    app.run_agent("researcher", job_id=kid, user="a stranger's question")
    if finish:
        app.advance(kid)
    return app, kid


def test_the_wake_up_reads_a_stranger_under_the_childs_id_as_failed(storage: Any) -> None:
    app, kid = waiting_parent_with_a_stranger(storage, finish=True)
    app.drain()
    assert storage.get_job("p").status is JobStatus.COMPLETE
    result = tool_results(app, "p")["c0"]
    assert result.startswith(f"Error: child job {kid!r} failed: the job under its id is not this job's child")
    assert "stranger" not in result


def test_the_parents_cancel_leaves_a_stranger_under_the_childs_id_alone(storage: Any) -> None:
    app, kid = waiting_parent_with_a_stranger(storage, finish=False)
    app.cancel("p")
    assert storage.get_job("p").status is JobStatus.CANCELLED
    assert storage.get_job(kid).status is JobStatus.RUNNING


# --- defect 8: a bounded depth and fan-out; families walked without recursion ----------------------
def self_calling(name: str = "deep") -> Agent:
    """Asks itself, once per run, until a tool result comes back; then repeats it."""

    def script(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call(name, input="deeper"), "id": "c0"})
        return f"{name} heard: {messages[-1]['content']}"

    agents: list[Agent] = []
    # A tools provider: the only way an agent's tools can name the agent itself.
    agents.append(Agent(name=name, model=ScriptedModel(script),
                        tools=lambda context: [agents[0].as_tool(description="Ask yourself.")]))
    return agents[0]


def generations(root: str, storage: Any) -> list[str]:
    ids = [root]
    while (rec := storage.get_job(child_job_id(ids[-1], "c0"))) is not None:
        ids.append(rec.job_id)
    return ids


def deep_family(storage: Any, monkeypatch: pytest.MonkeyPatch, size: int = 400) -> tuple[App, list[str]]:
    """A self-calling agent ``size`` generations deep, as a family written before the depth limit could be."""
    monkeypatch.setattr(children, "MAX_DEPTH", 10_000)
    app = _app(storage, self_calling())
    app.run_agent("deep", job_id="d", user="go")
    run_next = app.scheduler.run_next  # type: ignore[attr-defined]
    while storage.get_job(child_job_id("d", "c0")) is None or len(generations("d", storage)) < size:
        for _ in range(50):
            run_next()
    return app, generations("d", storage)


def test_the_defaults_are_documented() -> None:
    assert (children.MAX_DEPTH, children.MAX_CHILDREN_PER_TURN) == (8, 64)
    assert "MAX_DEPTH" in (children.__doc__ or "") and "MAX_CHILDREN_PER_TURN" in (children.__doc__ or "")


def test_a_self_calling_agent_stops_at_the_depth_limit(storage: Any) -> None:
    agent = self_calling()
    app = _app(storage, agent)
    app.run_agent("deep", job_id="d", user="go")
    app.drain()
    family = generations("d", storage)
    assert len(family) == children.MAX_DEPTH + 1  # the root and 8 generations below it
    assert [storage.get_job(j).depth for j in family] == list(range(children.MAX_DEPTH + 1))
    assert all(storage.get_job(j).status is JobStatus.COMPLETE for j in family)
    deepest = tool_results(app, family[-1])["c0"]
    assert "InvalidInputError" in deepest and "MAX_DEPTH = 8" in deepest
    assert storage.get_job("d").result.startswith("deep heard: deep heard:")


def test_cancel_walks_a_family_deeper_than_the_stack(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app, family = deep_family(storage, monkeypatch)
    app.cancel("d")  # it used to raise RecursionError with hundreds of descendants left running
    assert {storage.get_job(j).status for j in family} == {JobStatus.CANCELLED}


def test_pause_and_resume_walk_a_deep_family_too(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app, family = deep_family(storage, monkeypatch)
    leaf = family[-1]
    assert storage.get_job(leaf).status is JobStatus.RUNNING  # the one job below 400 waiting generations
    app.pause("d")
    assert storage.get_job(leaf).status is JobStatus.PAUSED
    assert {storage.get_job(j).status for j in family[:-1]} == {JobStatus.WAITING}
    app.resume("d")
    assert storage.get_job(leaf).status is JobStatus.RUNNING


def test_one_turn_starts_at_most_the_fan_out_limit(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(children, "MAX_CHILDREN_PER_TURN", 2)
    child = echo_agent()

    def script(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("add", a=1, b=2), "id": "a0"},
                         *({**call("researcher", input=f"q{i}"), "id": f"c{i}"} for i in range(4)))
        return "done"

    app = _app(storage, Agent(name="boss", model=ScriptedModel(script),
                              tools=[add, child.as_tool(description="Research.")]))
    app.run_agent("boss", job_id="p", user="go")
    app.drain()
    assert storage.get_job("p").status is JobStatus.COMPLETE
    assert sorted(storage.get_job("p").children) == sorted(child_job_id("p", c) for c in ("c0", "c1"))
    assert storage.get_job(child_job_id("p", "c2")) is None and storage.get_job(child_job_id("p", "c3")) is None
    results = tool_results(app, "p")
    assert results["a0"] == "3" and results["c0"] == "researcher: q0"
    assert results["c2"] == results["c3"] == (
        "Error: tool 'researcher' was not run: this turn already starts 2 child runs, the most one turn may start "
        "(pipelines.engine.children.MAX_CHILDREN_PER_TURN); call it again in a later turn if it is still needed")


def test_an_agent_phase_past_the_depth_limit_fails_its_job(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(children, "MAX_DEPTH", 0)

    def finish(ctx: PhaseContext[Any]) -> Done:
        return Done(result=ctx.state)

    ask = agent_phase(echo_agent(), name="ask", next_phase="finish")
    app = _app(storage, pipelines={"flow": [ask, Phase("finish", finish)]})
    app.run_pipeline("flow", job_id="f", initial_state="owls")
    app.drain()
    rec = storage.get_job("f")
    assert rec.status is JobStatus.ERROR and "MAX_DEPTH = 0" in (rec.error or "")
    assert rec.children == []
    with pytest.raises(InvalidInputError, match="may not start a child run"):
        start_child(app, parent_job="f", call_id="x", target=echo_agent(), run={"user": "q"})


def test_a_cancel_waits_at_most_its_wait_for_the_whole_family(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each child in a turn waited the whole ``wait`` one after the other: 64 children, 32 minutes by default.
    import pipelines.engine.control as control

    def fan_out(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, *({**call("researcher", input=f"q{i}"), "id": f"c{i}"} for i in range(4)))
        return "done"

    app = _app(storage, Agent(name="boss", model=ScriptedModel(fan_out),
                              tools=[echo_agent().as_tool(description="Research.")]))
    app.run_agent("boss", job_id="fam", user="go")
    app.advance("fam")
    kids = [child_job_id("fam", f"c{i}") for i in range(4)]
    assert storage.get_job("fam").status is JobStatus.WAITING
    for kid in kids:  # each child's turn is in flight on some worker: its lease is held
        assert storage.acquire_lease(kid, "busy-worker", 60.0) is not None
    now = [0.0]
    monkeypatch.setattr(control.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(control.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    view = app.cancel("fam", wait=1.0)
    assert now[0] <= 1.0 + 2 * control._POLL  # one wait for the family, not one a child (4 s)
    assert view.status is JobStatus.CANCELLED
    assert all(storage.get_job(k).control == "cancel" for k in kids)  # each applies it when its turn commits


def three_generations(storage: Any, calls: list[str]) -> tuple[App, list[str]]:
    """A chief "R" whose two bosses each wait for a researcher, running, whose tool records its calls; returns
    the app and the family (the chief, the bosses, the researchers)."""

    @tool
    def look(q: str) -> str:
        """Look it up."""
        calls.append(q)
        return f"found {q}"

    def leaf(messages: list[Message]) -> Any:
        return reply(None, {**call("look", q="x"), "id": "l0"}) if messages[-1]["role"] == "user" else "looked"

    def chief(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, *({**call("boss", input=f"b{i}"), "id": f"t{i}"} for i in range(2)))
        return "chief heard"

    boss = boss_of(Agent(name="researcher", model=ScriptedModel(leaf), tools=[look]))
    app = _app(storage, Agent(name="chief", model=ScriptedModel(chief), tools=[boss.as_tool(description="Boss.")]))
    app.run_agent("chief", job_id="R", user="go")
    app.advance("R")
    bosses = [child_job_id("R", f"t{i}") for i in range(2)]
    for boss_id in bosses:
        app.advance(boss_id)
    return app, ["R", *bosses, *(child_job_id(b, "c0") for b in bosses)]


def cancel_dying_after(app: App, monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """``app.cancel("R")`` in a process that dies right after its ``writes``-th commit."""
    from pipelines.engine import writer

    real, done = writer.apply, []

    def dies_after(*args: Any, **kwargs: Any) -> Any:
        reply_ = real(*args, **kwargs)
        done.append(args[2].job_id)
        if len(done) == writes:
            raise SimulatedCrash(f"the cancelling process dies after {done}")
        return reply_

    monkeypatch.setattr(writer, "apply", dies_after)
    with pytest.raises(SimulatedCrash):
        app.cancel("R")
    monkeypatch.setattr(writer, "apply", real)


@pytest.mark.parametrize("writes", [1, 2, 3, 4])
def test_a_cancel_whose_process_dies_midway_still_stops_the_whole_family(
        storage: Any, monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    # The cancel walked the family in its caller's memory only: dead after the root's commit, it left the
    # grandchildren running (their parents wait for them, and have no turn to notice) to their end, tools and all.
    calls: list[str] = []
    app, family = three_generations(storage, calls)
    leaves = family[3:]
    assert [storage.get_job(j).status for j in family] == [JobStatus.WAITING] * 3 + [JobStatus.RUNNING] * 2
    cancel_dying_after(app, monkeypatch, writes)
    assert storage.get_job(leaves[-1]).status is JobStatus.RUNNING  # the walk never got that far
    app.drain()
    assert {j: storage.get_job(j).status for j in family} == dict.fromkeys(family, JobStatus.CANCELLED)
    assert calls == []  # no researcher ran its tool (nor its turn) after the chief was cancelled


@pytest.mark.parametrize("writes", [1, 2, 3, 4])
def test_cancelling_again_finishes_a_cancel_whose_process_died_midway(
        storage: Any, monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    # Paused researchers have no turn coming to notice the chief's cancel; asking again was refused ("already
    # cancelled") without a look at the family, so they and their bosses stayed paused and waiting for good.
    calls: list[str] = []
    app, family = three_generations(storage, calls)
    leaves = family[3:]
    app.pause("R")
    assert [storage.get_job(j).status for j in leaves] == [JobStatus.PAUSED] * 2
    cancel_dying_after(app, monkeypatch, writes)
    app.drain()
    assert storage.get_job(leaves[-1]).status is JobStatus.PAUSED  # no turn of its own: nothing else cancels it
    assert app.cancel("R").status is JobStatus.CANCELLED
    assert {j: storage.get_job(j).status for j in family} == dict.fromkeys(family, JobStatus.CANCELLED)
    with pytest.raises(JobConflictError, match="already cancelled; nothing to cancel"):
        app.cancel("R")  # the family is all stopped: asking once more is refused as before
    assert calls == []


@pytest.mark.parametrize(("wait", "force"), [("5", False), (float("nan"), False), (float("inf"), False),
                                             (-1, False), (True, False), (1.0, "yes")])
def test_cancel_and_pause_refuse_a_wait_or_force_that_means_nothing(storage: Any, wait: Any, force: Any) -> None:
    app = finished_bot(storage)
    app.run_agent("bot", job_id="r", user="count")
    with pytest.raises(InvalidInputError, match=r"wait must be a finite number|force must be True or False"):
        app.cancel("r", wait=wait, force=force)
    if force is False:
        with pytest.raises(InvalidInputError, match="wait must be a finite number"):
            app.pause("r", wait=wait)
    assert storage.get_job("r").status is JobStatus.RUNNING and storage.get_job("r").control is None


def test_a_fork_racing_a_full_retry_of_its_source_is_refused_not_mixed(storage: Any) -> None:
    # The fork read turn 3's state, then the messages after the retry cut them back and the new run wrote
    # as many again: the fork landed with the new run's transcript under the old run's state and history.
    runs = [0]

    def counting_then_down(messages: list[Message]) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        if k == 3 and runs[0] == 0:
            raise ValueError("model down")  # the first run fails after its third turn
        return reply(f"run {runs[0]} turn {k}", call("add", a=k, b=1)) if k < 3 else "done"

    app = _app(storage, Agent(name="bot", model=ScriptedModel(counting_then_down), tools=[add], max_retries=0))
    app.run_agent("bot", job_id="orig", user="count")
    app.drain()
    assert storage.get_job("orig").status is JobStatus.ERROR
    real = storage.messages

    def retried_meanwhile(*args: Any, **kwargs: Any) -> Any:
        storage.messages = real
        runs[0] = 1
        app.retry("orig", mode="full")
        app.drain()
        return real(*args, **kwargs)

    storage.messages = retried_meanwhile
    try:
        with pytest.raises(JobConflictError, match=r"cut back before turn 3 \(a full retry\)"):
            app.fork("orig", at_turn=3, new_job_id="f")
    finally:
        storage.messages = real
    assert storage.get_job("f") is None
    # Tried again: the new run's turns are numbered on from the old run's (a job's turns count its whole life).
    again = next(m.phases_done for m in storage.get_job("orig").history if m.transcript_len == 7)
    forked = app.fork("orig", at_turn=again, new_job_id="f")
    said = [m["content"] for m in app.messages(forked.job_id) if m["role"] == "assistant"]
    assert said == ["run 1 turn 0", "run 1 turn 1", "run 1 turn 2"]


def test_a_fork_of_a_child_is_as_deep_in_its_family_as_the_child(storage: Any) -> None:
    app = _app(storage, boss_of(echo_agent()))
    app.run_agent("boss", job_id="p", user="go")
    app.drain()
    kid = storage.get_job(child_job_id("p", "c0"))
    assert kid.depth == 1
    app.fork(kid.job_id, at_turn=0, new_job_id="kid-fork")
    assert storage.get_job("kid-fork").depth == 1  # was 0: a fork of a deep child could grow the family again


# --- a call id repeated in another run or life of the parent is another call --------------------------
def test_a_full_retry_runs_its_child_calls_again_not_the_old_runs_children(storage: Any) -> None:
    # The model repeats its call ids (ScriptedModel, some providers): the old run's child was adopted, so the
    # retried parent failed again with the old child's error although the child's model was fixed.
    version = ["v1"]

    def researcher(messages: list[Message]) -> Any:
        if version[0] == "v1":
            raise ValueError("child model down")
        return f"fresh answer ({version[0]})"

    child = Agent(name="researcher", model=ScriptedModel(researcher), max_retries=0)

    def boss(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input="q"), "id": "c0"})
        return "boss: " + messages[-1]["content"]

    app = _app(storage, Agent(name="boss", model=ScriptedModel(boss),
                              tools=[child.as_tool(description="R.", on_child_error="fail")]))
    app.run_agent("boss", job_id="p", user="go")
    app.drain()
    old = child_job_id("p", "c0")
    assert storage.get_job("p").status is JobStatus.ERROR and storage.get_job(old).status is JobStatus.ERROR
    version[0] = "v2"
    app.retry("p", mode="full")
    app.drain()
    parent = storage.get_job("p")
    assert (parent.status, parent.result) == (JobStatus.COMPLETE, "boss: fresh answer (v2)")
    new = [c for c in parent.children if c != old]
    assert len(new) == 1 and storage.get_job(new[0]).parent_call == "c0"
    assert storage.get_job(old).status is JobStatus.ERROR  # the old run's child is left as it was


def test_a_job_made_again_under_a_deleted_ones_id_never_adopts_its_children(storage: Any) -> None:
    # One conversation read another's answer: the deleted job's child, found under the same parent and call id.
    asked: list[str] = []

    def researcher(messages: list[Message]) -> Any:
        asked.append(str(messages[-1]["content"]))
        return f"answer for: {messages[-1]['content']}"

    child = Agent(name="researcher", model=ScriptedModel(researcher))

    def boss(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input=messages[-1]["content"]), "id": "c0"})
        return "boss: " + messages[-1]["content"]

    app = _app(storage, Agent(name="boss", model=ScriptedModel(boss), tools=[child.as_tool(description="R.")]))
    app.run_agent("boss", job_id="chat-1", user="alice's question")
    app.drain()
    # The parent deleted alone (app.delete takes its children too; retention may take a parent before a child
    # that ran again later, a script deletes what it likes): its child outlives it.
    assert storage.delete_job("chat-1")
    assert storage.get_job(child_job_id("chat-1", "c0")) is not None
    app.run_agent("boss", job_id="chat-1", user="bob's question")
    app.drain()
    assert storage.get_job("chat-1").result == "boss: answer for: bob's question"
    assert asked == ["alice's question", "bob's question"]


def test_a_child_whose_parent_started_another_run_stops_at_its_next_turn(
        storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A child the cancel missed (its parent's wait never committed), then the parent retried from the start:
    # its new run starts a child of its own; the old run's must not run on to an end nobody reads.
    app = _app(storage, boss_of(echo_agent()))
    kid = child_the_cancel_misses(app, monkeypatch, "p", user="go")
    app.retry("p", mode="full")
    assert storage.get_job("p").status is JobStatus.RUNNING
    assert app.advance(kid).value == "cancelled"
    assert storage.get_job(kid).result is None
    app.delete(kid)  # nothing waits for it: the parent's new run has a child of its own
    app.drain()
    assert storage.get_job("p").result == "boss heard: researcher: q"


def test_a_turn_fenced_off_by_a_full_retry_starts_no_child(storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its tool ran on after a forced cancel and a full retry: the child it started was stamped with the new run
    # (read from storage), and the new run, repeating the call id, took the old turn's question's answer.
    import phases.children

    asked = ["v1"]

    def boss(messages: list[Message]) -> Any:
        if messages[-1]["role"] == "user":
            return reply(None, {**call("researcher", input=f"question of {asked[0]}"), "id": "c0"})
        return "boss heard: " + next(m["content"] for m in messages if m["role"] == "tool")

    app = _app(storage, Agent(name="boss", model=ScriptedModel(boss), tools=[echo_agent().as_tool(description="R.")]))
    real = phases.children.start_child

    def operator_retries_meanwhile(*args: Any, **kwargs: Any) -> Any:
        app.cancel("p", force=True)
        asked[0] = "v2"
        app.retry("p", mode="full")
        return real(*args, **kwargs)

    monkeypatch.setattr(phases.children, "start_child", operator_retries_meanwhile)
    app.run_agent("boss", job_id="p", user="go")
    assert app.advance("p").value == "stale"
    monkeypatch.setattr(phases.children, "start_child", real)
    assert storage.get_job(child_job_id("p", "c0")) is None
    app.drain()
    assert storage.get_job("p").result == "boss heard: researcher: question of v2"


def test_a_fork_racing_a_turn_that_drops_its_mark_from_the_bounded_history_lands(storage: Any) -> None:
    # Only a cut (a full retry) may refuse it: the history also drops marks by its bounds as a job goes on.
    from pipelines.engine.transitions import HISTORY_BYTES

    big = "x" * (HISTORY_BYTES // 2 + 1000)  # a state this large: the history keeps only the newest turn

    def step(ctx: PhaseContext[Any]) -> Any:
        n = ctx.state["n"] + 1
        ctx.append_messages([{"role": "user", "content": f"m{n}"}])
        return Next("step", state={"n": n, "blob": big}) if n < 5 else Done(result=n)

    app = _app(storage)
    app.add_pipeline("steps", [Phase("step", step)])
    app.run_pipeline("steps", job_id="src", initial_state={"n": 0, "blob": ""})
    app.advance("src")
    app.advance("src")
    at = storage.get_job("src").history[-1].phases_done
    real = storage.messages

    def one_more_turn_meanwhile(*args: Any, **kwargs: Any) -> Any:
        storage.messages = real
        app.advance("src")  # the source commits its next turn: its history drops the mark, nothing is cut
        return real(*args, **kwargs)

    storage.messages = one_more_turn_meanwhile
    try:
        forked = app.fork("src", at_turn=at, new_job_id="f")
    finally:
        storage.messages = real
    assert [m["content"] for m in app.messages(forked.job_id)] == ["m1", "m2"]
