"""Agents whose tools need the turn's environment on other threads (issue 29, defect 13 of issue 30).

An agent used as a tool starts a child job through ``ToolContext.env``. Each
parent here makes that call from a different thread of the tool runner:

- ``boss_timed``: the agent has ``tool_timeout``, so the child tool runs on the
  timeout's own thread;
- ``boss_mixed``: the child tool (with a ``timeout`` of its own) runs beside an
  ``async def`` tool in one turn, so the calls go through the async bridge's
  loop and the tool pool; the async tool and a timed ``def`` tool report what
  their ``ToolContext`` carried (the run's context, the App's environment).

``build(storage, scheduler)`` makes the App for a test on memory; the module's
``app`` is the one RQ workers load (``REDIS_URL`` from the environment).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pipelines import Agent, ToolContext, tool
from pipelines.app import App
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

APP_PATH = "tests.apps.env_app:app"


def _child(messages: list[Message]) -> Any:
    return f"child says: {messages[-1]['content']}"


def _timed_parent(messages: list[Message]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, {**call("researcher", input="look it up"), "id": "c0"})
    return f"parent heard: {messages[-1]['content']}"


def _mixed_parent(messages: list[Message]) -> Any:
    if messages[-1]["role"] == "user":
        return reply(None, {**call("researcher", input="dig"), "id": "c0"}, {**call("probe_async"), "id": "c1"},
                     {**call("probe_timed"), "id": "c2"})
    results = [m["content"] for m in messages if m["role"] == "tool"]
    return "parent heard: " + " | ".join(results)


def _report(ctx: ToolContext, how: str) -> str:
    # What a tool can see: the App through its environment, and the run's context.
    return f"{how}: app={ctx.env.children is not None} context={ctx.context}"


@tool
async def probe_async(ctx: ToolContext) -> str:
    """Say what the async tool's context carries."""
    await asyncio.sleep(0)
    return _report(ctx, "async")


@tool(timeout=10)
def probe_timed(ctx: ToolContext) -> str:
    """Say what the timed tool's context carries."""
    return _report(ctx, "timed")


def build(storage: Any, scheduler: Any) -> App:
    researcher = Agent(name="researcher", model=ScriptedModel(_child))
    timed = Agent(name="boss_timed", model=ScriptedModel(_timed_parent), tool_timeout=10,
                  tools=[researcher.as_tool(description="Research a question.")])
    as_tool = researcher.as_tool(description="Research a question.")
    as_tool.timeout = 10  # the child tool's own timeout: it too runs on a thread of its own
    mixed = Agent(name="boss_mixed", model=ScriptedModel(_mixed_parent),
                  tools=[as_tool, probe_async, probe_timed])
    return App(storage=storage, scheduler=scheduler, agents=[timed, mixed])


def _worker_app() -> App | None:
    url = os.environ.get("REDIS_URL")
    if not url:
        return None
    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler

    storage = RedisStorage.from_url(url, prefix="envapp")
    return build(storage, RQScheduler(storage.client, queue="envapp", app=APP_PATH, job_timeout=60,
                                      result_ttl=60, failure_ttl=600, namespace=storage.prefix))


app = _worker_app()
