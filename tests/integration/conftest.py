"""Fixtures of the Redis integration tests: a raw client and a RedisStorage on the session's redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from adapters.redis import RedisStorage


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A plain redis-py client, for reading what the adapters wrote."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def storage(redis_url: str, request: pytest.FixtureRequest) -> Iterator[RedisStorage]:
    """A RedisStorage under the test module's ``PREFIX`` (default ``"itest"``)."""
    s = RedisStorage.from_url(redis_url, prefix=getattr(request.module, "PREFIX", "itest"))
    yield s
    s.client.close()
