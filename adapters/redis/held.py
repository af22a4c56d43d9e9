"""A connection each thread keeps for the turn's three functions (LOAD, RECORD_STEP, COMMIT).

A command through ``redis.Redis.execute_command`` takes a connection from the pool and gives it back:
with redis-py 8 that is a lock, a ``poll`` of the socket (``can_read``), the pool's observability
counters and a deprecation wrapper, about 20 us of client CPU a command on the bench machine
(bench/README.md), a third of what the round trip itself costs the client. A turn sends three.
:class:`Held` sends them on a connection the thread made once and keeps.

The connection is made like the client's pool makes its connections but is never the pool's (as
:mod:`adapters.redis.pending`'s): a sized or blocking pool is not drained by worker threads that each
keep one, and a pool with client-side caching never reads what waits on it. What the pool's checks
gave is kept:

- A connection the server closed (a restart, an idle timeout) is connected again by the send itself.
- A call whose connection is lost on the way is sent again on a new one as the client's ``retry`` says,
  as ``execute_command`` does (every function is idempotent: tokens and owner checks); past that the
  error goes up as redis-py's.
- A reply is read whole or the connection is dropped: no connection is left holding a reply nobody read.
- A forked child never uses its parent's connection: the process id is checked at every call.
- A thread's connection is closed when the thread ends (its ``threading.local`` is freed), and
  :meth:`Held.close` closes every thread's (``RedisStorage.close``; a later call connects again).

A forking worker's horse (:func:`pool_only_process`) keeps none for its first turn: it usually runs one
turn and exits, and everything else it sends goes through the pool's connection, so a kept one would be
one more to make (a connect and the client's handshake, each a round trip) for the three calls of a
turn. A horse that goes on with its job (``continue_for``) keeps one from its second turn.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis

__all__ = ["Held", "pool_only_process", "put", "usable"]

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis-py packs commands with hiredis when it is installed (it is in the lock): the same bytes
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - then redis-py's own packer, through send_command
    _pack_command = None

_POOL_ONLY_PID = 0  # the process marked by pool_only_process() and not past its first commit; 0: none


def pool_only_process() -> None:
    """Mark this process as one that runs one job (a forking worker's horse): its calls go through the pool
    until its first commit (:meth:`Held.committed`), as everything else the horse sends does.

    A horse usually runs one turn and exits: a kept connection would be one more to make (a connect and the
    client's handshake) for three calls. One that goes on with its job (``continue_for``) keeps one from its
    second turn, where it pays. A child of this process is not marked.
    """
    global _POOL_ONLY_PID
    _POOL_ONLY_PID = os.getpid()


class _Slot:
    """A thread's connection, made like ``pool`` makes its own; closed when the thread's slot is freed."""

    __slots__ = ("__weakref__", "conn", "pid", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.pid = os.getpid()
        self.conn: Any = pool.connection_class(**pool.connection_kwargs)

    def __del__(self) -> None:
        # A forked child's copy is its parent's socket: never closed from the child.
        if self.pid == os.getpid():
            with contextlib.suppress(Exception):  # at interpreter exit redis-py may be gone already
                self.conn.disconnect()


class Held:
    """Per thread, one connection made as a client's pool makes them, kept for calls that would each take one."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()  # every live thread's, for close()
        self._lock = threading.Lock()
        self._lock_pid = os.getpid()

    def _guard(self) -> threading.Lock:
        """The lock over ``_slots``: a forked child makes its own, as the parent's may have been held at the fork
        (by another of its threads) and would stay held in the child for ever."""
        pid = os.getpid()
        if self._lock_pid != pid:
            self._lock, self._lock_pid = threading.Lock(), pid
        return self._lock

    def call(self, client: Any, command: Sequence[Any]) -> Any:
        """Send ``command`` on this thread's connection for ``client`` and read its reply (raw, as FCALL's).

        A lost connection is connected again and the command sent again as the client's ``retry`` says
        (what ``execute_command`` does); the last error goes up as redis-py's.
        """
        conn = self.connection(client)
        if conn is None:  # a forking worker's horse, before its first commit
            return client.execute_command(*command)
        return conn.retry.call_with_retry(lambda: _send(conn, command), lambda _error: conn.disconnect())

    def connection(self, client: Any) -> Any:
        """This thread's connection for ``client`` (made now if it has none); ``None`` in a horse (the pool's then).

        For a caller that sends on it and reads the reply itself before this thread's next :meth:`call`.
        """
        pid = os.getpid()
        if pid == _POOL_ONLY_PID:
            return None
        return self._slot(client.connection_pool, pid).conn

    def keeps(self, client: Any) -> bool:
        """Whether this thread keeps a connection for ``client`` already (none is made by asking)."""
        return self._kept(client.connection_pool, os.getpid()) is not None

    def _kept(self, pool: Any, pid: int) -> _Slot | None:
        """This thread's slot if it holds a connection of ``pool`` made in this process, else ``None``."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        return slot if slot is not None and slot.pool is pool and slot.pid == pid else None

    def _slot(self, pool: Any, pid: int) -> _Slot:
        slot = self._kept(pool, pid)
        if slot is None:
            slot = self._local.slot = _Slot(pool)
            with self._guard():
                self._slots.add(slot)
        return slot

    @staticmethod
    def committed() -> None:
        """A commit went: a horse past it goes on with its job (``continue_for``), and keeps a connection now."""
        global _POOL_ONLY_PID
        if os.getpid() == _POOL_ONLY_PID:
            _POOL_ONLY_PID = 0

    def close(self) -> None:
        """Close every thread's connection (``RedisStorage.close``); each connects again at its thread's next call."""
        with self._guard():
            slots = list(self._slots)
        pid = os.getpid()
        for slot in slots:
            if slot.pid == pid:
                slot.conn.disconnect()


def usable(client: Any) -> bool:
    """Whether ``client``'s calls may go on a kept connection: a pooled ``redis.Redis`` (a ``RedisCluster`` is none).

    A client made with ``single_connection_client=True`` sends everything on its one connection, as asked.
    """
    return isinstance(client, redis.Redis) and getattr(client, "connection", None) is None


def put(conn: Any, command: Sequence[Any], *, check_health: bool = True) -> None:
    """Send ``command`` on ``conn`` without reading its reply, packed as redis-py packs it.

    By hiredis directly when it is there (what ``send_command`` does then, less its per-argument
    conversions, which str, int and bytes need none of: ~5 us a turn's command); a value hiredis does not
    take goes through ``send_command``, which says what is wrong with it (``DataError``).
    ``check_health=False`` for a connection whose earlier reply is still unread: redis-py's health check
    (``health_check_interval``) would send a ``PING`` and read that reply as the ``PING``'s.
    """
    if _pack_command is not None and not (isinstance(command[0], str) and " " in command[0]):  # "SCRIPT LOAD": split
        try:
            packed = _pack_command(tuple(command))
        except TypeError:
            pass
        else:
            conn.send_packed_command([packed], check_health=check_health)
            return
    conn.send_command(*command, check_health=check_health)


def _send(conn: Any, command: Sequence[Any]) -> Any:
    try:
        put(conn, command)
        return conn.read_response()
    except redis.exceptions.ResponseError:
        raise  # an error reply, read whole: the connection is fine
    except BaseException:
        conn.disconnect()  # not sent wholly, or interrupted mid-read: what is left on it cannot be read in order
        raise
