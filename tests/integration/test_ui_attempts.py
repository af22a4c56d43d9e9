"""An attempt that never committed, shown as such on the timeline (issue 35).

A worker dies after the model answered (the answer is journaled) and before
the turn commits; the next attempt goes on from the journaled answer. Its
turn says "an earlier attempt was lost or fenced off" and draws no model call
for it. A turn that went on after an approval wait reused its answer too, and
says so without calling anything lost.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import Agent, App, tool
from pipelines.engine.models import Event, JobStatus
from pipelines.testing import ScriptedModel, reply
from pipelines.web.timeline import timeline
from pipelines.web.ui import ui_app

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient


class WorkerDied(BaseException):
    """Nothing in the library catches it: as if the process was killed."""


died: list[int] = []


@tool
def ship(order: int) -> str:
    """Ship an order."""
    if not died:
        died.append(order)
        raise WorkerDied
    return f"shipped {order}"


def _model(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    if msgs[-1].get("role") == "user":
        return reply("shipping", {"id": "call_1", "type": "function",
                                  "function": {"name": "ship", "arguments": json.dumps({"order": 7})}})
    return reply("done")


def test_a_turn_whose_first_attempt_died_says_so_on_the_timeline() -> None:
    died.clear()
    clock = VirtualClock(1_800_000_000)
    app = App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
              agents=[Agent(name="desk", model=ScriptedModel(_model), tools=[ship])], lease_seconds=30)
    app.run_agent("desk", job_id="ship-1", user="ship order 7")
    with pytest.raises(WorkerDied):
        app.drain()
    clock.advance(60)  # the dead worker's lease runs out
    app.advance_due()  # the sweep
    app.drain()
    assert app.get("ship-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    first = next(e for e in app.events("ship-1") if e.type == "model_response")
    assert first.data == {**first.data, "reused": True}
    turns = timeline(app.events("ship-1"))
    assert turns[0].abandoned and not turns[0].span("model") and not turns[1].reused
    with TestClient(ui_app(app), base_url="http://127.0.0.1") as client:
        page = client.get("/jobs/ship-1").text
    row = page.split('id="turn-1"', 1)[1].split("</tr>", 1)[0]
    assert "an earlier attempt was lost or fenced off" in row and 'class="span-model' not in row


def test_a_turn_that_went_on_after_a_wait_is_not_called_lost() -> None:
    events = [Event(timestamp=1.0, type="job_started"), Event(timestamp=2.0, type="approval_requested"),
              Event(timestamp=5.0, type="call_approved"),
              Event(timestamp=6.0, type="turn_started", turn=1, data={"attempt": 0}),
              Event(timestamp=6.0, type="model_response", turn=1, data={"reused": True, "cost_usd": 0.5}),
              Event(timestamp=7.0, type="turn_committed", turn=1, data={"messages": [1]}),
              Event(timestamp=8.0, type="turn_started", turn=2, data={"attempt": 0}),
              Event(timestamp=9.0, type="model_response", turn=2, data={}),
              Event(timestamp=9.5, type="turn_committed", turn=2, data={"messages": [3]})]
    first, second = timeline(events)
    assert first.reused and first.waited and not first.abandoned and first.cost == 0.5
    assert not first.span("model") and [s.kind for s in first.spans] == ["wait"]
    assert not second.reused and not second.waited and second.span("model")[0].seconds == 1.0
