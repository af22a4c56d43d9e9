"""Redis commands sent now and answered later, so their round trip overlaps what the caller does meanwhile.

redis-py's sync client waits for every reply. The runner asks the queue
whether other work waits before it runs a phase under ``continue_for``, and
needs the answer only when it commits that phase: sending the ``LLEN`` commands
first and reading their replies at the commit takes that round trip off the
turn's path (figure 12 of ``make bench`` times that span).

The question goes on a connection of its own, one per thread and process,
made like the client's pool makes its connections but never lent by it: a
connection borrowed from the pool for the length of a phase would be one the
phase's own writes could not have (a sized or blocking pool runs out), and a
pool with client-side caching may read whatever waits on a connection it once
used. A connection whose replies were not all read (an error, an interrupt) is
disconnected, so it never answers a later question with an earlier reply; a
question asked in a parent process is never read in a child that a phase
forked, since both hold the socket.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis

__all__ = ["PendingReplies", "SideConnections", "one_question_process"]

_ONE_QUESTION_PID = 0  # the process (pid) marked by one_question_process() and not yet asked; 0: none


def one_question_process() -> None:
    """Mark this process as one that likely asks once (a forking worker's horse): its first question makes no
    side connection.

    A side connection saves a round trip on every question of a process that asks many. A horse
    usually runs one turn, asks once and exits: making the connection (a TCP connect and the client's
    handshake, each a round trip) costs more than the one it saves, so :meth:`SideConnections.ask`
    declines that first question and it is asked on the client's own connection. A horse that asks
    again (``continue_for`` kept its job for more turns) gets its side connection then. A child of
    this process is not marked.
    """
    global _ONE_QUESTION_PID
    _ONE_QUESTION_PID = os.getpid()


class SideConnections:
    """A client's connections kept beside its pool, one per thread and process, each for one question at a time."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._local = threading.local()

    def ask(self, commands: Sequence[tuple[Any, ...]]) -> PendingReplies | None:
        """``commands`` sent now on this thread's connection; ``None`` when it waits on another question already.

        ``None`` too for the first question of a process marked by :func:`one_question_process`: the caller
        asks on its own connection.
        """
        global _ONE_QUESTION_PID
        local, pid = self._local, os.getpid()
        if pid == _ONE_QUESTION_PID:
            _ONE_QUESTION_PID = 0
            return None
        if getattr(local, "pid", None) != pid:
            # New in this thread, or a connection made by the process this one was forked from: its socket is
            # the parent's too, so it is left alone (redis-py closes it without a shutdown in a child).
            local.pid, local.conn, local.busy = pid, self._pool.connection_class(**self._pool.connection_kwargs), False
        if local.busy:
            return None
        local.busy = True
        return PendingReplies(local.conn, commands, done=lambda: setattr(local, "busy", False))


class PendingReplies:
    """``commands`` written to Redis at construction on ``conn``; :meth:`replies` reads their replies (once).

    A failure to send is kept and raised by :meth:`replies`, so the caller
    handles every Redis error in one place. ``done`` runs once the connection
    is free again (its replies read, or it was disconnected).
    """

    def __init__(self, conn: Any, commands: Sequence[tuple[Any, ...]], *,
                 done: Callable[[], None] | None = None) -> None:
        self._conn: Any = None
        self._count = len(commands)
        self._pid = os.getpid()
        self._done = done
        self._replies: list[Any] | None = None
        self._error: redis.RedisError | None = None
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
        if conn is not None and os.getpid() != self._pid:
            # A child of the process that asked: the reply belongs to the parent, which may read it too.
            self._error = redis.ConnectionError("the question was asked in another process")
        elif conn is not None:
            try:
                out = [conn.read_response() for _ in range(self._count)]
            except BaseException as exc:
                self._drop(conn)
                if not isinstance(exc, redis.RedisError):
                    raise
                self._error = exc
            else:
                self._replies = out
                self._free()
        if self._error is not None:
            raise self._error
        assert self._replies is not None
        return self._replies

    def _drop(self, conn: Any) -> None:
        conn.disconnect()  # the next question connects again (send_packed_command does)
        self._free()

    def _free(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()
