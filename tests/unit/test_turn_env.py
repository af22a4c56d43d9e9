"""The turn's environment is handed over, never found (issue 29 item 1; issue 30 defect 13).

A phase and a tool get the App's environment (child runs, flow limits,
callbacks) from the context they are handed, so they see it on any thread:
the tool timeout's own thread, the async bridge's loop, the tool pool.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from phases.children import agent_tool
from pipelines import Agent, JobStatus, ToolContext, tool
from pipelines.app import App
from pipelines.engine.children import child_job_id
from pipelines.engine.env import EMPTY_ENV, RunCallbacks, RunEnv
from pipelines.engine.errors import ConfigurationError
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply
from tests.apps import env_app

ROOT = Path(__file__).resolve().parents[2]


def _memory_app() -> App:
    return env_app.build(MemoryStorage(), MemoryScheduler())


def test_an_agent_used_as_a_tool_under_tool_timeout_starts_its_child() -> None:
    app = _memory_app()
    app.run_agent("boss_timed", job_id="p1", user="go")
    app.drain()
    parent = app.storage.get_job("p1")
    assert parent is not None and parent.status is JobStatus.COMPLETE, parent and parent.error
    child = app.storage.get_job(child_job_id("p1", "c0"))
    assert child is not None and child.status is JobStatus.COMPLETE
    assert app.messages("p1")[-1]["content"] == "parent heard: child says: look it up"


def test_tools_on_the_async_bridge_and_a_timed_thread_see_the_app_and_the_run_context() -> None:
    app = _memory_app()
    app.run_agent("boss_mixed", job_id="p2", user="go", context={"tenant": "t1"})
    app.drain()
    parent = app.storage.get_job("p2")
    assert parent is not None and parent.status is JobStatus.COMPLETE, parent and parent.error
    tool_results = {m["tool_call_id"]: m["content"] for m in app.messages("p2") if m["role"] == "tool"}
    assert tool_results["c0"] == "child says: dig"  # the child tool, with a timeout of its own
    context = {"tenant": "t1"}
    assert tool_results["c1"] == f"async: app=True context={context}"
    assert tool_results["c2"] == f"timed: app=True context={context}"


def test_a_tool_on_a_bare_thread_still_has_its_environment() -> None:
    # The tool hands its ToolContext to a thread it starts itself: nothing is looked up by thread or job.
    seen: list[Any] = []

    @tool
    def spawn(ctx: ToolContext) -> str:
        """Start a thread that reads the context."""
        t = threading.Thread(target=lambda: seen.append((ctx.env.children, ctx.context)))
        t.start()
        t.join()
        return "ok"

    def script(messages: list[Message]) -> Any:
        return reply(None, {**call("spawn"), "id": "c0"}) if messages[-1]["role"] == "user" else "done"

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(script), tools=[spawn])])
    app.run_agent("a", job_id="j", user="go", context={"k": 1})
    app.drain()
    assert seen == [(app, {"k": 1})]


def test_a_child_tool_without_an_app_says_it_needs_one() -> None:
    child = Agent(name="kid", model=ScriptedModel(lambda m: "hi"))
    t = agent_tool(child, description="Ask the kid.")
    ctx = ToolContext(job_id="p", call_id="c", tool_name="kid")
    assert ctx.env is EMPTY_ENV
    with pytest.raises(ConfigurationError, match="needs the job to be advanced by an App"):
        t.execute(t.input_model(input="x"), ctx)


def test_two_apps_keep_their_runs_callbacks_apart() -> None:
    ended: dict[str, list[str]] = {"one": [], "two": []}

    def build(name: str) -> App:
        agent = Agent(name="a", model=ScriptedModel(lambda m: "done"))
        return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[agent])

    one, two = build("one"), build("two")
    one.run_agent("a", job_id="same", user="x", on_end=lambda e: ended["one"].append(e.job_id))
    two.run_agent("a", job_id="same", user="x", on_end=lambda e: ended["two"].append(e.job_id))
    one.drain()
    two.drain()
    assert ended == {"one": ["same"], "two": ["same"]}
    assert one.env.callbacks is not two.env.callbacks


def test_run_callbacks_forget_and_empty() -> None:
    calls = RunCallbacks()
    assert calls.get("j", "on_end") is None
    calls.set("j", {"on_end": print})
    assert calls.get("j", "on_end") is print and len(calls) == 1
    calls.set("j", {})
    assert len(calls) == 0
    calls.set("j", {"on_end": print})
    calls.forget("j")
    assert calls.get("j", "on_end") is None


def test_the_app_builds_one_environment_with_its_flow_and_itself() -> None:
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), concurrency={"*": 1})
    assert isinstance(app.env, RunEnv)
    assert app.env.children is app and app.env.flow is app.flow
    assert app.env.active_flow() is app.flow
    assert App(storage=MemoryStorage(), scheduler=MemoryScheduler()).env.active_flow() is None


def _implicit_state(path: Path) -> list[str]:
    """ContextVars, and module-level dicts keyed by job id, in a library module."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "ContextVar":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} ContextVar")
        if isinstance(node, ast.Attribute) and node.attr == "ContextVar":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} ContextVar")
    return found


def test_no_context_var_carries_the_turns_environment() -> None:
    # OpenTelemetry's own context propagation is the one implicit context left (pipelines.engine.telemetry).
    files = [p for pkg in ("pipelines", "phases", "adapters") for p in (ROOT / pkg).rglob("*.py")
             if p.name != "telemetry.py"]
    assert files
    assert [hit for p in files for hit in _implicit_state(p)] == []
