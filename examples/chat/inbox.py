"""A message for a conversation still answering the one before: ``useChat``'s next message after ``stop()``.

``stop()`` only closes the client's connection: the run goes on. Its next message is sent to the job
(``app.send``), which takes it at its next turn: the run's next turn, or, when the message arrived during
its last one, a run of its own that starts as that one ends. The ``POST`` answers with that turn or run,
once the message is in the transcript: what comes before it answers the message before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request

from pipelines import App
from pipelines.engine import control
from pipelines.engine.errors import JobConflictError
from pipelines.engine.models import RUN_STARTS, JobStatus

POLL_SECONDS = 0.05
SNAPSHOT_TRIES = 20


@dataclass(frozen=True)
class Sent:
    """A message sent to a running conversation, and where to look for the turn that takes it."""

    job_id: str
    text: str
    before: str | None  # the stream's last part when it was sent: the turn that takes it comes after
    known: int  # the transcript's length then: the message lands at or after it
    ahead: int = 0  # messages of the same text in the inbox then: they land before it, at or after ``known``


def send_to_running(app: App, job_id: str, text: str, before: str | None) -> Sent:
    """Send ``text`` to the running ``job_id`` (its inbox; nothing is lost if the run fails meanwhile).

    The caller sends one message at a time (``_starting`` in :mod:`examples.chat.app`).
    """
    known, ahead = _waiting_before(app, job_id, text)
    app.send(job_id, [text])
    return Sent(job_id, text, before, known, ahead)


def _waiting_before(app: App, job_id: str, text: str) -> tuple[int, int]:
    """The transcript's length and how many messages of ``text`` wait in the inbox, read at one version.

    A message still in the inbox lands at or after that length once a turn takes it (a turn that took it and
    has not committed yet included): the message about to be sent is the one after those of the same text.
    """
    for _ in range(SNAPSHOT_TRIES):
        record = control.load_job(app.storage, job_id)
        known = len(app.messages(job_id))
        waiting = app.storage.inbox(job_id, record.inbox) if record.inbox > 0 else []
        again = control.load_job(app.storage, job_id)
        if (again.version, again.inbox) == (record.version, record.inbox):
            return known, sum(1 for m in waiting if m.get("role") == "user" and m.get("content") == text)
    raise JobConflictError(f"conversation {job_id!r} kept changing while the message was sent; try again")


async def taken_at(app: App, sent: Sent, request: Request) -> str | None:
    """The id of the part the answer to ``sent`` starts at, once a turn took it (``None``: the client left).

    Raises :class:`JobConflictError` when the conversation stopped running without taking it (it waits for
    a person, say): the message stays in its inbox, for the turn after.
    """
    while not await request.is_disconnected():
        part = await asyncio.to_thread(_taking_part, app, sent)
        if part is not None:
            return part
        await asyncio.sleep(POLL_SECONDS)
    return None


def _not_taken(job_id: str, status: JobStatus, error: object) -> str:
    """Why no turn took a message sent to ``job_id``, now ``status``: where the message is, and what takes it."""
    if status is JobStatus.WAITING:
        return (f"conversation {job_id!r} is waiting (a call waits for approval, say): the message waits in its "
                "inbox and joins its next turn")
    if status in (JobStatus.ERROR, JobStatus.CANCELLED):
        what = f"failed ({error})" if status is JobStatus.ERROR else "was cancelled"
        return (f"conversation {job_id!r} {what} before a turn took the message: it waits in the conversation's "
                "inbox and joins it if the run is retried")
    return f"conversation {job_id!r} is {status.value}: the message waits in its inbox and joins its next turn"


def _taking_part(app: App, sent: Sent) -> str | None:
    view = app.get(sent.job_id)  # read before the transcript: not running then and not taken after, it waits
    messages = app.messages(sent.job_id, sent.known)
    same = [sent.known + i for i, m in enumerate(messages) if m["role"] == "user" and m.get("content") == sent.text]
    at = same[sent.ahead] if len(same) > sent.ahead else None  # those of its text sent before it come first
    if at is None:
        if view is not None and view.status is not JobStatus.RUNNING:
            raise JobConflictError(_not_taken(sent.job_id, view.status, view.error))
        return None
    parts = list(app.stream(sent.job_id, follow=False))
    ids = [p.id for p in parts]
    after = parts[ids.index(sent.before) + 1:] if sent.before in ids else parts
    for part in after:
        if part.type in RUN_STARTS:
            return part.id  # the run the message started as the one it came during ended
        span = part.data.get("messages") if part.type == "turn_committed" else None
        if isinstance(span, list) and len(span) == 2 and span[0] <= at < span[1]:
            return next(p.id for p in after if p.turn == part.turn)  # that turn's first part
    return None  # the commit that took it is not in the stream yet
