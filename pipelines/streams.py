"""Following a job's live stream: every committed event and the text as it arrives, from a cursor.

``app.stream(job_id, after=cursor)`` yields :class:`~pipelines.engine.models.Event`
parts in order: the durable events (``job_started``, ``turn_started``,
``tool_call``, ``tool_result``, ``turn_committed``, ``job_finished``, ...) and
the ephemeral ones a worker publishes while a turn runs (``attempt_started``,
``text_delta``). Each part's ``id`` is the cursor to resume after (an SSE
``Last-Event-ID``). With ``follow=True`` it waits on the storage for new parts
(Redis ``XREAD BLOCK``: no polling loop) until the job is complete, failed or
cancelled; a finished job is replayed and the stream ends.

A client builds a turn's text from the ``text_delta`` parts of the latest
``attempt_started`` of that turn: an attempt that was abandoned (a crash, a
retried stream) is superseded by the next, and ``turn_committed`` closes the
turn. The committed transcript (``app.messages``) stays the truth.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

from adapters.base import Storage
from pipelines.engine.control import load_job
from pipelines.engine.events import check_cursor
from pipelines.engine.models import Event, JobStatus

__all__ = ["FINISHED", "afollow", "follow", "turn_texts"]

FINISHED = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)

_WAIT = 5.0  # one blocking read at most this long, then the job's status is looked at again
_PAGE = 1000  # parts a read returns at most (Storage.read_live's default limit)


def follow(storage: Storage, job_id: str, *, after: str | None = None, follow: bool = True,
           timeout: float | None = None) -> Iterator[Event]:
    """Parts of ``job_id``'s stream after ``after`` (see the module docstring).

    ``follow=False`` returns what is there now. ``timeout`` (seconds) ends a
    followed stream that long after it started, even if the job goes on.
    Raises :class:`~pipelines.errors.JobNotFoundError` for an unknown job and
    :class:`~pipelines.errors.InvalidInputError` for a malformed cursor, before
    anything is read.
    """
    return (part for part in _steps(storage, job_id, after, follow, timeout) if part is not None)


def _steps(storage: Storage, job_id: str, after: str | None, follow: bool,
           timeout: float | None) -> Iterator[Event | None]:
    """The parts, with ``None`` after every blocking read that found nothing (a point to stop at)."""
    cursor = check_cursor(after)
    load_job(storage, job_id)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    drained = False  # the last read returned all there was: reading again at once would find nothing
    while True:
        parts = [] if drained else storage.read_live(job_id, after=cursor)
        drained = False
        if not parts:
            if not follow:
                return
            if _finished(storage, job_id):
                # The final commit wrote its events with the status: one last look, then nothing more comes.
                yield from storage.read_live(job_id, after=cursor)
                return
            left = _WAIT if deadline is None else min(_WAIT, deadline - time.monotonic())
            if left <= 0:
                return
            parts = storage.read_live(job_id, after=cursor, block=left)
            if not parts:
                yield None  # a consumer that went away stops here, not after the next part
                continue
            # Less than a page is all that had arrived: next comes the finished check and a wait (which
            # returns at once if more came meanwhile, so a storage with smaller pages loses nothing), not
            # another read.
            drained = len(parts) < _PAGE
        for part in parts:
            cursor = part.id
            yield part


def _finished(storage: Storage, job_id: str) -> bool:
    record = storage.get_job(job_id)
    return record is None or record.status in FINISHED


async def afollow(storage: Storage, job_id: str, *, after: str | None = None, follow: bool = True,
                  timeout: float | None = None) -> AsyncIterator[Event]:
    """:func:`follow` for ``async`` code: each blocking read runs in a thread, never on the event loop.

    Closing the iterator (a client that disconnected) stops the reads after
    at most one blocking read of the storage.
    """
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
    for part in parts:
        if part.turn is None:
            continue
        attempt = str(part.data.get("attempt", ""))
        if part.type == "attempt_started":
            attempts[part.turn], texts[part.turn] = attempt, ""
        elif part.type == "text_delta" and attempts.get(part.turn) == attempt:
            texts[part.turn] += str(part.data.get("text", ""))
    return texts
