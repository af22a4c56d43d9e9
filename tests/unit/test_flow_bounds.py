"""Every number from outside is bounded before use (issue 30, defect 11): Retry-After, limits, usage."""

from __future__ import annotations

import math
from typing import Any

import pytest

import phases.litellm_model as litellm_model
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.memory.flow import MemoryFlowStore
from pipelines import Agent, App
from pipelines.engine.errors import MAX_RETRY_AFTER_SECONDS, InvalidInputError, TransientModelError
from pipelines.engine.flow import MAX_CALL_TOKENS, MAX_WAIT_SECONDS, FlowControl, RateLimit
from pipelines.engine.models import JobStatus
from pipelines.engine.runner import AdvanceResult
from tests.unit.test_flow_control import NamedModel, add, make_app


@pytest.mark.parametrize("hint", [math.inf, 1e9])
def test_an_endless_retry_after_blocks_the_model_for_the_documented_maximum_only(hint: float) -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, fail_first=hint)
    app = make_app(model, clock, rate_limits=[RateLimit(model="scripted/w", rpm=600)])
    app.run_agent("w", job_id="a", user="go")
    app.advance("a")  # the provider says 429, retry after "for ever"
    app.run_agent("w", job_id="b", user="go")  # an unrelated job of the same model
    assert app.advance("b") is AdvanceResult.DEFERRED
    app.drain()
    assert {app.get(j).status for j in "ab"} == {JobStatus.COMPLETE}  # type: ignore[union-attr]
    assert 1000.0 + MAX_RETRY_AFTER_SECONDS - 1e-6 <= min(model.at) <= 1000.0 + MAX_RETRY_AFTER_SECONDS + 5


def test_a_retry_after_that_is_no_number_is_no_hint() -> None:
    clock = VirtualClock(1000.0)
    model = NamedModel(clock, fail_first=math.nan)
    app = make_app(model, clock, rate_limits=[RateLimit(model="scripted/w", rpm=600)])
    app.run_agent("w", job_id="a", user="go")
    assert app.advance("a") is AdvanceResult.RETRY_LATER  # after the turn's own backoff, not after "nan"
    app.run_agent("w", job_id="b", user="go")
    assert app.advance("b") is AdvanceResult.COMPLETED  # nothing blocked the model
    app.drain()
    assert app.get("a").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_a_transient_errors_retry_after_is_bounded() -> None:
    assert TransientModelError("x", retry_after=math.inf).retry_after == MAX_RETRY_AFTER_SECONDS
    assert TransientModelError("x", retry_after=1e300).retry_after == MAX_RETRY_AFTER_SECONDS
    assert TransientModelError("x", retry_after=-5).retry_after == 0.0
    assert TransientModelError("x", retry_after=math.nan).retry_after is None
    assert TransientModelError("x", retry_after=True).retry_after is None  # type: ignore[arg-type]
    assert TransientModelError("x", retry_after=12.5).retry_after == 12.5


class RateLimitedError(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("429")
        self.litellm_response_headers = headers


@pytest.mark.parametrize(("headers", "expected"), [
    ({"Retry-After": "inf"}, MAX_RETRY_AFTER_SECONDS),
    ({"Retry-After": "1e9"}, MAX_RETRY_AFTER_SECONDS),
    ({"retry-after-ms": "1e300"}, MAX_RETRY_AFTER_SECONDS),
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, MAX_RETRY_AFTER_SECONDS),
    ({"Retry-After": "nan"}, None),
])
def test_the_litellm_models_retry_after_header_is_bounded(headers: dict[str, str], expected: float | None) -> None:
    assert litellm_model._retry_after(RateLimitedError(headers)) == expected


@pytest.mark.parametrize("bad", [1e12, 1e300])
def test_a_rate_limit_refuses_rates_out_of_bounds(bad: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"RateLimit\.rpm must be a positive number of at most 1e\+09"):
        RateLimit(model="m", rpm=bad)
    with pytest.raises(InvalidInputError, match=r"RateLimit\.tpm"):
        RateLimit(model="m", tpm=bad)


@pytest.mark.parametrize("bad", [10**7, 2**63])
def test_a_concurrency_limit_out_of_bounds_is_refused_and_no_app_is_built(bad: Any) -> None:
    clock = VirtualClock(1000.0)
    with pytest.raises(InvalidInputError, match=r"concurrency limit for '\*' must be an int in \[1, 1000000\]"):
        make_app(NamedModel(clock), clock, concurrency={"*": bad})


def test_a_lease_too_long_for_a_concurrency_slot_is_refused_but_needs_no_slot_without_concurrency() -> None:
    clock = VirtualClock(1000.0)
    with pytest.raises(InvalidInputError, match=r"concurrency slot's lease \(1.5 x lease_seconds\)"):
        make_app(NamedModel(clock), clock, concurrency={"*": 1}, lease_seconds=1e9)
    make_app(NamedModel(clock), clock, lease_seconds=1e9)  # no concurrency: no slot to bound


def test_the_memory_store_refuses_an_endless_block_or_slot_and_writes_nothing() -> None:
    store = MemoryFlowStore()
    for bad in (math.inf, math.nan, -1.0, 0.0, MAX_RETRY_AFTER_SECONDS * 2):
        with pytest.raises(InvalidInputError, match="a model's block must be seconds"):
            store.block_rate("m", bad, now=0.0)
    assert store.take_rate("m", rpm=60.0, tpm=None, burst=1.0, tokens=1, now=0.0) == 0.0  # never blocked
    for bad in (math.inf, math.nan, 0.0):
        with pytest.raises(InvalidInputError, match="a concurrency slot's ttl"):
            store.take_slot("k", "a", limit=1, ttl=bad, now=0.0)
        with pytest.raises(InvalidInputError, match="a concurrency slot's ttl"):
            store.renew_slot("k", "a", ttl=bad, now=0.0)
    assert store.slots("k", 0.0) == []


class Endless(MemoryFlowStore):
    """A store whose state says "wait for ever" (hand-edited, or written by a version without bounds)."""

    def take_rate(self, model: str, **kwargs: Any) -> float:  # type: ignore[override]
        return math.inf

    def take_slot(self, key: str, member: str, **kwargs: Any) -> float:  # type: ignore[override]
        return math.inf


def test_a_stores_endless_wait_defers_a_turn_by_the_maximum_not_for_ever() -> None:
    control = FlowControl(Endless(), rate_limits=[RateLimit(model="m", rpm=60)], concurrency={"*": 1})
    assert control.before_call("m", 10, 0.0) == MAX_WAIT_SECONDS
    clock = VirtualClock(1000.0)
    app = App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
              agents=[Agent(name="w", model=NamedModel(clock), tools=[add], stream=False)],
              flow_store=Endless(), concurrency={"*": 1})
    app.run_agent("w", job_id="a", user="go", concurrency_key="k")
    assert app.advance("a") is AdvanceResult.DEFERRED  # not an error: it looks again later


class Recording(MemoryFlowStore):
    def __init__(self) -> None:
        super().__init__()
        self.adjusted: list[int] = []

    def adjust_rate(self, model: str, tokens: int) -> None:
        self.adjusted.append(tokens)


def test_a_providers_usage_counts_for_at_most_the_maximum() -> None:
    store = Recording()
    control = FlowControl(store, rate_limits=[RateLimit(model="m", tpm=1000)])
    control.after_call("m", 10, 10**30)
    control.after_call("m", 10, True)  # type: ignore[arg-type]
    control.after_call("m", 10, 2.5e9)  # type: ignore[arg-type]
    assert store.adjusted == [MAX_CALL_TOKENS - 10]
