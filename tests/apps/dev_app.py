"""An App on memory adapters with the W1 agent and a small pipeline, for ``pipelines dev`` (tests/system/test_dev.py).

``pipelines dev --app tests.apps.dev_app:app`` serves its twin on an SQLite file.
"""

from __future__ import annotations

from typing import Any

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, Done, Phase, PhaseContext
from pipelines.testing import ScriptedModel
from tests.apps.sqlite_app import add, answer


def _one(ctx: PhaseContext[Any]) -> Done:
    return Done(result="one")


app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
          agents=[Agent(name="w1", model=ScriptedModel(answer), tools=[add], max_turns=12, stream=False)],
          pipelines={"etl": [Phase("one", _one)]})
