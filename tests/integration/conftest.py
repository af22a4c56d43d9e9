"""Fixtures of the integration tests: a raw Redis client, a RedisStorage on the session's redis-server, each storage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from adapters.redis import RedisStorage
from pipelines import worker
from pipelines.app import App


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
    s.close()


@pytest.fixture(params=["memory", "sqlite", "redis"])
def each_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The test once on each storage: a MemoryStorage, an SQLite file, a RedisStorage under a fresh prefix."""
    if request.param == "memory":
        from adapters.memory import MemoryStorage

        yield MemoryStorage()
        return
    if request.param == "sqlite":
        from adapters.sqlite import SQLiteStorage

        s: Any = SQLiteStorage(str(tmp_path / "each.db"))
    else:
        s = RedisStorage.from_url(request.getfixturevalue("redis_url"), prefix=f"each{uuid.uuid4().hex[:8]}")
    yield s
    s.close()


@pytest.fixture
def app(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    """``tests.apps.redis_app:app`` as a worker process loads it, on this session's redis-server."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delenv("FAKE_OPENAI_BASE", raising=False)
    worker.forget_apps()
    from tests.apps import redis_app

    yield redis_app.app
    worker.forget_apps()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1 for the session (``tests/s3_server.py``); its endpoint URL."""
    from tests.s3_server import s3_server_endpoint

    with s3_server_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket on the session's S3 server."""
    from tests.s3_server import create_bucket

    return create_bucket(s3_endpoint)
