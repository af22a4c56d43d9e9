"""Agents for the system tests of operator controls and per-run options on real ``pipelines worker`` processes.

Workers load ``tests.apps.controls_app:app`` (a factory, configured from the
environment); the test process builds its own handle with :func:`build_app`.

    REDIS_URL               the test's private redis-server (required)
    CONTROLS_CONTINUE_FOR   the App's ``continue_for`` in seconds (default 0)

Models are scripted functions of the messages: deterministic, no network.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, tool
from pipelines.app import App
from pipelines.engine.models import Message
from pipelines.testing import ScriptedModel, call, reply

APP_PATH = "tests.apps.controls_app:app"
QUEUE = "controls"
TICK_SECONDS = 0.25  # each ticker turn sleeps this long in its tool, so a turn is nearly always in flight
NUDGE_WORD = "JSON"  # in the agent turn's request for a structured answer


def started_key(job_id: str) -> str:
    """A Redis list: one entry per ticker turn that started (its model was called), never trimmed."""
    return f"controls:started:{job_id}"


def signal_key(job_id: str) -> str:
    """A Redis list the test pops to learn that a ticker turn just started."""
    return f"controls:signal:{job_id}"


class Invoice(BaseModel):
    """The output schema a run names per run (registered on the App)."""

    number: str
    total: int


def _tick(n: int) -> str:
    """Wait a moment (the turn in flight)."""
    time.sleep(TICK_SECONDS)
    return f"tick {n}"


def _add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _tool_results(messages: list[Message]) -> int:
    return sum(1 for m in messages if m["role"] == "tool")


def _ticker_model(storage: RedisStorage) -> ScriptedModel:
    """The user message is "tick <job id> <turns>": that many tool turns, then "done"."""

    def answer(messages: list[Message]) -> Message:
        _, job_id, turns = str(messages[0]["content"]).split()
        done = _tool_results(messages)
        # Marks the turn as started before its tool sleeps: the test counts turns that began.
        storage.client.rpush(started_key(job_id), str(done + 1))
        storage.client.rpush(signal_key(job_id), str(done + 1))
        if done >= int(turns):
            return reply("done")
        return reply(None, call("tick", n=done + 1))

    return ScriptedModel(answer)


def _looper(messages: list[Message]) -> Message:
    """Never stops by itself: only a turn limit ends its runs."""
    return reply(None, call("add", a=_tool_results(messages), b=1))


def _clerk(messages: list[Message]) -> Message:
    """Adds once, answers in prose; asked for JSON, answers with an Invoice."""
    last = messages[-1]
    if last["role"] == "user" and NUDGE_WORD in str(last.get("content")):
        return reply('{"number": "A-1", "total": 5}')
    if _tool_results(messages) == 0:
        return reply(None, call("add", a=2, b=3))
    return reply("the total is 5")


def build_app(redis_url: str, *, continue_for: float = 0.0) -> App:
    """The App workers run (and the test holds): agents ticker, looper and clerk on ``redis_url``."""
    storage = RedisStorage.from_url(redis_url)
    scheduler = RQScheduler(storage.client, queue=QUEUE, app=APP_PATH, job_timeout=60, result_ttl=60,
                            failure_ttl=3600)
    tick, add = tool(_tick, name="tick"), tool(_add, name="add")
    agents = [
        Agent(name="ticker", model=_ticker_model(storage), tools=[tick], max_turns=100),
        Agent(name="looper", model=ScriptedModel(_looper), tools=[add], max_turns=10),
        Agent(name="clerk", model=ScriptedModel(_clerk), tools=[add], max_turns=10),
    ]
    return App(storage=storage, scheduler=scheduler, agents=agents, schemas=[Invoice], continue_for=continue_for)


def app() -> App:
    """What ``pipelines worker --app tests.apps.controls_app:app`` loads."""
    return build_app(os.environ["REDIS_URL"], continue_for=float(os.environ.get("CONTROLS_CONTINUE_FOR", "0")))
