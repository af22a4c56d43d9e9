"""Every paid model call counts: an attempt fenced off after the model answered still adds its usage."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App, JobStatus
from pipelines.engine.models import Usage
from tests.unit.helpers import memory


class StolenOnce:
    """Answers; on the first call, another worker takes the job's lease while the model is thinking."""

    def __init__(self, steal: Any) -> None:
        self.steal = steal
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            self.steal(request.job_id)
        return ModelResponse(message={"role": "assistant", "content": "done"}, finish_reason="stop",
                             usage=Usage(prompt_tokens=100, completion_tokens=10, cost_usd=0.5, model_calls=1))


@pytest.fixture(params=["memory", "redis"])
def app_and_steal(request: pytest.FixtureRequest) -> Iterator[tuple[App, StolenOnce]]:
    if request.param == "memory":
        storage, scheduler, clock = memory()

        def steal(job_id: str) -> None:
            clock.advance(61)  # the first worker's lease runs out ...
            assert storage.acquire_lease(job_id, "thief", 60) is not None  # ... and another worker takes it
            storage.release_lease(job_id, "thief")

        model = StolenOnce(steal)
        yield App(storage=storage, scheduler=scheduler, agents=[Agent(name="a", model=model, stream=False)]), model
        return
    store = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="dropped")

    def steal_redis(job_id: str) -> None:
        store.client.delete(store.keys(job_id).lease)
        assert store.acquire_lease(job_id, "thief", 60) is not None
        store.release_lease(job_id, "thief")

    model = StolenOnce(steal_redis)
    yield App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, stream=False)]), model
    store.client.close()


def test_an_attempt_fenced_off_after_the_model_answered_still_counts_its_usage(
        app_and_steal: tuple[App, StolenOnce]) -> None:
    app, model = app_and_steal
    app.run_agent("a", job_id="d", messages=["hi"])
    app.drain()  # the first attempt is fenced off at its journal write
    app.advance_due()  # the job is due again: a worker runs the turn and commits it
    app.drain()
    view = app.get("d")
    assert view is not None and view.status is JobStatus.COMPLETE and model.calls == 2
    assert view.usage.model_calls == 2 and view.usage.cost_usd == pytest.approx(1.0)  # both paid calls
    assert view.record.usage.model_calls == 1 and view.record.dropped.model_calls == 1
