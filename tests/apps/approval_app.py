"""An in-memory app with an agent whose refund tool needs approval (for CLI tests)."""

from __future__ import annotations

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, tool
from pipelines.testing import ScriptedModel, call, reply

refunds: list[int] = []


@tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refund an amount."""
    refunds.append(amount)
    return f"refunded {amount}"


def _model() -> ScriptedModel:
    return ScriptedModel(lambda msgs: reply(None, {**call("refund", amount=7), "id": "r1"})
                         if len(msgs) == 1 else reply("done"))


def reset() -> App:
    """A fresh app (storage, scheduler, agent) in this module's ``app``."""
    global app
    refunds.clear()
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[Agent(name="desk", model=_model(),
                                                                                  tools=[refund])])
    return app


app = reset()
