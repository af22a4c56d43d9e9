"""Following a job's live stream: every committed event and the text as it arrives, from a cursor.

``app.stream(job_id, after=cursor)`` yields :class:`~pipelines.engine.models.Event`
parts in order: the durable events (``job_started``, ``turn_started``,
``tool_call``, ``tool_result``, ``turn_committed``, ``job_finished``, ...) and
the ephemeral ones a worker publishes while a turn runs (``attempt_started``,
``text_delta``). Each part's ``id`` is the cursor to resume after (an SSE
``Last-Event-ID``). With ``follow=True`` it waits on the storage for new parts
(Redis ``XREAD BLOCK``: no polling loop) until the job is complete, failed or
cancelled; a finished job is replayed and the stream ends.

``app.astream`` (:func:`afollow`) is the same stream for ``async`` code. On a
storage with :class:`~adapters.base.AsyncLiveStore` (memory, Redis) a waiting
follower holds no thread: it waits on a future of its event loop, so a
thousand idle SSE clients cost no worker of the default executor (which has
only a handful: followers that each held one would queue the others' reads).
Other storages are read in a thread, one blocking read at a time.

A client builds a turn's text from the ``text_delta`` parts of the latest
``attempt_started`` of that turn: an attempt that was abandoned (a crash, a
retried stream) is superseded by the next, and ``turn_committed`` closes the
turn. The committed transcript (``app.messages``) stays the truth.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from adapters.base import AsyncLiveStore, Storage
from pipelines.engine.capabilities import Feature, as_feature
from pipelines.engine.control import load_job
from pipelines.engine.events import check_cursor
from pipelines.engine.models import FINISHED_STATUSES, RUN_STARTS, Event

__all__ = ["FINISHED", "afollow", "follow", "turn_texts"]

FINISHED = FINISHED_STATUSES

_WAIT = 5.0  # one blocking read at most this long, then the job's status is looked at again
# An async follower's wait holds no thread, so it may last longer: a job's end comes as parts in the live stream
# (the final commit writes them), and this look only catches a job that vanished (deleted) while followed. A
# thousand idle followers then look at 33 statuses a second, not 200.
_AWAIT = 30.0
_PAGE = 1000  # parts a read returns at most (Storage.read_live's default limit)
# What a worker publishes outside any commit. A batch of only these cannot have come with a change of status
# (a run ends by a commit, whose events land in the live stream too), so no status read follows it.
_PUBLISHED = frozenset({"attempt_started", "text_delta"})
# An async follower reads the job's status (a storage call that may block) in a thread, shared by every
# follower of the process: however many wait, and however their waits line up, they use two threads. A look
# after a commit's parts came while following (the job may have ended) goes to one; every other look (a
# follower starting, or one whose wait ran out) to the other, so a thousand quiet followers looking together,
# or connecting together, never hold up the one whose job is streaming.
_status_pools: tuple[int, dict[bool, ThreadPoolExecutor]] | None = None  # (pid, pools): a forked child makes its own
_status_lock = threading.Lock()
T = TypeVar("T")


def follow(storage: Storage, job_id: str, *, after: str | None = None, follow: bool = True,
           timeout: float | None = None, idle: Callable[[], None] | None = None) -> Iterator[Event]:
    """Parts of ``job_id``'s stream after ``after`` (see the module docstring).

    ``follow=False`` returns what is there now. ``timeout`` (seconds) ends a
    followed stream that long after it started, even if the job goes on.
    Raises :class:`~pipelines.errors.JobNotFoundError` for an unknown job and
    :class:`~pipelines.errors.InvalidInputError` for a malformed cursor, before
    anything is read. ``idle()`` is called after each blocking read that found nothing.
    """
    return (part for part in _steps(storage, job_id, after, follow, timeout, idle) if part is not None)


def _steps(storage: Storage, job_id: str, after: str | None, follow: bool,
           timeout: float | None, idle: Callable[[], None] | None = None) -> Iterator[Event | None]:
    """The parts, with ``None`` after every blocking read that found nothing (a point to stop at)."""
    cursor = check_cursor(after)
    load_job(storage, job_id)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    drained = settled = False  # see _waited
    while True:
        parts = [] if drained else storage.read_live(job_id, after=cursor)
        if not parts:
            if not follow:
                return
            if not settled and _finished(storage, job_id):
                # The final commit wrote its events with the status: one last look, then nothing more comes.
                yield from storage.read_live(job_id, after=cursor)
                return
            left = _left(deadline)
            if left <= 0:
                return
            parts = storage.read_live(job_id, after=cursor, block=left)
            drained, settled = _waited(parts)
            if not parts:
                yield None  # a consumer that went away stops here, not after the next part
                if idle is not None:
                    idle()
                continue
        else:
            drained = settled = False
        for part in parts:
            cursor = part.id
            yield part


def _left(deadline: float | None, most: float | None = None, spread: float = 0.0) -> float:
    """How long the next blocking read may wait: ``most`` (``_WAIT``), less a random part of ``spread`` of it."""
    wait = (_WAIT if most is None else most) * (1.0 - spread * random.random())
    return wait if deadline is None else min(wait, deadline - time.monotonic())


def _waited(parts: list[Event]) -> tuple[bool, bool]:
    """``(drained, settled)`` after a blocking read returned ``parts``.

    Drained: less than a page is all that had arrived (nothing at all, if the
    wait ran out), so the next step is the status check and a wait (which
    returns at once if more came meanwhile, so a storage with smaller pages
    loses nothing), not another read. Settled: the parts were all published
    outside a commit (the text of a turn in flight), so the status is as it
    was and even that check is skipped: a follower of a streaming turn reads
    no record per batch of text.
    """
    return len(parts) < _PAGE, bool(parts) and all(part.type in _PUBLISHED for part in parts)


def _finished(storage: Storage, job_id: str) -> bool:
    record = storage.get_job(job_id)
    return record is None or record.status in FINISHED


def afollow(storage: Storage, job_id: str, *, after: str | None = None, follow: bool = True,
            timeout: float | None = None) -> AsyncIterator[Event]:
    """:func:`follow` for ``async`` code: the same parts, and a waiting follower holds no thread.

    On an :class:`~adapters.base.AsyncLiveStore` every read and wait runs on
    the event loop (only the job's status is read in a thread, briefly, when
    a wait ran out or a commit's parts came: in a pool of two threads shared
    by every follower), and closing the iterator (a client that disconnected)
    ends its wait at once. On another storage each
    blocking read runs in a thread, and closing stops the reads after at most
    that one read.
    """
    reader = as_feature(storage, Feature.ASYNC_LIVE, AsyncLiveStore)  # type: ignore[type-abstract]
    if reader is not None:
        return _awaited(storage, reader, job_id, after, follow, timeout)
    return _threaded(storage, job_id, after, follow, timeout)


async def _awaited(storage: Storage, reader: AsyncLiveStore, job_id: str, after: str | None, follow: bool,
                   timeout: float | None) -> AsyncIterator[Event]:
    """:func:`_steps` with ``await reader.aread_live`` for each read: the same steps, in the same order."""
    cursor = check_cursor(after)
    await _briefly(load_job, storage, job_id, routine=True)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    drained = settled = False
    routine = True  # no wait has brought a commit's parts yet
    while True:
        parts = [] if drained else await reader.aread_live(job_id, after=cursor)
        if not parts:
            if not follow:
                return
            if not settled and await _briefly(_finished, storage, job_id, routine=routine):
                for part in await reader.aread_live(job_id, after=cursor):
                    yield part
                return
            # Followers that connected together (a server restart) would otherwise look at their jobs'
            # statuses together, every _WAIT, a thousand at once; a spread wait evens that out.
            left = _left(deadline, _AWAIT, spread=0.25)
            if left <= 0:
                return
            parts = await reader.aread_live(job_id, after=cursor, block=left)
            drained, settled = _waited(parts)
            routine = not parts
        else:
            drained = settled = False
        for part in parts:
            cursor = part.id
            yield part


async def _briefly(fn: Callable[[Storage, str], T], storage: Storage, job_id: str, *, routine: bool) -> T:
    """``fn(storage, job_id)``, a short blocking storage call, in one of the followers' two threads."""
    global _status_pools
    with _status_lock:
        if _status_pools is None or _status_pools[0] != os.getpid():
            _status_pools = os.getpid(), {q: ThreadPoolExecutor(1, thread_name_prefix="pipelines-follow")
                                          for q in (False, True)}
        pool = _status_pools[1][routine]
    return await asyncio.get_running_loop().run_in_executor(pool, fn, storage, job_id)


async def _threaded(storage: Storage, job_id: str, after: str | None, follow: bool,
                    timeout: float | None) -> AsyncIterator[Event]:
    """:func:`_steps` run one step at a time in a thread (a storage without ``aread_live``)."""
    steps = _steps(storage, job_id, check_cursor(after), follow, timeout)
    done = object()
    while True:
        part = await asyncio.to_thread(next, steps, done)
        if part is done:
            return
        if part is not None:
            assert isinstance(part, Event)
            yield part


def turn_texts(parts: Iterator[Event] | list[Event]) -> dict[int, str]:
    """Each turn's text as a client assembles it: the deltas of the turn's latest attempt, in order."""
    attempts: dict[int, str] = {}
    texts: dict[int, str] = {}
    done = 0  # the run's last committed turn: later text for it or before comes from a fenced-off worker
    for part in parts:
        if part.type in RUN_STARTS:
            done = 0
        if part.turn is None:
            continue
        if part.type == "turn_committed":
            done = max(done, part.turn)
        if part.turn <= done:
            continue
        attempt = str(part.data.get("attempt", ""))
        if part.type == "attempt_started":
            attempts[part.turn], texts[part.turn] = attempt, ""
        elif part.type == "text_delta" and attempts.get(part.turn) == attempt:
            texts[part.turn] += str(part.data.get("text", ""))
    return texts
