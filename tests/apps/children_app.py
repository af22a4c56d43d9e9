"""An in-memory app whose agent calls another agent as a tool (a child job), for the CLI tests."""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent
from pipelines.app import App
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply


def _child(messages: list[Message]) -> Any:
    return f"child says: {messages[-1]['content']}"


def _parent(messages: list[Message]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, {**call("researcher", input="look it up"), "id": "c0"})
    return f"parent heard: {messages[-1]['content']}"


def build() -> App:
    researcher = Agent(name="researcher", model=ScriptedModel(_child))
    boss = Agent(name="boss", model=ScriptedModel(_parent),
                 tools=[researcher.as_tool(description="Research a question.")])
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[boss])


app = build()


def reset() -> App:
    """Replace the module's app with a fresh one and return it."""
    global app
    app = build()
    return app
