"""The Redis client's edges: its URL checks, redis-py's errors mapped to phaserunner's, driver info.

Private to :mod:`adapters.redis` (and :mod:`adapters.redis.flow`); public
here only :func:`driver_info` and :func:`settle_driver_info`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis

try:  # redis-py >= 7; older versions looked their version up once, at import
    from redis.driver_info import DriverInfo
except ImportError:  # pragma: no cover - depends on the installed redis-py
    DriverInfo = None  # type: ignore[assignment,misc]

from pipelines.engine.errors import ConfigurationError, CorruptRecordError, StorageError, StorageUnavailableError

__all__ = ["driver_info", "settle_driver_info"]

# What a Cluster raises while a master fails over: retried with backoff (redis-py retries without any).
_FAILOVER_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ClusterDownError,
                    redis.exceptions.TryAgainError, redis.exceptions.MovedError, redis.exceptions.SlotNotCoveredError,
                    redis.exceptions.AskError)


@contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Translate redis-py exceptions into phaserunner's at the adapter edge."""
    try:
        yield
    except redis.exceptions.AuthenticationError as exc:
        raise StorageError(f"Redis refused the credentials while {what}: {exc}") from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise StorageUnavailableError(f"Redis is unreachable while {what} (retries exhausted): {exc}") from exc
    except redis.exceptions.ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            # A key of the wrong type was written by hand or by other software.
            raise CorruptRecordError(f"a key of the wrong Redis type while {what}: {exc}") from exc
        raise StorageError(f"Redis failed while {what}: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        raise StorageError(f"Redis failed while {what}: {exc}") from exc
    except redis.exceptions.RedisClusterException as exc:
        # No RedisError (redis-py 8): a Cluster none of whose nodes answers while its slot map is read again
        # (a failover, a restart). Unavailable, so the caller's failover loop retries it to its deadline.
        raise StorageUnavailableError(f"Redis Cluster is unreachable while {what}: {exc}") from exc


def _redact(url: str) -> str:
    """``url`` with everything before its host masked when it holds an ``@`` (a user, a password), parsed or not.

    Cut at the last ``@``, not parsed: a password holding an unescaped ``/`` or ``#``, or a URL missing its
    ``//``, does not parse, and showing it as given printed the password (cron mail, CI logs).
    """
    # A password given as a query argument (redis-py takes ``?password=``; unix:// URLs give it so) too.
    url = _QUERY_SECRET.sub(r"\1***", url)
    if "@" not in url:
        return url
    head, _, host = url.rpartition("@")
    scheme = head.split("://", 1)[0] + "://" if "://" in head else ""
    return f"{scheme}***@{host}"


_QUERY_SECRET = re.compile(r"(?i)([?&](?:password|username)=)[^&#]*")


def _check_url(url: object) -> str:
    """Raise ConfigurationError naming what is wrong with a Redis URL (redis-py would guess instead)."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a Redis URL must be a non-empty string, got {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port  # parses it: non-numeric or out of range raises ValueError
    except ValueError as exc:
        # The parser's words may quote the password (a port "could not be cast ... 's3cr'"): not shown then.
        why = str(exc) if "@" not in url else ("its host and port do not parse (percent-encode a password's "
                                               "'/', '#', '?' and '@')")
        raise ConfigurationError(f"bad Redis URL {_redact(url)!r}: {why}") from None
    shown = _redact(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"bad Redis URL {shown!r}: scheme must be redis://, rediss:// or unix://")
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigurationError(f"bad Redis URL {shown!r}: unix:// needs a socket path")
        return url
    if not parts.hostname:
        raise ConfigurationError(f"bad Redis URL {shown!r}: no host")
    if port == 0:
        raise ConfigurationError(f"bad Redis URL {shown!r}: port 0")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigurationError(f"bad Redis URL {shown!r}: database {db!r} is not a number")
    return url


@functools.cache
def driver_info() -> Any:
    """redis-py's own driver name and version, looked up once per process (``None`` before redis-py 7)."""
    return None if DriverInfo is None else DriverInfo()  # reads the installed package's metadata: once, here


def settle_driver_info(client: Any) -> None:
    """Give each new connection of ``client`` the driver name and version it would otherwise look up.

    redis-py 7+ reads its own version from the installed packages' metadata
    for every connection it makes unless a ``driver_info`` is given: ~1 ms,
    and ~4 ms in a forked RQ work-horse, whose first command always makes a
    new connection (measured with redis-py 8.1). The same values, told once,
    before any fork. A client built with its own ``driver_info``,
    ``lib_name`` or ``lib_version`` keeps what it was given.
    """
    info = driver_info()
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if info is None or not isinstance(kwargs, dict):
        return
    if not any(key in kwargs for key in ("driver_info", "lib_name", "lib_version")):
        kwargs["driver_info"] = info
