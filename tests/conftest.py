"""Suite-wide guards: no network beyond 127.0.0.1, litellm offline, model calls blocked."""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import pytest

# litellm must never fetch its price list or phone home from the test suite.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# Real model calls are blocked: the only model server the suite may reach is
# the loopback fake started by a fixture.
os.environ["PIPELINES_BLOCK_REMOTE_MODELS"] = "1"

_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise ConnectionRefusedError(f"test suite blocks network access to {host!r} (only loopback)")
    return _real_connect(self, address)


@pytest.fixture(autouse=True, scope="session")
def _block_network() -> Any:
    socket.socket.connect = _loopback_only  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]


# --- a real redis-server, private to this test session ----------------------
from collections.abc import Iterator  # noqa: E402

from tests.redis_server import RedisServer, find_redis_server  # noqa: E402


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server on a free port. Missing binary: skip loudly, or fail when REQUIRE_REDIS=1."""
    binary = find_redis_server()
    if binary is None:
        if os.environ.get("REQUIRE_REDIS") == "1":
            pytest.fail("REQUIRE_REDIS=1 but redis-server is not installed (apt-get install redis-server)")
        pytest.skip("SKIPPING REDIS TESTS: redis-server not found (apt-get install redis-server)")
    server = RedisServer(binary)
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session server's URL, with its data flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


# --- a loopback OpenAI-compatible server, scripted per test -----------------
from tests.fake_openai import FakeOpenAI  # noqa: E402


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py); ``.url`` ends in ``/v1``."""
    server = FakeOpenAI().start()
    yield server
    server.stop()
