"""An in-memory app whose chat agent has a title agent, for the CLI test of titles."""

from __future__ import annotations

from pydantic import BaseModel

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent
from pipelines.app import App
from pipelines.testing import ScriptedModel


class Title(BaseModel):
    title: str


def build() -> App:
    namer = Agent(name="namer", model=ScriptedModel(lambda msgs: '{"title": "Where my parcel is"}'),
                  output_schema=Title, stream=False)
    chat = Agent(name="chat", model=ScriptedModel(lambda msgs: "on its way"), title_agent=namer)
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[chat, namer])


app = build()


def reset() -> App:
    """Replace the module's app with a fresh one and return it."""
    global app
    app = build()
    return app
