"""Redis commands sent now and answered later, so their round trip overlaps what the caller does meanwhile.

redis-py's sync client waits for every reply. The runner asks the queue
whether other work waits before it runs a phase under ``continue_for``, and
needs the answer only when it commits that phase: sending the ``LLEN`` commands
first and reading their replies at the commit takes that round trip off the
turn's path (figure 12 of ``make bench`` times that span).

The connection is taken out of the client's pool between the two halves, so
no other command is written on it and no other caller reads its replies. A
connection whose replies were not all read (an error, an interrupt) is
disconnected before it goes back: it could not be trusted to be in step. A
pool with a small budget is never borrowed from (:func:`can_lend`): the
caller asks and waits instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

__all__ = ["LEND_MIN_CONNECTIONS", "PendingReplies", "can_lend"]

LEND_MIN_CONNECTIONS = 16
"""A pool capped below this many connections is a budget someone sized: nothing is held out of it for a phase."""


def can_lend(client: redis.Redis) -> bool:
    """Whether a connection may be held out of ``client``'s pool while a phase runs.

    Not from a ``BlockingConnectionPool``, nor from a pool capped below
    :data:`LEND_MIN_CONNECTIONS`: the phase's own writes need connections from
    the same pool, and one held by a question would make them wait (a
    blocking pool) or fail with "Too many connections" (a plain one).
    redis-py's own pool allows 100 unless told otherwise.
    """
    pool = client.connection_pool
    if isinstance(pool, redis.BlockingConnectionPool):
        return False
    limit = getattr(pool, "max_connections", None)
    return isinstance(limit, int) and limit >= LEND_MIN_CONNECTIONS


class PendingReplies:
    """``commands`` written to Redis at construction; :meth:`replies` reads their replies (once).

    ``client``: a ``redis.Redis`` (its connection pool is used). A failure to
    send is kept and raised by :meth:`replies`, so the caller handles every
    Redis error in one place. Call :meth:`replies` in every case: until then
    the request holds one of the pool's connections.
    """

    def __init__(self, client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> None:
        self._pool = client.connection_pool
        self._count = len(commands)
        self._conn: Any = None
        self._replies: list[Any] | None = None
        self._error: redis.RedisError | None = None
        try:
            conn: Any = self._pool.get_connection()
        except redis.RedisError as exc:
            self._error = exc
            return
        try:
            conn.send_packed_command(conn.pack_commands(commands))
        except BaseException as exc:
            self._drop(conn)
            if not isinstance(exc, redis.RedisError):
                raise
            self._error = exc
            return
        self._conn = conn

    def replies(self) -> list[Any]:
        """The replies, in the order of the commands; the Redis error that stopped them, raised."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                out = [conn.read_response() for _ in range(self._count)]
            except BaseException as exc:
                self._drop(conn)
                if not isinstance(exc, redis.RedisError):
                    raise
                self._error = exc
            else:
                self._pool.release(conn)
                self._replies = out
        if self._error is not None:
            raise self._error
        assert self._replies is not None
        return self._replies

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self._pool.release(conn)
