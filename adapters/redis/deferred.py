"""A script sent now, its reply read with the thread's next one (:class:`~adapters.base.StepBeforeCommit`).

The agent turn journals its one tool call's result, or a final answer (no tool calls), right before its
commit. Waiting for that write's reply cost a round trip a turn (about a tenth of a W1 turn on Redis,
bench/README.md), though nothing but the commit follows it. :class:`Deferred` sends the script on the
thread's kept connection (:mod:`adapters.redis.held`; in a forking worker's horse, on one it takes out of
the pool until then) and reads the reply when the thread runs its next script
(:meth:`RedisConnection.run <adapters.redis.connection.RedisConnection.run>` collects it first). On the
kept connection the next script, the commit, is sent right behind it before either reply is read
(:meth:`Deferred.then`): the server runs them in the order they went, as before, and the commit does
not wait for the write's reply first.

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

from adapters.redis.held import Held, put
from adapters.redis.library import Hot
from adapters.redis.values import _status

__all__ = ["Deferred"]

# A connection lost on the way: whether the script ran is unknown, and running it again is safe.
_LOST = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

Run = Callable[[Any, Sequence[str], Sequence[Any], str], Any]  # RedisConnection.run: a script, waited for


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
    sock: Any  # the socket it went on: one closed meanwhile (RedisStorage.close() from another thread) lost its reply


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
            self.write(conn, command)
        except BaseException as exc:
            conn.disconnect()  # not sent, or not wholly
            give_back(conn)
            if isinstance(exc, _LOST):
                return False  # the caller sends it again, synchronously (the write is idempotent)
            raise
        self._local.pending = _Pending(conn, give_back, client, os.getpid(), script, keys, args, what, on_reply,
                                       _socket(conn))
        return True

    @staticmethod
    def write(conn: Any, command: Sequence[Any], *, check_health: bool = True) -> None:
        """Put ``command`` on ``conn`` without reading its reply (the one place this module sends: tests and
        the benches watch it). ``check_health=False`` behind an unread reply (see :func:`held.put`)."""
        put(conn, command, check_health=check_health)

    def waiting(self) -> bool:
        """Whether this thread sent a script whose reply is not read yet."""
        return getattr(self._local, "pending", None) is not None

    def collect(self, run: Run) -> None:
        """Read this thread's pending reply and hand it on; ``run`` runs the script again when it must be.

        Errors of the script itself are raised here, as a synchronous call raises them.
        """
        pending: _Pending | None = getattr(self._local, "pending", None)
        self._local.pending = None
        if pending is None or pending.pid != os.getpid():
            return  # sent by the process this one was forked from: its own to read
        try:
            got = _read(pending.conn) if _socket(pending.conn) is pending.sock else _closed(pending.conn)
        finally:
            pending.give_back(pending.conn)
        _settle(pending, got, run)

    def then(self, script: Hot, keys: Sequence[str], args: Sequence[Any], client: Any, what: str,
             run: Run) -> tuple[bool, Any]:
        """Send ``script`` right behind this thread's pending write, on the same kept connection, then read both.

        The write's reply is not waited for before the next call goes (a round trip off the turn's path):
        the server runs the two in the order they were sent, so the write comes first as before, and both
        replies are read before anything else is sent on the connection. ``(True, reply)`` with the next
        call's reply; ``(False, None)`` when nothing waits on a kept connection, or ``script`` could not be
        sent: the caller then collects and runs it the usual way.

        Its reply decides: a call that ran (any reply but an error) returns it, whatever became of the write
        before it (the call is the commit, which holds what the write journaled). A call that did not run (the
        function or script missing) is run again once the write is settled as :meth:`collect` settles it; any
        other error is raised, as a synchronous call raises it. A connection lost before the write's reply was
        read takes both replies with it: both run again, in order, and a write refused then because the call
        behind it had run (it answers ``applied``) is not taken as refused (:func:`_after_loss`). The call goes
        without redis-py's health check (whose ``PING`` would read the write's reply), and not at all on a
        connection closed since the write went (``RedisStorage.close()`` from another thread): its reply went
        with it, and :meth:`collect` runs the write again.
        """
        pending: _Pending | None = getattr(self._local, "pending", None)
        if pending is None or pending.give_back is not _kept or pending.pid != os.getpid():
            return False, None
        if _socket(pending.conn) is not pending.sock:
            return False, None  # closed meanwhile: the write's reply went with it (collect runs it again)
        try:
            command = script.command(keys, args, client)  # FCALL, or EVALSHA where functions are off
        except (redis.exceptions.RedisError, OSError):
            return False, None  # the server not ready, or gone: the usual way says so, as its error
        conn = pending.conn
        try:
            self.write(conn, command, check_health=False)  # a health check's PING would read the write's reply
        except BaseException as exc:
            conn.disconnect()  # not sent wholly; the write's reply goes with it (collect runs the write again)
            if isinstance(exc, _LOST):
                return False, None
            raise
        self._local.pending = None
        first = _read(conn)
        if isinstance(first.error, _LOST):  # both replies went with the connection
            return True, _after_loss(pending, script, keys, args, what, run)
        second = _read(conn)
        if second.error is None:
            if first.error is None:
                pending.on_reply(first.value)
            return True, second.value
        _settle(pending, first, run)
        if not _did_not_run(script, second.error, client):
            raise second.error
        return True, run(script, keys, args, what)


class _Read(NamedTuple):
    """A reply read off a connection: its value, or the error it was (an error reply, or the connection lost)."""

    value: Any = None
    error: BaseException | None = None


def _read(conn: Any) -> _Read:
    try:
        return _Read(conn.read_response())
    except redis.exceptions.ResponseError as exc:
        return _Read(error=exc)  # an error reply, read whole: the connection is fine
    except _LOST as exc:
        conn.disconnect()  # run or not: the reply is lost with the connection
        return _Read(error=exc)
    except BaseException:
        conn.disconnect()  # interrupted mid-read: what is left on it cannot be read in order
        raise


def _did_not_run(script: Hot, error: BaseException, client: Any) -> bool:
    """Whether a call that failed with ``error`` did not run, so that sending it again is what to do.

    The connection lost (run or not: every script here is idempotent), the server without the script
    (``NOSCRIPT``) or the function (which :meth:`Hot.not_run` loads, or turns functions off).
    """
    return isinstance(error, (redis.exceptions.NoScriptError, *_LOST)) or script.not_run(error, client)


def _after_loss(pending: _Pending, script: Hot, keys: Sequence[str], args: Sequence[Any], what: str, run: Run) -> Any:
    """The call's reply when the connection went before the write's reply was read: whether either ran is unknown.

    Both run again, in the order they went (the call may refer to what the write journals). A write that ran
    with the call behind it is refused when run again (the call moved the job's version on), and the call
    answers ``applied``: the write is not taken as refused then. Else its reply is handed on as
    :meth:`Deferred.collect` hands it.
    """
    again = run(pending.script, pending.keys, pending.args, pending.what)
    reply = run(script, keys, args, what)
    if not (_status(again).startswith("stale:") and _status(reply).startswith("applied")):
        pending.on_reply(again)
    return reply


def _socket(conn: Any) -> Any:
    return getattr(conn, "_sock", None)


def _closed(conn: Any) -> _Read:
    conn.disconnect()  # whatever it holds now is not the write's reply
    return _Read(error=redis.exceptions.ConnectionError("the connection the write went on was closed before its "
                                                         "reply was read"))


def _settle(pending: _Pending, got: _Read, run: Run) -> None:
    """Hand the write's reply on; a write that did not run is run again first, another error raised."""
    if got.error is not None:
        if not _did_not_run(pending.script, got.error, pending.client):
            raise got.error
        got = _Read(run(pending.script, pending.keys, pending.args, pending.what))
    pending.on_reply(got.value)


def _kept(conn: Any) -> None:
    """The thread's kept connection is not the pool's to take back: it stays with the thread."""
