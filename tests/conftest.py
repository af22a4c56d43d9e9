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
# A missing redis-server fails the Redis tests with the install command, unless REQUIRE_REDIS=0 asks to skip
# them; then the run's summary says how many were skipped, so a green run cannot hide them.
from collections.abc import Callable, Iterator  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from tests.redis_server import (  # noqa: E402
    RedisServer,
    find_redis_cli,
    find_redis_server,
    missing_redis_message,
    redis_required,
)

if TYPE_CHECKING:
    from tests.redis_cluster import ClusterServers

REDIS_SKIP_REASON = "REQUIRE_REDIS=0 and redis-server is not installed"
# The cluster fixtures also need redis-cli (redis-cli --cluster create): the same rule, and the same count.
REDIS_CLI_SKIP_REASON = "REQUIRE_REDIS=0 and redis-cli is not installed"
_FINDERS: dict[str, tuple[Callable[[], str | None], str]] = {
    "redis-server": (find_redis_server, REDIS_SKIP_REASON),
    "redis-cli": (find_redis_cli, REDIS_CLI_SKIP_REASON),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In a parallel run (pytest-xdist, `make test`), the scenarios with worker processes go first: handed out
    # first, they run beside the quick tests instead of making up the run's tail. Every xdist worker sorts the
    # same collection the same way, as xdist requires; a run in one process keeps the files' order.
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("system") is None)


def pytest_configure(config: pytest.Config) -> None:
    try:
        redis_required()  # a bad REQUIRE_REDIS value stops the run before any test
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


def _redis_binary(session: pytest.Session, name: str = "redis-server") -> str:
    """The ``name`` binary; missing: skip (REQUIRE_REDIS=0) or fail and stop the run with the command."""
    find, skip_reason = _FINDERS[name]
    binary = find()
    if binary is not None:
        return binary
    if not redis_required():
        pytest.skip(skip_reason)
    # Stop after this test: every other Redis test would fail the same way and bury the message.
    session.shouldfail = missing_redis_message(name)
    pytest.fail(missing_redis_message(name), pytrace=False)


@pytest.hookimpl(tryfirst=True)  # before the fixtures of the test are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Tests marked `redis` may start their own servers (outage tests, chaos): the same rule applies to them.
    if item.get_closest_marker("redis") is not None:
        _redis_binary(item.session)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down (they stop their own servers)
def pytest_sessionfinish(session: pytest.Session) -> None:
    # Still before the summary is printed: a process a test left running (a worker retrying a redis-server that
    # is gone) must not write after it. Killed, and named, so the leak is still seen.
    from tests.leftovers import end_leftovers

    left = end_leftovers()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if left and reporter is not None:
        reporter.write("\n")  # after the progress dots
        reporter.write_line(f"killed {len(left)} process(es) tests left running: {'; '.join(left)}", yellow=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple)
               and any(reason in str(r.longrepr[2]) for reason in (REDIS_SKIP_REASON, REDIS_CLI_SKIP_REASON))]
    if skipped:
        terminalreporter.write_sep("=", f"SKIPPED {len(skipped)} Redis tests (REQUIRE_REDIS=0)", yellow=True, bold=True)


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A redis-server on a free port. Missing binary: fail with the install command, or skip if REQUIRE_REDIS=0."""
    server = RedisServer(_redis_binary(request.session))
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


# --- a real Redis Cluster: 3 masters with a replica each (tests/redis_cluster.py) ----------------------------


def _start_cluster(session: pytest.Session) -> ClusterServers:
    from tests.redis_cluster import ClusterServers  # imported here: only the cluster tests pay for it

    cluster = ClusterServers(_redis_binary(session), _redis_binary(session, "redis-cli"))
    cluster.start()
    return cluster


@pytest.fixture(scope="session")
def redis_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterServers]:
    """A Redis Cluster shared by the session. Never stop its nodes: destructive tests take ``fresh_redis_cluster``.

    Missing redis-server or redis-cli: fail with the install command, or skip if REQUIRE_REDIS=0.
    """
    cluster = _start_cluster(request.session)
    yield cluster
    cluster.stop_all()


@pytest.fixture
def redis_cluster_url(redis_cluster: ClusterServers) -> str:
    """A URL of the session cluster for ``redis.RedisCluster.from_url``, with every master flushed before each test."""
    redis_cluster.flushall()
    return redis_cluster.url


@pytest.fixture
def fresh_redis_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterServers]:
    """A Redis Cluster of this test's own (2-3 s to start), for tests that kill nodes; stopped afterwards."""
    cluster = _start_cluster(request.session)
    yield cluster
    cluster.stop_all()


# --- a loopback OpenAI-compatible server, scripted per test -----------------
from tests.fake_openai import FakeOpenAI  # noqa: E402


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A scripted OpenAI-compatible server on 127.0.0.1 (tests/fake_openai.py); ``.url`` ends in ``/v1``."""
    server = FakeOpenAI().start()
    yield server
    server.stop()
