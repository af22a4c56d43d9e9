"""Every paid model call counts: an attempt fenced off after the model answered still adds its usage, and what
the model told it is kept for the turn's page (memory, Redis and SQLite)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from adapters.redis import RedisStorage
from adapters.sqlite import SQLiteStorage
from phases.model import ModelRequest, ModelResponse
from pipelines import Agent, App, JobStatus
from pipelines.engine.models import Usage
from pipelines.web.ui import ui_app
from tests.unit.helpers import memory

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient


class StolenOnce:
    """Answers; on the first call, another worker takes the job's lease while the model is thinking."""

    def __init__(self, steal: Any) -> None:
        self.steal = steal
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            self.steal(request.job_id)
            return ModelResponse(message={"role": "assistant", "content": "what the fenced-off attempt was told"
                                                                            " <b>\u202e</b>"},
                                 finish_reason="stop", raw={"id": "chatcmpl-first", "system_fingerprint": "fp_1"},
                                 usage=Usage(prompt_tokens=100, completion_tokens=10, cost_usd=0.5, model_calls=1))
        return ModelResponse(message={"role": "assistant", "content": "done"}, finish_reason="stop",
                             usage=Usage(prompt_tokens=100, completion_tokens=10, cost_usd=0.5, model_calls=1))


@pytest.fixture(params=["memory", "redis", "sqlite"])
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
    if request.param == "sqlite":
        now = [1_000_000.0]
        lite = SQLiteStorage(str(request.getfixturevalue("tmp_path") / "dropped.db"), clock=lambda: now[0])

        def steal_sqlite(job_id: str) -> None:
            now[0] += 61  # the first worker's lease runs out (the lease clock of every process on the file) ...
            assert lite.acquire_lease(job_id, "thief", 60) is not None  # ... and another worker takes it
            lite.release_lease(job_id, "thief")

        model = StolenOnce(steal_sqlite)
        yield App(storage=lite, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, stream=False)]), model
        return
    store = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix="dropped")

    def steal_redis(job_id: str) -> None:
        store.client.delete(store.keys(job_id).lease)
        assert store.acquire_lease(job_id, "thief", 60) is not None
        store.release_lease(job_id, "thief")

    model = StolenOnce(steal_redis)
    yield App(storage=store, scheduler=MemoryScheduler(), agents=[Agent(name="a", model=model, stream=False)]), model
    store.close()


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
    assert app.messages("d")[-1]["content"] == "done"  # the transcript holds the committed answer only


def test_what_a_fenced_off_attempt_was_told_is_kept_and_shown_on_the_turns_page(
        app_and_steal: tuple[App, StolenOnce]) -> None:
    app, _ = app_and_steal
    app.run_agent("a", job_id="d", messages=["hi"])
    app.drain()
    app.advance_due()
    app.drain()
    [entry] = app.read.fenced_answers("d")
    assert entry["turn"] == 1 and entry["attempt"] == 0 and isinstance(entry["at"], float) and entry["attempt_id"]
    answer = entry["answer"]
    assert answer["message"] == {"role": "assistant", "content": "what the fenced-off attempt was told <b>\u202e</b>"}
    assert answer["raw"] == {"id": "chatcmpl-first", "system_fingerprint": "fp_1"}
    assert answer["usage"]["cost_usd"] == 0.5
    # Kept with every field, though the journal leaves the defaults out: the page shows zero counts as zeros.
    assert {"finish_reason", "model", "tools_offered", "request"} <= set(answer)
    assert set(answer["usage"]) == {"prompt_tokens", "completion_tokens", "cost_usd", "model_calls",
                                    "unknown_cost_calls"}
    assert app.read.fenced_answers("d", 2) == []
    with TestClient(ui_app(app), base_url="http://127.0.0.1") as http:
        page = http.get("/jobs/d/turns/1").text
    assert "Attempts fenced off after the model answered" in page and 'id="fenced-1"' in page
    assert "what the fenced-off attempt was told &lt;b&gt;" in page and "chatcmpl-first" in page
    assert "\u202e" not in page and "&lt;U+202E&gt;" in page  # escaped, and a bidi control shown as what it is
    assert "done" in page  # the committed answer is still the one the page calls the turn's


def test_a_long_fenced_off_answer_is_kept_cut_to_its_start() -> None:
    from phases.agent_turn.model_call import KEPT_ANSWER_CHARS, _kept_answer

    small = {"message": {"role": "assistant", "content": "short"}, "finish_reason": "stop"}
    assert _kept_answer(small) is small
    long = {"message": {"role": "assistant", "content": "x" * 50_000}, "finish_reason": "length",
            "usage": {"model_calls": 1}, "model": "m"}
    kept = _kept_answer(long)
    assert kept["finish_reason"] == "length" and kept["usage"] == {"model_calls": 1} and kept["model"] == "m"
    assert kept["cut"] > 50_000 and kept["preview"].startswith('{"message"')
    assert len(json.dumps(kept)) < KEPT_ANSWER_CHARS


def test_the_turn_page_survives_a_fenced_off_entry_of_odd_shape() -> None:
    """What storage hands back is shown as it is, never trusted to have the engine's shape."""
    storage, scheduler, _ = memory()
    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="a", model=StolenOnce(lambda job_id: None), stream=False)])
    app.run_agent("a", job_id="odd", messages=["hi"])
    app.drain()
    for i, entry in enumerate([
            {"turn": 1, "attempt": "x", "attempt_id": ["?"], "at": "yesterday",
             "answer": {"usage": {"prompt_tokens": "many", "cost_usd": "free"}, "finish_reason": 7, "message": None}},
            {"turn": 1, "answer": "not a dict"}, {"turn": 1}]):
        storage.add_fenced_answer("odd", Usage(), entry, token=f"t{i}")
    with TestClient(ui_app(app), base_url="http://127.0.0.1") as http:
        page = http.get("/jobs/odd/turns/1")
    assert page.status_code == 200
    assert 'id="fenced-1"' in page.text and 'id="fenced-3"' in page.text and "attempt ?" in page.text
    assert "many prompt" in page.text

