"""The flow-control ports (adapters/base.py ``FlowCapable`` and ``FlowStore``) on every storage that declares
``Feature.FLOW``: rate buckets, blocks and concurrency slots.

``now`` is the caller's clock for the memory and SQLite stores and ignored by
Redis (its own ``TIME``, one clock for every worker), so every call passes
the wall clock and the few tests of time passing really sleep (briefly).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from adapters.base import Feature, FlowCapable, FlowStore
from pipelines.engine.capabilities import as_feature
from pipelines.engine.errors import InvalidInputError
from tests.contract.ports import covers

EPS = 0.05  # the arithmetic is the same everywhere; Redis's clock and ours are read a moment apart


@pytest.fixture
def storage(make_storage: Any) -> Any:
    return make_storage()


def flow(storage: Any) -> FlowStore:
    capable = as_feature(storage, Feature.FLOW, FlowCapable)  # type: ignore[type-abstract]
    if capable is None:
        pytest.skip(f"{type(storage).__name__} does not declare flow")
    return capable.flow_store()


now = time.time


def take(fs: FlowStore, model: str, *, rpm: float | None = None, tpm: float | None = None, burst: float = 1.0,
         tokens: int = 0) -> float:
    return fs.take_rate(model, rpm=rpm, tpm=tpm, burst=burst, tokens=tokens, now=time.time())


@covers("FlowCapable.flow_store", "FlowStore.take_slot")
def test_the_flow_store_is_the_storages_own_state(storage: Any) -> None:
    fs = flow(storage)
    assert isinstance(fs, FlowStore)
    assert fs.take_slot("k", "a", limit=1, ttl=30, now=time.time()) == 0
    # Asked again, the storage hands out the same state: the slot is held there too.
    assert flow(storage).take_slot("k", "b", limit=1, ttl=30, now=time.time()) > 0


@covers("FlowStore.take_rate")
def test_a_rate_bucket_grants_its_burst_then_says_how_long_to_wait(storage: Any) -> None:
    fs = flow(storage)
    assert take(fs, "m", rpm=60, burst=2) == 0
    assert take(fs, "m", rpm=60, burst=2) == 0
    wait = take(fs, "m", rpm=60, burst=2)  # two requests of a 60 rpm bucket: the next one in about a second
    assert 1.0 - 0.5 < wait <= 1.0 + 1e-9
    again = take(fs, "m", rpm=60, burst=2)  # a refusal took nothing: the wait only shrinks
    assert 0 < again <= wait + 1e-9
    assert take(fs, "other", rpm=60, burst=2) == 0  # one bucket per model
    for _ in range(5):
        assert take(fs, "free", tokens=10**6) == 0  # no limit: never a wait
    # Tokens: a 600 tpm bucket of six seconds holds 60.
    assert take(fs, "t", tpm=600, burst=6, tokens=50) == 0
    wait = take(fs, "t", tpm=600, burst=6, tokens=50)
    assert 4.0 - 0.5 < wait <= 4.0 + 1e-9  # 40 tokens short at 10 a second
    # More than the bucket holds goes through when it is full (then runs into debt): no request waits forever.
    assert take(fs, "big", tpm=60, burst=1, tokens=1000) == 0
    assert take(fs, "big", tpm=60, burst=1, tokens=1) > 900


@covers("FlowStore.adjust_rate", "FlowStore.take_rate")
def test_adjusting_a_bucket_takes_or_gives_back_tokens(storage: Any) -> None:
    fs = flow(storage)
    assert take(fs, "t", tpm=600, burst=6, tokens=50) == 0  # 10 of 60 left
    fs.adjust_rate("t", -40)  # the call used 40 fewer than estimated: back to 50
    assert take(fs, "t", tpm=600, burst=6, tokens=50) == 0  # about 0 left
    fs.adjust_rate("t", 30)  # it used 30 more: in debt
    wait = take(fs, "t", tpm=600, burst=6, tokens=1)
    assert 3.1 - 0.5 < wait <= 3.1 + EPS
    fs.adjust_rate("unknown", 10**6)  # a model never taken from: nothing, its bucket starts full
    assert take(fs, "unknown", tpm=600, burst=6, tokens=60) == 0


@covers("FlowStore.block_rate", "FlowStore.take_rate")
def test_a_block_refuses_every_take_until_it_ends_and_is_never_shortened(storage: Any) -> None:
    fs = flow(storage)
    fs.block_rate("m", 30, now=time.time())
    wait = take(fs, "m", rpm=600, burst=10)
    assert 30 - 1 < wait <= 30 + EPS
    fs.block_rate("m", 5, now=time.time())  # a shorter block does not shorten the first
    assert 30 - 2 < take(fs, "m", rpm=600, burst=10) <= 30 + EPS
    assert take(fs, "other", rpm=600, burst=10) == 0
    for bad in (0, -1, math.nan, math.inf, 10**9):
        with pytest.raises(InvalidInputError):
            fs.block_rate("x", bad, now=time.time())
    assert take(fs, "x", rpm=600, burst=10) == 0  # a refused block wrote nothing


@covers("FlowStore.take_slot", "FlowStore.release_slot", "FlowStore.renew_slot")
def test_slots_are_held_up_to_the_limit_renewed_by_their_holder_and_released(storage: Any) -> None:
    fs = flow(storage)
    assert fs.take_slot("k", "a", limit=2, ttl=30, now=now()) == 0
    assert fs.take_slot("k", "b", limit=2, ttl=30, now=now()) == 0
    wait = fs.take_slot("k", "c", limit=2, ttl=30, now=now())
    assert 0 < wait <= 30 + EPS  # until the first held slot runs out
    assert fs.take_slot("k", "a", limit=2, ttl=30, now=now()) == 0  # its holder takes it again
    fs.release_slot("k", "nobody")  # not a holder: nothing
    assert fs.take_slot("k", "c", limit=2, ttl=30, now=now()) > 0
    fs.release_slot("k", "a")
    fs.release_slot("k", "a")  # twice: a no-op
    assert fs.take_slot("k", "c", limit=2, ttl=30, now=now()) == 0
    assert fs.take_slot("other", "d", limit=1, ttl=30, now=now()) == 0  # one set of slots per key
    assert fs.renew_slot("k", "b", ttl=30, now=now()) is True
    assert fs.renew_slot("k", "a", ttl=30, now=now()) is False  # released: renewing takes nothing
    assert fs.take_slot("k", "e", limit=2, ttl=30, now=now()) > 0  # b and c still hold both
    assert fs.renew_slot("free", "x", ttl=30, now=now()) is False
    assert fs.take_slot("free", "y", limit=1, ttl=30, now=now()) == 0  # x's refused renew wrote nothing
    for bad in (0, -1, math.nan, math.inf, 10**9):
        with pytest.raises(InvalidInputError):
            fs.take_slot("bad", "z", limit=1, ttl=bad, now=now())
        with pytest.raises(InvalidInputError):
            fs.renew_slot("k", "b", ttl=bad, now=now())
    assert fs.take_slot("bad", "z", limit=1, ttl=30, now=now()) == 0  # the refused takes wrote nothing


@covers("FlowStore.take_slot", "FlowStore.renew_slot", "FlowStore.block_rate", "FlowStore.take_rate")
def test_a_block_ends_and_a_slot_whose_holder_stopped_renewing_comes_back(storage: Any) -> None:
    fs = flow(storage)
    # Half a second, not a tenth: on a loaded machine a tenth passed between the block and the take.
    fs.block_rate("short", 0.5, now=time.time())
    assert take(fs, "short", rpm=600, burst=10) > 0
    assert fs.take_slot("k", "dead", limit=1, ttl=0.5, now=time.time()) == 0
    assert 0 < fs.take_slot("k", "next", limit=1, ttl=30, now=time.time()) <= 0.5 + EPS
    time.sleep(0.55)
    assert take(fs, "short", rpm=600, burst=10) == 0
    assert fs.renew_slot("k", "dead", ttl=30, now=time.time()) is False  # run out: not taken back past the limit
    assert fs.take_slot("k", "next", limit=1, ttl=30, now=time.time()) == 0


@covers("FlowStore.take_slot", "FlowStore.release_slot")
def test_slots_go_to_jobs_in_the_order_they_asked(storage: Any) -> None:
    fs = flow(storage)
    assert fs.take_slot("k", "a w1", limit=1, ttl=30, now=now()) == 0
    assert fs.take_slot("k", "b w2", limit=1, ttl=30, now=now()) > 0  # b waits in the key's line
    fs.release_slot("k", "a w1")
    # a's next turn asks at once, before b's retry comes: it goes behind b, not past it.
    assert fs.take_slot("k", "a w3", limit=1, ttl=30, now=now()) > 0
    assert fs.take_slot("k", "c w4", limit=1, ttl=30, now=now()) > 0  # and c behind a
    assert fs.take_slot("k", "b w5", limit=1, ttl=30, now=now()) == 0  # b's retry: its place is first
    fs.release_slot("k", "b w5")
    assert fs.take_slot("k", "c w6", limit=1, ttl=30, now=now()) > 0  # a asked before c
    assert fs.take_slot("k", "a w7", limit=1, ttl=30, now=now()) == 0
    fs.release_slot("k", "a w7")
    assert fs.take_slot("k", "c w8", limit=1, ttl=30, now=now()) == 0  # the line is empty again
    fs.release_slot("k", "c w8")
    assert fs.take_slot("k", "d w9", limit=1, ttl=30, now=now()) == 0  # a job not in line takes a free slot


@covers("FlowStore.release_slot")
def test_a_released_slot_names_the_job_first_in_line_to_wake(storage: Any) -> None:
    fs = flow(storage)
    assert fs.take_slot("k", "a w1", limit=1, ttl=30, now=now()) == 0
    assert fs.release_slot("k", "a w1") is None  # nobody waits
    assert fs.take_slot("k", "a w2", limit=1, ttl=30, now=now()) == 0
    assert fs.take_slot("k", "b w3", limit=1, ttl=30, now=now()) > 0
    assert fs.take_slot("k", "c w4", limit=1, ttl=30, now=now()) > 0
    assert fs.release_slot("k", "a w2") == "b"  # first in line: the caller wakes it
    assert fs.take_slot("k", "b w5", limit=1, ttl=30, now=now()) == 0
    assert fs.release_slot("k", "b w5") == "c"


@covers("FlowStore.take_slot")
def test_a_job_not_in_line_takes_a_free_slot_only_if_the_waiting_jobs_leave_one(storage: Any) -> None:
    fs = flow(storage)
    for member in ("a", "b", "c"):
        assert fs.take_slot("k", member, limit=3, ttl=30, now=now()) == 0
    assert fs.take_slot("k", "w1", limit=3, ttl=30, now=now()) > 0
    fs.release_slot("k", "a")
    fs.release_slot("k", "b")
    assert fs.take_slot("k", "x", limit=3, ttl=30, now=now()) == 0  # two free, one waiting: one is left for x
    assert fs.take_slot("k", "y", limit=3, ttl=30, now=now()) > 0  # one free, one waiting: it is w1's
    assert fs.take_slot("k", "w1", limit=3, ttl=30, now=now()) == 0
    assert fs.take_slot("k", "w1", limit=3, ttl=30, now=now()) == 0  # its holder takes it again (renewal)


@covers("FlowStore.take_slot")
def test_a_slot_member_that_is_not_a_job_is_refused(storage: Any) -> None:
    fs = flow(storage)
    for bad in ("", "?1.0 a", " a", None, 7):
        with pytest.raises(InvalidInputError, match="member"):
            fs.take_slot("k", bad, limit=1, ttl=30, now=now())  # type: ignore[arg-type]
    assert fs.take_slot("k", "a", limit=1, ttl=30, now=now()) == 0  # the refused takes wrote nothing
