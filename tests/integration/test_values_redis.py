"""Values that storage accepts can always be read back, on real Redis (issue items 4 and 5).

The same bad value kinds and write paths as tests/unit/test_values.py, against
RedisStorage: the typed error, not one key written or changed, and the job
still loads. Values exactly at the limits round-trip through Redis unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage
from pipelines.engine.errors import InvalidInputError, StateNotSerializableError
from pipelines.engine.models import LogEntry
from tests.unit.test_values import AT_LIMIT, BAD, PATHS, commit_with, read_back, start

PREFIX = "vals"


def dump(r: redis.Redis) -> dict[bytes, Any]:
    """Every key with its full value, for before/after comparisons."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter("*")):
        raw = r.type(key)
        kind = raw.decode() if isinstance(raw, bytes) else str(raw)
        if kind == "string":
            out[key] = r.get(key)
        elif kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = r.xrange(key)
        else:
            out[key] = kind
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "error", "why"), BAD)
def test_a_value_redis_could_not_hand_back_is_refused_and_no_key_changes(
        storage: RedisStorage, r: redis.Redis, path: Callable[..., None], value: Any, error: type[Exception],
        why: str) -> None:
    before_rec = start(storage)
    before = dump(r)
    with pytest.raises(error) as info:
        path(storage, "j", value)
    assert isinstance(info.value, InvalidInputError) and why in str(info.value)
    assert dump(r) == before
    assert storage.get_job("j") == before_rec and storage.get_job("new") is None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "expected"), AT_LIMIT)
def test_a_value_exactly_at_the_limits_round_trips_through_redis(storage: RedisStorage, path: Callable[..., None],
                                                                 value: Any, expected: Any) -> None:
    start(storage)
    path(storage, "j", value)
    back = read_back(storage, path, "j")
    assert back == expected and type(back) is type(expected)


def test_a_bad_log_line_on_redis_is_refused_and_no_key_changes(storage: RedisStorage, r: redis.Redis) -> None:
    start(storage)
    before = dump(r)
    with pytest.raises(StateNotSerializableError, match=r"a log entry: message contains a lone surrogate"):
        commit_with(storage, "j", logs=[LogEntry(timestamp=1.0, message="bad \udfff")])
    with pytest.raises(StateNotSerializableError, match=r"a log entry: timestamp is not JSON-serialisable"):
        commit_with(storage, "j", logs=[LogEntry(timestamp=math.inf, message="fine")])
    assert dump(r) == before
    assert [e.message for e in storage.logs("j")] == []
