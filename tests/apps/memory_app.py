"""A small in-memory App for the CLI unit tests: ``--app tests.apps.memory_app:app``.

Tests call :func:`reset` for a fresh app; ``load_app`` reads the module
attribute each time, so every CLI call in a test sees the same storage.
"""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import Done, Fail, Next, Phase, PhaseContext
from pipelines.app import App

START = 1_700_000_000.0


def _extract(ctx: PhaseContext[Any]) -> Next:
    ctx.log("extracted 3 rows")
    return Next("load", state={"rows": [1, 2, 3]})


def _load(ctx: PhaseContext[Any]) -> Done:
    return Done(result={"loaded": len(ctx.state["rows"])})


def _flaky(ctx: PhaseContext[Any]) -> Next | Fail:
    # Fails on a job's first attempt; a "resume" retry (attempt 1) gets through.
    if ctx.attempt == 0:
        return Fail("boom: upstream said no")
    return Next("finish")


def _finish(ctx: PhaseContext[Any]) -> Done:
    return Done(result="ok")


def _chat(ctx: PhaseContext[Any]) -> Done:
    ctx.append_messages([
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sum": 2}'},
        {"role": "assistant", "content": "the sum is 2"},
    ])
    return Done()


def _wait(ctx: PhaseContext[Any]) -> Next:
    return Next("wait", delay=3600)  # a job that stays running, for cancel tests


def build() -> App:
    clock = VirtualClock(start=START)
    return App(
        storage=MemoryStorage(clock=clock),
        scheduler=MemoryScheduler(clock=clock),
        pipelines={
            "etl": [Phase("extract", _extract), Phase("load", _load)],
            "flaky": [Phase("flaky", _flaky), Phase("finish", _finish)],
            "chat": [Phase("chat", _chat)],
            "slow": [Phase("wait", _wait)],
        },
    )


app = build()


def reset() -> App:
    """Replace the module's app with a fresh one and return it."""
    global app
    app = build()
    return app
