"""Following Redis live streams from ``async`` code: one ``XREAD BLOCK`` per event loop, no thread per follower.

:meth:`~adapters.redis.RedisStorage.aread_live` reads with ``redis.asyncio``
clients made from the storage's own connection settings, one set per event
loop (:func:`loop_reads`). A follower that found nothing registers its wait
(live key, cursor) with a :class:`_Group` and awaits a future; each group has
one task that runs ``XREAD BLOCK`` over every key its followers wait on, on
one connection, and resolves the futures of the keys that got an entry. The
followers then read with ``READ_LIVE`` as before: the ``XREAD`` is only the
wait (the script sees a front trimmed past the cursor, and the durable
events a reader behind it lacks).

A key added while an ``XREAD`` is blocked is joined in by ``CLIENT UNBLOCK``
on another connection: the ``XREAD`` returns empty and the next one names
every key. A key whose followers an entry woke stays in the group's
``XREAD``s for ``_RECENT`` seconds after, at the newest id seen there, so a
follower back from its read is already covered however many rounds other
keys ended meanwhile (no ``CLIENT UNBLOCK`` per batch of text), and one that
comes back behind that id is answered at once, with no round.

A group names at most ``_KEYS`` (64) keys: an entry on any key ends its
``XREAD`` and the next one names all its keys again, so a busy stream costs
only the few quiet ones beside it; a thousand followers use 16 connections.
One ``XREAD`` names keys of one slot only on a Redis Cluster, so there each
group is on one slot of one node (a bucketed layout has at most ``buckets``
slots). A connection class with no asyncio twin (Sentinel, a custom class)
has no async client here: those reads run in a thread, as ``read_live`` does.

The reads share a pool of ``_POOL`` connections per node; those of quiet
followers (a wait that ran out) take at most ``_QUIET`` of them, so a
thousand quiet followers whose waits end together never queue ahead of a
busy one.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, NamedTuple, TypeVar

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff

from adapters.live_wakeup import forget_waiter, wait_on
from adapters.redis.archive import entry_key

__all__ = ["LoopReads", "async_connection_args", "loop_reads"]

_TWINS: dict[type, type[aredis.connection.AbstractConnection]] = {
    redis.Connection: aredis.Connection,
    redis.SSLConnection: aredis.SSLConnection,
    redis.UnixDomainSocketConnection: aredis.UnixDomainSocketConnection,
}
# What a sync connection's settings mean the same on its asyncio twin (the rest are sync objects: retry,
# maintenance handlers, ...). decode_responses and protocol are kept so replies have the sync reads' shape.
_SETTINGS = ("host", "port", "path", "db", "username", "password", "credential_provider", "socket_timeout",
             "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options", "client_name",
             "encoding", "encoding_errors", "decode_responses", "protocol", "ssl_keyfile", "ssl_certfile",
             "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data", "ssl_ca_path", "ssl_check_hostname",
             "ssl_min_version", "ssl_ciphers", "ssl_password")
_POOL = 32  # connections a loop's reads of one node share (a wait holds none of them)
_QUIET = 4  # of which quiet followers' reads use at most this many
# Keys one XREAD names at most. Every entry on any of its keys ends the XREAD and the next names them all again,
# so a busy stream beside a thousand quiet ones would re-send a thousand keys per batch of text: with a few
# dozen a group, a batch costs the quiet ones next to it only (one connection per group).
_KEYS = 64
_SLACK = 5.0  # the XREAD connection's socket timeout over its longest block: a wait is never taken for a dead server
# How long a key an entry came on stays named without a follower waiting on it: its followers are reading, and
# come back within milliseconds; a key whose followers left drops out after this.
_RECENT = 2.0

_lock = threading.Lock()  # the registry of loops is shared by every thread's loop

T = TypeVar("T")
_Args = tuple[type[aredis.connection.AbstractConnection], dict[str, Any]]


class _Node(NamedTuple):
    client: aredis.Redis  # pooled: the reads, and CLIENT UNBLOCK
    args: _Args  # how to open the node's XREAD connection
    # How many reads use the pool at once (so how many connections it opens). Not a BlockingConnectionPool:
    # on Python 3.11 a cancellation that lands while it hands over a connection can be lost, and a follower
    # whose client left would read on for good.
    slots: asyncio.Semaphore
    # Reads after a wait that ran out (a quiet follower's periodic look) take these, never the slots above: a
    # thousand quiet followers whose waits end together queue behind each other, not ahead of a busy one.
    quiet_slots: asyncio.Semaphore


def async_connection_args(pool: Any) -> _Args | None:
    """The asyncio connection class and settings matching a sync ``pool``; ``None`` when it has no twin."""
    twin = _TWINS.get(getattr(pool, "connection_class", None))  # type: ignore[arg-type]
    if twin is None:
        return None
    kwargs = getattr(pool, "connection_kwargs", {})
    return twin, {k: kwargs[k] for k in _SETTINGS if k in kwargs}


def loop_reads(owner: Any) -> LoopReads:
    """The running loop's :class:`LoopReads` of ``owner`` (a RedisStorage), made on first use."""
    loop = asyncio.get_running_loop()
    with _lock:
        loops: dict[asyncio.AbstractEventLoop, LoopReads] = owner.__dict__.setdefault("_loop_reads", {})
        reads = loops.get(loop)
        if reads is None:
            reads = loops[loop] = LoopReads(owner.client, owner.cluster, owner.max_block,
                                            on_close=lambda: _forget(loops, loop))
    return reads


def _forget(loops: dict[asyncio.AbstractEventLoop, LoopReads], loop: asyncio.AbstractEventLoop) -> None:
    with _lock:
        loops.pop(loop, None)


class LoopReads:
    """One event loop's async side of a RedisStorage: a client per node, one XREAD group per key group.

    A keeper task owns the connections: it closes them when it is cancelled,
    which ``asyncio.run`` (and uvicorn, and anyio) do to every task left when
    the loop ends.
    """

    def __init__(self, client: Any, cluster: bool, max_block: float, *, on_close: Callable[[], None]) -> None:
        self._client, self._cluster, self._max_block = client, cluster, max_block
        self._nodes: dict[Hashable, _Node] = {}
        self._groups: dict[Hashable, list[_Group]] = {}  # per node (and slot): its XREADs, each on a few keys
        self._on_close = on_close
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def usable(self, key: str) -> bool:
        """Whether ``key``'s node has an asyncio client here (``False``: its connection class has no twin)."""
        return self._node(key) is not None

    async def evalsha(self, key: str, script: Any, *args: str, quiet: bool = False) -> Any:
        """Run ``script`` (a registered sync ``Script``: its ``sha`` and text) on ``key``, its one key, on the node
        holding it, loading it there first if that node lacks it; redis-py's errors as they are.

        ``quiet``: the read of a follower whose wait ran out (it queues with the other quiet ones).
        """
        node = self._node(key)
        assert node is not None, "asked only after usable(key)"
        async with node.quiet_slots if quiet else node.slots:
            try:
                return await _uncancelled(node.client.evalsha(script.sha, 1, key, *args))
            except redis.exceptions.NoScriptError:  # a new or flushed server (on a Cluster: node)
                await _uncancelled(node.client.script_load(script.script))
                return await _uncancelled(node.client.evalsha(script.sha, 1, key, *args))

    async def wait(self, key: str, cursor: str, timeout: float) -> bool:
        """Until ``key`` has an entry after ``cursor`` (``True``) or ``timeout`` seconds passed; holds no thread."""
        node = self._node(key)
        if node is None:
            return False
        name = (node.args[1].get("host"), node.args[1].get("port"), self._client.keyslot(key)) if self._cluster \
            else "redis"
        groups = self._groups.setdefault(name, [])
        group = next((g for g in groups if g.holds(key)), None) or next((g for g in groups if g.size() < _KEYS), None)
        if group is None:
            group = _Group(lambda: _reader(node.args, self._max_block), node.client, self._max_block)
            groups.append(group)
        woken = group.add(key, cursor)
        try:
            await wait_on(woken, timeout)
        finally:
            group.discard(key, woken)
        return not woken.cancelled()

    def _node(self, key: str) -> _Node | None:
        if self._cluster:
            found = self._client.get_node_from_key(key)  # the slot map as the sync client last read it
            address: Hashable = (found.host, found.port)
            pool = None if found.redis_connection is None else found.redis_connection.connection_pool
        else:
            address, pool = "redis", self._client.connection_pool
        node = self._nodes.get(address)
        if node is None:
            args = None if pool is None else async_connection_args(pool)
            if args is None:
                return None
            node = self._nodes[address] = _Node(aredis.Redis(connection_pool=aredis.ConnectionPool(
                connection_class=args[0], retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), 3),
                **args[1])), args, asyncio.Semaphore(_POOL - _QUIET), asyncio.Semaphore(_QUIET))
        return node

    async def _keep(self) -> None:
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled: the loop is ending
        finally:
            self._on_close()
            for groups in self._groups.values():
                for group in groups:
                    await group.aclose()
            for node in self._nodes.values():
                with contextlib.suppress(Exception):  # a connection that is already gone
                    await node.client.aclose(close_connection_pool=True)


def _reader(args: _Args, max_block: float) -> aredis.Redis:
    """The one connection a group's XREAD runs on; no retries (the group itself reconnects and re-reads)."""
    cls, kwargs = args
    kwargs = {**kwargs, "socket_timeout": max_block + _SLACK}
    return aredis.Redis(connection_pool=aredis.ConnectionPool(connection_class=cls, max_connections=1,
                                                              retry=Retry(NoBackoff(), 0), **kwargs),
                        single_connection_client=True)


class _Group:
    """One ``XREAD BLOCK`` at a time over every key its followers wait on (see the module docstring)."""

    def __init__(self, connect: Callable[[], aredis.Redis], bell: aredis.Redis, max_block: float) -> None:
        self._connect, self._bell = connect, bell
        self._block_ms = max(1, int(max_block * 1000))
        self._waiting: dict[str, dict[asyncio.Future[None], tuple[int, int]]] = {}  # key -> follower -> cursor
        # Keys an entry was seen on, at the newest id seen, until when they stay named without a follower waiting.
        self._recent: dict[str, tuple[tuple[int, int], float]] = {}
        self._answered: dict[str, tuple[int, int]] = {}  # the cursor add() last answered at once, per key
        self._reading: dict[str, tuple[int, int]] | None = None  # what the XREAD in flight names
        self._round = 0
        self._rung = -1  # the round a CLIENT UNBLOCK was sent for
        self._reader: aredis.Redis | None = None
        self._reader_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._ringing: set[asyncio.Task[None]] = set()

    def add(self, key: str, cursor: str) -> asyncio.Future[None]:
        """A future resolved once ``key`` has an entry after ``cursor``."""
        at = entry_key(cursor)
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        seen = self._recent.get(key)
        if seen is not None and seen[0] > at and self._answered.get(key) != at:
            # An entry after the cursor came already (the follower read before it): no round needed. Once per
            # cursor: a follower whose read found nothing after all (its stream deleted) waits for real.
            self._answered[key] = at
            woken.set_result(None)
            return woken
        self._waiting.setdefault(key, {})[woken] = at
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        elif self._uncovered(key, at) and self._rung != self._round:
            # The XREAD in flight would not return for this key: interrupt it (once per round).
            self._rung = self._round
            ring = loop.create_task(self._ring(self._round))
            self._ringing.add(ring)
            ring.add_done_callback(self._ringing.discard)
        return woken

    def _uncovered(self, key: str, at: tuple[int, int]) -> bool:
        """Whether an XREAD is in flight that would not return once ``key`` has an entry after ``at``.

        With none in flight, the next one names every waiting key.
        """
        if self._reading is None:
            return False
        since = self._reading.get(key)
        return since is None or since > at

    def holds(self, key: str) -> bool:
        """Whether ``key`` is named here: a follower waits on it, the XREAD in flight names it, or it was just
        woken here. A follower back from its read (or from a wait that ran out) lands where it is covered."""
        return key in self._waiting or key in self._recent or (self._reading is not None and key in self._reading)

    def size(self) -> int:
        """How many keys this group names now."""
        return len(self._waiting.keys() | self._recent.keys() | (self._reading or {}).keys())

    def discard(self, key: str, woken: asyncio.Future[None]) -> None:
        """Forget a follower that stopped waiting (the XREAD in flight may still name its key: harmless)."""
        forget_waiter(self._waiting, key, woken)

    async def _run(self) -> None:
        pause = 0.0
        while self._prune():
            try:
                reply = await self._read()
            except (redis.RedisError, OSError):
                # A dropped connection, a failover, a key of another type: each follower finds out through its
                # own read, which runs now; the next XREAD, on a new connection, waits a little first.
                await self._drop_reader()
                self._wake_all()
                pause = min(max(pause * 2, 0.05), 1.0)
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            self._wake(reply)

    def _prune(self) -> bool:
        """Forget the keys named only for followers that did not come back in time; whether any key is left."""
        now = asyncio.get_running_loop().time()
        self._recent = {k: seen for k, seen in self._recent.items() if seen[1] > now or k in self._waiting}
        self._answered = {k: at for k, at in self._answered.items() if k in self._recent}
        return bool(self._waiting or self._recent)

    async def _drop_reader(self) -> None:
        reader, self._reader, self._reader_id = self._reader, None, None
        if reader is not None:
            with contextlib.suppress(Exception):  # it failed already: closing it only frees the socket
                await reader.aclose(close_connection_pool=True)

    async def _read(self) -> Any:
        if self._reader is None:
            self._reader, self._reader_id = self._connect(), None
        if self._reader_id is None:
            self._reader_id = int(await _uncancelled(self._reader.client_id()))
        cursors = {k: at for k, (at, _) in self._recent.items()}
        for key, waiting in self._waiting.items():
            cursors[key] = min(cursors.get(key, (2**64, 0)), *waiting.values())
        self._reading = cursors
        self._round += 1
        try:
            return await _uncancelled(self._reader.xread({k: f"{ms}-{seq}" for k, (ms, seq) in cursors.items()},
                                                         count=1, block=self._block_ms))
        finally:
            self._reading = None

    def _wake(self, reply: Any) -> None:
        until = asyncio.get_running_loop().time() + _RECENT
        for raw_key, entries in (reply.items() if isinstance(reply, dict) else reply or ()):
            if not entries:
                continue
            key, newest = _text(raw_key), entry_key(_text(entries[-1][0]))
            waiting = self._waiting.get(key, {})
            woke = [woken for woken, at in waiting.items() if at < newest]
            for woken in woke:
                del waiting[woken]
                if not woken.done():
                    woken.set_result(None)
            # Named at the newest id from now on: the next XREAD does not return this entry again, and a follower
            # back with a cursor before it is answered by add() at once. Only a follower woken keeps the key
            # named longer: a busy stream whose followers left drops out (each of its entries ends a round).
            seen = self._recent.get(key)
            if seen is not None:
                self._recent[key] = (max(newest, seen[0]), until if woke else seen[1])
            elif woke:
                self._recent[key] = (newest, until)
            if not waiting:
                self._waiting.pop(key, None)

    def _wake_all(self) -> None:
        waiting, self._waiting, self._recent, self._answered = self._waiting, {}, {}, {}
        for followers in waiting.values():
            for woken in followers:
                if not woken.done():
                    woken.set_result(None)

    async def _ring(self, round_: int) -> None:
        """``CLIENT UNBLOCK`` the XREAD of ``round_``: its reply is empty and the next XREAD names every key."""
        pause = 0.001
        with contextlib.suppress(redis.RedisError, OSError):  # else the follower's own timeout ends its wait
            while self._round == round_ and self._reading is not None and self._reader_id is not None:
                if await _uncancelled(self._bell.client_unblock(self._reader_id)):
                    return
                # Not blocked (yet): the XREAD was sent but has not reached the server. Try again shortly.
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)

    async def aclose(self) -> None:
        """Stop the XREAD task and close its connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for ring in list(self._ringing):
            ring.cancel()
        await self._drop_reader()
        self._wake_all()


async def _uncancelled(call: Awaitable[T]) -> T:
    """``await call``, raising a cancellation of this task that came in meanwhile.

    redis-py's asyncio client can return a reply when the task awaiting it was
    cancelled (seen with Python 3.11 under load: about one cancelled follower
    in a hundred); the cancellation is then lost and a follower whose client
    left would follow on for good (and a loop that ends would wait for it).
    A normal return while the task's cancel count went up is such a case.
    """
    task = asyncio.current_task()
    before = 0 if task is None else task.cancelling()
    result = await call
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return result


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
