"""Reading a job's live stream on Redis: the run in flight, and what the stream no longer holds.

The live stream (``<prefix>:{<job>}:live``) mirrors every durable event under
the durable event's own id, with the worker's ephemeral parts
(``attempt_started``, ``text_delta``) between them. It keeps the run in
flight and the one before, not the job's whole life: the commit that starts a
run (a conversation continued, a retry) trims the parts before the previous
run's start (``COMMIT`` in :mod:`adapters.redis.scripts`), so a conversation
holds two runs of parts however many it has had, and a finished job's stream
expires ``live_ttl`` after it finished. A run's every part stays because a
client resuming the run's message from a cursor (:mod:`pipelines.web.sse`) is
rebuilt from all of them, and the run before for a client still resuming it
when the next starts (the stream's ``MAXLEN`` of ~10,000 entries bounds both).

A reader whose cursor is older than the stream's first entry gets the durable
events it would have missed (from the event stream or its archive, see
:meth:`~adapters.redis.RedisStorage.events`), then the live parts: every
committed event exactly once, in id order, from any cursor. The text deltas
of older runs are gone; their transcript messages are the truth, and each
turn's ``turn_committed`` names them.

``aread_live`` reads the same way from ``async`` code; its wait is one
``XREAD BLOCK`` per event loop shared by every follower in it (see
:mod:`adapters.redis.live_async`), so a waiting follower holds no thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import NoScriptError, RedisError

from adapters.redis.archive import entry_key
from adapters.redis.client import _mapped
from adapters.redis.connection import RedisConnection
from adapters.redis.events import EventReads, event
from adapters.redis.live_async import LoopReads, loop_reads
from adapters.redis.values import _bounded
from pipelines.engine.events import LAST_CURSOR, check_cursor
from pipelines.engine.models import Event

__all__ = ["LiveReads", "behind_first"]


def behind_first(durable: list[Event], live: list[Event], limit: int) -> list[Event]:
    """The durable events older than the first live part, then the live parts; at most ``limit``.

    Events are in both streams under one id, so the durable ones from the live
    part on are dropped, not repeated.
    """
    if live:
        first = entry_key(live[0].id)
        durable = [e for e in durable if entry_key(e.id) < first]
    return [*durable, *live][:max(0, limit)]


class LiveReads:
    """Following a job's live stream (a part of :class:`~adapters.redis.RedisStorage`).

    ``max_block``: the longest single ``XREAD BLOCK``, below the client's socket timeout.
    """

    def __init__(self, conn: RedisConnection, history: EventReads, *, max_block: float = 5.0) -> None:
        self.conn = conn
        self.history = history
        self.max_block = max_block

    # What this event loop's shared reader is made from (adapters.redis.live_async.loop_reads).
    @property
    def client(self) -> Any:
        return self.conn.client

    @property
    def cluster(self) -> bool:
        return self.conn.cluster

    def read_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                  block: float | None = None) -> list[Event]:
        """Parts after the cursor, waiting up to ``block`` seconds for one (``XREAD BLOCK``, no polling).

        Parts the live stream no longer holds (turns committed before the
        last, or a finished job's whole stream once ``live_ttl`` ran out) are
        read from the durable events instead: ids are shared, so any cursor
        places the reader (see the module docstring).
        """
        if check_cursor(after) == LAST_CURSOR:
            # Nothing can come after the largest id, and XRANGE refuses to start past it: the wait a
            # follower asked for, then nothing (returning at once would make its loop spin).
            time.sleep(max(0.0, min(block or 0.0, self.max_block)))
            return []
        if limit <= 0:
            return []
        limit = _bounded(limit)
        if block is not None and block > 0:
            live, what = self.conn.keys(job_id).live, f"reading the live stream of job {job_id!r}"
            # Kept under the socket timeout, so a long wait is never mistaken for a dead server.
            ms = max(1, int(min(block, self.max_block) * 1000))
            with _mapped(what):
                # XREAD BLOCK is only the wait: what arrived is read by the script, which also sees a front
                # trimmed past the cursor meanwhile. On one Redis both go in one round trip (the script runs
                # once the wait ends); a Cluster's client sends them one after the other.
                if not self.cluster:
                    pipe = self.client.pipeline(transaction=False)
                    pipe.xread({live: after or "0-0"}, count=1, block=ms)
                    pipe.evalsha(self.conn.scripts.read_live.sha, 1, live, after or "", str(limit))
                    waited, reply = pipe.execute(raise_on_error=False)
                    if not isinstance(reply, Exception):
                        # A key of another type, named (before XREAD's error).
                        self.conn.check_types(job_id, reply, what)
                    if isinstance(waited, Exception):
                        raise waited
                    if not isinstance(reply, NoScriptError):  # else: loaded and run by _read_now
                        if isinstance(reply, Exception):
                            raise reply
                        return self._parts(job_id, after, limit, reply, what)
                elif not self.client.xread({live: after or "0-0"}, count=1, block=ms) and self.client.exists(live):
                    return []
        return self._read_now(job_id, after, limit)

    async def aread_live(self, job_id: str, *, after: str | None = None, limit: int = 1000,
                         block: float | None = None) -> list[Event]:
        """:meth:`read_live` for ``async`` code: the same parts, and the wait holds no thread.

        The wait is this event loop's one ``XREAD BLOCK`` over every followed
        key (on a Cluster, one per slot), then ``READ_LIVE`` runs on an
        asyncio connection. The durable events a reader behind the stream's
        front lacks, and a read that failed (a script not loaded yet, a
        failover, a dropped connection), are read as ``read_live`` reads them,
        in a thread: briefly, never for a wait. A connection with no asyncio
        twin (Sentinel, a custom class) is read in a thread throughout.
        """
        if check_cursor(after) == LAST_CURSOR:
            await asyncio.sleep(max(0.0, min(block or 0.0, self.max_block)))  # as read_live: nothing comes after it
            return []
        if limit <= 0:
            return []
        limit = _bounded(limit)
        live = self.conn.keys(job_id).live
        reads = loop_reads(self)
        if not reads.usable(live):
            return await asyncio.to_thread(self.read_live, job_id, after=after, limit=limit, block=block)
        if block is None or block <= 0:
            return await self._aread_now(reads, job_id, after, limit)
        deadline = time.monotonic() + block
        while True:
            woken = await reads.wait(live, after or "0-0", deadline - time.monotonic())
            parts = await self._aread_now(reads, job_id, after, limit, quiet=not woken)
            # Woken with nothing to read (the shared XREAD failed on another follower's key): wait on.
            if parts or time.monotonic() >= deadline:
                return parts

    async def _aread_now(self, reads: LoopReads, job_id: str, after: str | None, limit: int, *,
                         quiet: bool = False) -> list[Event]:
        what = f"reading the live stream of job {job_id!r}"
        try:
            reply = await reads.evalsha(self.conn.keys(job_id).live, self.conn.scripts.read_live, after or "",
                                        str(limit), quiet=quiet)
        except RedisError:  # a failover, a dropped connection: the sync read follows a new slot map and retries
            return await asyncio.to_thread(self._read_now, job_id, after, limit)
        self.conn.check_types(job_id, reply, what)
        if reply is not None and not int(reply[1]):
            return [event(job_id, entry_id, fields) for entry_id, fields in reply[0]]
        return await asyncio.to_thread(self._parts, job_id, after, limit, reply, what)

    def _read_now(self, job_id: str, after: str | None, limit: int) -> list[Event]:
        what = f"reading the live stream of job {job_id!r}"
        reply = self.conn.run(self.conn.scripts.read_live, [self.conn.keys(job_id).live], [after or "", str(limit)],
                              what, write=False)
        return self._parts(job_id, after, limit, reply, what)

    def _parts(self, job_id: str, after: str | None, limit: int, reply: Any, what: str) -> list[Event]:
        """The parts a READ_LIVE reply holds, with the durable events it says the reader lacks."""
        self.conn.check_types(job_id, reply, what)
        if reply is None:  # expired (a finished job) or never made: the durable events serve the reader
            return self.history.events(job_id, after=after, limit=limit)
        entries, gap = reply
        live = [event(job_id, entry_id, fields) for entry_id, fields in entries]
        if not int(gap):
            return live
        return behind_first(self.history.events(job_id, after=after, limit=limit), live, limit)
