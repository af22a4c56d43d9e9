"""The one writer: every change to what storage holds about a job goes through a function here.

:mod:`pipelines.engine.transitions` computes (a record in, a :class:`Commit`
out, no storage); this module applies. Each operator verb ends in one call
here: starting or continuing a run (:mod:`~pipelines.engine.start`), a
turn's commit and its mid-phase state saves (:mod:`~pipelines.engine.runner`),
pause, resume, cancel and retry (:mod:`~pipelines.engine.control`), approve,
reject and a recorded tool result (:mod:`phases.approvals`), a child's start
and wake-up (:mod:`~pipelines.engine.children`, :mod:`phases.children`), fork
and delete (the App), and a message sent to a conversation
(:mod:`~pipelines.engine.inbox`) — all :func:`apply` a commit, or call the
one primitive below that writes what a commit cannot carry (a journaled step,
a live part, a pause request, a sent message, a delete). A test scans the
library's call sites (``tests/unit/test_layers.py``): no other module calls a
storage write method.

Why one place: a new feature (an index, an event, a notification) that must
happen on every write is added here once, and the rules that span records
(the inbox vs a run's end, a child's owner, a fork's identity) are checked in
the write that makes them true (see the storage ports in :mod:`adapters.base`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from adapters.base import FencedAnswers, RetentionStore, StepBeforeCommit, StepPublisher
from pipelines.engine.capabilities import Feature, as_feature
from pipelines.engine.errors import StorageUnavailableError
from pipelines.engine.events import notify
from pipelines.engine.models import FINISHED_STATUSES, Commit, CommitReply, JobRecord, JobStatus, Usage

if TYPE_CHECKING:
    from adapters.base import Scheduler, Storage
    from pipelines.engine.models import Event, JSONValue, Message

__all__ = [
    "add_dropped_usage",
    "apply",
    "delete",
    "postpone",
    "publish_live",
    "record_step",
    "request_control",
    "save_state",
    "send",
]

# Not imported from transitions, which imports the phase protocol, which journals through this module.
_CHILDREN = "children"  # transitions.CHILDREN: record.waiting["kind"] of a parent waiting for its children


def apply(storage: Storage, scheduler: Scheduler, commit: Commit, *, schedule: bool = True) -> CommitReply:
    """Write ``commit`` (or create the job, for ``expected_version`` 0), notify its events, schedule what is due.

    Returns what storage reports after it: a pending pause/cancel request, the inbox's length.
    Raises :class:`~pipelines.engine.errors.StaleVersionError` (nothing written) when fenced off.
    """
    reply = CommitReply()
    if commit.expected_version == 0:
        storage.create_job(commit.record, messages=commit.append_messages, logs=commit.logs, events=commit.events)
    else:
        reply = storage.commit(commit)
    notify(commit.job_id, commit.events)
    new = commit.record
    if schedule and commit.release_lease and new.status is JobStatus.RUNNING and new.checkpoint is not None:
        # Imported here: flow imports the phase protocol, which journals through this module.
        from pipelines.engine import flow

        delay = max(0.0, new.checkpoint.due_at - scheduler.now())
        # The priority is named only when it is not the default, so a scheduler written before
        # priorities existed keeps working for every run that does not ask for one.
        extra = {"priority": priority} if (priority := flow.priority_of(new)) != flow.PRIORITIES[0] else {}
        try:
            scheduler.schedule_advance(commit.job_id, delay, pipeline=new.pipeline, version=new.version, **extra)
        except StorageUnavailableError as exc:
            # Written already: said so, or a caller starts the job again (refused: it exists) or under a new id.
            raise StorageUnavailableError(
                f"{exc}; the job's commit is written: it runs when a sweep finds it due (a worker's, or "
                "`pipelines advance --due`); do not start it again", fix=getattr(exc, "fix", None)) from exc
    if schedule:
        _wake_family(storage, scheduler, new)
    return reply


def _wake_family(storage: Storage, scheduler: Scheduler, new: JobRecord) -> None:
    """The fast path of child runs: a parent that starts waiting, or whose child just finished, is advanced.

    The advance itself checks the children under the parent's lease
    (:mod:`pipelines.engine.children`); this only sends the message. Lost
    messages are recovered by the sweep, which looks at waiting parents.
    """
    if new.status is JobStatus.WAITING and (new.waiting or {}).get("kind") == _CHILDREN:
        # A child may have finished before this wait was committed: look now.
        _wake(scheduler, new)
    elif new.parent_job is not None and new.status in FINISHED_STATUSES:
        parent = storage.get_job(new.parent_job)
        if parent is not None and parent.status is JobStatus.WAITING:
            _wake(scheduler, parent)


def _wake(scheduler: Scheduler, record: JobRecord) -> None:
    """Send ``record``'s job an advance now, on its own priority's queue (``scheduler`` may send with the
    priority of the job whose commit this is: a child's, when it wakes its parent)."""
    from pipelines.engine import flow  # see apply

    flow.with_priority(scheduler, flow.priority_of(record)).schedule_advance(record.job_id, 0.0,
                                                                             pipeline=record.pipeline)


def save_state(storage: Storage, commit: Commit) -> CommitReply:
    """A phase's mid-phase state save (``ctx.save_state``): the commit alone, nothing scheduled or woken."""
    return storage.commit(commit)


def record_step(storage: Storage, job_id: str, *, version: int, owner: str | None, key: str,
                value: JSONValue, parts: Sequence[Event] = (), before_commit: bool = False,
                on_refused: Callable[[], None] | None = None) -> None:
    """Journal a step, and publish ``parts`` once it is journaled: in one write when ``storage`` can
    (a :class:`~adapters.base.StepPublisher`), else ``record_step`` then ``publish``.

    ``before_commit``: nothing but the phase's commit follows this write, so a storage that can
    (a :class:`~adapters.base.StepBeforeCommit`) reads its reply with the commit's, and calls
    ``on_refused()`` if it then finds the write refused (else a refusal raises here, as always).
    """
    if before_commit and (last := as_feature(storage, Feature.STEP_BEFORE_COMMIT,
                                              StepBeforeCommit)) is not None:  # type: ignore[type-abstract]
        last.record_step_before_commit(job_id, version=version, owner=owner, key=key, value=value, parts=parts,
                                       on_refused=on_refused)
    elif not parts:
        storage.record_step(job_id, version=version, owner=owner, key=key, value=value)
    elif (store := as_feature(storage, Feature.STEP_AND_PUBLISH, StepPublisher)) is not None:  # type: ignore[type-abstract]
        store.record_step_and_publish(job_id, version=version, owner=owner, key=key, value=value, parts=parts)
    else:
        storage.record_step(job_id, version=version, owner=owner, key=key, value=value)
        storage.publish(job_id, parts)


def publish_live(storage: Storage, job_id: str, parts: Sequence[Event]) -> None:
    """Send ephemeral parts (text deltas, an attempt's start) to the job's live stream, outside any commit."""
    storage.publish(job_id, parts)


def add_dropped_usage(storage: Storage, job_id: str, usage: Usage, *, token: str,
                      answer: JSONValue | None = None) -> None:
    """Count the usage of an attempt that was fenced off (stored at once, outside the version fence).

    ``answer``: what its model answered, kept with it where the storage keeps such answers
    (``Feature.FENCED_ANSWERS``, one write); elsewhere only the usage is counted.
    """
    if answer is not None and (store := as_feature(storage, Feature.FENCED_ANSWERS,
                                                   FencedAnswers)) is not None:  # type: ignore[type-abstract]
        store.add_fenced_answer(job_id, usage, answer, token=token)
    else:
        storage.add_dropped_usage(job_id, usage, token=token)


def request_control(storage: Storage, job_id: str, request: str | None) -> bool:
    """Store (or, with ``None``, clear) a pause/cancel request for the turn in flight to apply at its commit."""
    return storage.request_control(job_id, request)


def postpone(storage: Storage, record: JobRecord, due_at: float) -> bool:
    """Move ``record``'s job later in the due index (a deferred turn, no commit) while it is at its version."""
    return storage.postpone(record.job_id, version=record.version, due_at=due_at)


def send(storage: Storage, job_id: str, messages: Sequence[Message]) -> int | None:
    """Append messages to a running conversation's inbox (storage refuses a finished job in the same write)."""
    return storage.send(job_id, messages)


def delete(storage: Storage, record: JobRecord) -> bool:
    """Delete ``record``'s job and everything it stored, if it is still at ``record.version``.

    Raises :class:`~pipelines.engine.errors.StaleVersionError` when it moved
    on meanwhile (a storage without the fenced delete is checked, not atomic).
    """
    fenced = as_feature(storage, Feature.RETENTION, RetentionStore)  # type: ignore[type-abstract]
    if fenced is None:
        return bool(storage.delete_job(record.job_id))
    return fenced.delete_job(record.job_id, if_version=record.version)
