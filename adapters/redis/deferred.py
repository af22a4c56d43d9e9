"""A script sent now, its reply read with the thread's next one (:class:`~adapters.base.StepBeforeCommit`).

The agent turn journals its one tool call's result, or a final answer (no tool calls), right before its
commit. Waiting for that write's reply cost a round trip a turn (about a tenth of a W1 turn on Redis,
bench/README.md), though nothing but the commit follows it. :class:`Deferred` sends the script on the
thread's kept connection (:mod:`adapters.redis.held`; in a forking worker's horse, on one it takes out of
the pool until then) and reads the reply when the thread runs its next script
(:meth:`RedisConnection.run <adapters.redis.connection.RedisConnection.run>` collects it first), by then
usually in the socket's buffer already.

Why this keeps I5 (a finished tool does not run again): the write has left the process when
:meth:`Deferred.send` returns, as a synchronous write has when it starts waiting; a process killed
after that point still delivers it (the kernel sends what the socket holds). A connection lost on the
way has the script run again, synchronously: the journal write is idempotent (same key, value and
version). So does a reply that says the server had not loaded the script or its function (``FUNCTION
FLUSH``, a restarted server; the turn's model answer, journaled just before by the same function, loads
it otherwise): the write did not run, and runs with the thread's next script. A worker killed in between
runs the call again, as one killed inside the call would: the one case where this write keeps less than a
synchronous one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import redis

from adapters.redis.held import Held
from adapters.redis.library import Hot

__all__ = ["Deferred"]

# A connection lost on the way: whether the script ran is unknown, and running it again is safe.
_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class _Pending(NamedTuple):
    conn: Any  # a redis-py Connection: taken out of the client's pool, or the thread's kept one
    give_back: Callable[[Any], None]  # the pool's release, or nothing for the kept one
    client: Any  # the client it is of
    pid: int  # the process that sent it: a forked child does not read its parent's socket
    script: Hot
    keys: Sequence[str]
    args: Sequence[Any]
    what: str
    on_reply: Callable[[Any], None]


class Deferred:
    """At most one script per thread whose reply waits to be read (see the module)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def send(self, client: Any, script: Hot, keys: Sequence[str], args: Sequence[Any], what: str,
             on_reply: Callable[[Any], None], held: Held | None = None) -> bool:
        """Send ``script`` on a connection of ``client`` and keep it; ``False`` if it could not be sent.

        The connection is the thread's kept one (``held``: :mod:`adapters.redis.held`, whose next call
        on this thread comes after the reply is read), else one taken out of the client's pool.
        ``on_reply`` gets the reply when it is read. The caller runs the script the usual way on ``False``.
        """
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            return False
        try:
            # FCALL, or EVALSHA where functions are off; checked before a connection is held (it may take one).
            command = script.command(keys, args, client)
        except (redis.exceptions.RedisError, OSError):
            return False  # the server not ready, or gone: the usual way says so, as its error
        conn = None if held is None else held.connection(client)
        give_back: Callable[[Any], None] = _kept if conn is not None else pool.release
        if conn is None:
            try:
                try:
                    conn = pool.get_connection()
                except TypeError:  # redis-py before 5.3 names the command a connection is taken for
                    conn = pool.get_connection("EVALSHA")
            except _LOST:
                return False  # no connection (the server is down?): the usual way says so, as its error
        try:
            conn.send_command(*command)
        except BaseException as exc:
            conn.disconnect()  # not sent, or not wholly
            give_back(conn)
            if isinstance(exc, _LOST):
                return False  # the caller sends it again, synchronously (the write is idempotent)
            raise
        self._local.pending = _Pending(conn, give_back, client, os.getpid(), script, keys, args, what, on_reply)
        return True

    def waiting(self) -> bool:
        """Whether this thread sent a script whose reply is not read yet."""
        return getattr(self._local, "pending", None) is not None

    def collect(self, run: Callable[[Any, Sequence[str], Sequence[Any], str], Any]) -> None:
        """Read this thread's pending reply and hand it on; ``run`` runs the script again when it must be.

        Errors of the script itself are raised here, as a synchronous call raises them.
        """
        pending: _Pending | None = getattr(self._local, "pending", None)
        self._local.pending = None
        if pending is None or pending.pid != os.getpid():
            return  # sent by the process this one was forked from: its own to read
        conn, give_back = pending.conn, pending.give_back
        try:
            reply = conn.read_response()
        except redis.exceptions.NoScriptError:  # not run: the server lost its scripts meanwhile
            give_back(conn)
            reply = run(pending.script, pending.keys, pending.args, pending.what)
        except _LOST:
            conn.disconnect()  # run or not: the reply is lost with the connection
            give_back(conn)
            reply = run(pending.script, pending.keys, pending.args, pending.what)
        except redis.exceptions.ResponseError as exc:
            give_back(conn)  # an error reply, read whole: the connection is fine
            if not pending.script.not_run(exc, pending.client):
                raise
            reply = run(pending.script, pending.keys, pending.args, pending.what)  # the function was missing
        except BaseException:
            conn.disconnect()  # interrupted mid-read: what is left on it cannot be read in order
            give_back(conn)
            raise
        else:
            give_back(conn)
        pending.on_reply(reply)


def _kept(conn: Any) -> None:
    """The thread's kept connection is not the pool's to take back: it stays with the thread."""
