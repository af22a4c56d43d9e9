"""The runner's side of storage: what the engine needs to run a job (load, lease, journal, commit, inbox)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JobStatus,
    JSONValue,
    LogEntry,
    Message,
    Usage,
)

__all__ = ["FENCED_KEPT", "INBOX_OPEN", "FencedAnswers", "JobStore", "InboxStore", "LeaseHistory", "LeaseState",
           "LeaseStore", "StepBeforeCommit", "StepPublisher", "RunStore"]


INBOX_OPEN: tuple[JobStatus, ...] = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
"""The statuses in which a job takes messages into its inbox: a turn will still read them."""


@runtime_checkable
class JobStore(Protocol):
    """Records and their atomic writes."""

    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        ...

    def get_job(self, job_id: str) -> JobRecord | None:
        """The record with its current journal and pending control request, or ``None`` for an unknown job."""
        ...

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` atomically or not at all (see the module docstring).

        Returns what a worker that keeps the lease must know as it stands
        after the commit: a pending control request (``"pause"``/``"cancel"``)
        and how many messages wait in the job's inbox.
        """
        ...

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        """Journal one step result under ``version``; fenced like ``commit``."""
        ...

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        """Count the usage of an attempt that was fenced off after paying (a model call it cannot commit).

        Outside the version fence, beside the record; loads report it as
        ``record.dropped``. A call re-sent with the same ``token`` counts once.
        """
        ...

    def request_control(self, job_id: str, request: str | None) -> bool:
        """Store (or clear, with ``None``) a pause/cancel request beside the record; ``False`` for an unknown job.

        Never touches the record or its version, so a turn in flight still commits. A pause never
        replaces a stored cancel (the cancel stays, ``True`` is returned): two callers, one cancelling
        and one pausing, end cancelled whichever stored its request last.
        """
        ...

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        """Move a running job later in the due index, to ``due_at``, if it is still at ``version``.

        A turn deferred by flow control commits nothing: without this the sweep would find it overdue
        and send it again at every pass, each send starting one more chain of deferrals. Never moves
        it earlier; ``False`` (nothing written) when the job moved on, is not due, or is gone.
        """
        ...

    def delete_job(self, job_id: str) -> bool:
        """Remove a job and everything it owns; ``False`` if it did not exist."""
        ...


@runtime_checkable
class InboxStore(Protocol):
    """Messages sent to a running job (``app.send``), taken into the transcript at its next turn boundary.

    Sending is outside the version fence (a turn in flight still commits); a
    commit takes messages from the front (``Commit.take_inbox``) atomically
    with the turn that put them in the transcript, so each joins exactly once.
    The status is checked by the write itself, on both sides (see the
    storage contract): ``send`` against :data:`INBOX_OPEN`, a commit that
    ends the run (``Commit.ends_run``) against the inbox's length.
    """

    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        """Append ``messages`` to the inbox; its new length, or ``None`` for an unknown job.

        Raises :class:`~pipelines.engine.errors.JobConflictError` naming the
        status, nothing appended, when the job's status (read in the same
        atomic step) is not one of :data:`INBOX_OPEN`.
        """
        ...

    def inbox(self, job_id: str, count: int) -> list[Message]:
        """The first ``count`` messages waiting, in the order they were sent."""
        ...


@runtime_checkable
class LeaseStore(Protocol):
    """Who is running a job's phase right now (I3)."""

    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the job's lease for ``ttl`` seconds and return the record.

        ``None`` when the job is unknown or another owner holds a live lease.
        Taking over a lease that ran out (its owner neither let it go nor
        committed: dead or stalled mid-turn) counts one interruption of the
        job's turn, in the same atomic step; the record returned (and every
        load until the next commit, which starts the count again) says how many
        in a row as ``record.interrupted`` (kept beside the lease, never in the
        record's JSON). The runner fails a job whose turn keeps killing its
        workers by it (:mod:`pipelines.engine.runner.interrupted`).
        """
        ...

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        """Extend the lease if ``owner`` still holds it."""
        ...

    def release_lease(self, job_id: str, owner: str) -> None:
        """Drop the lease if ``owner`` holds it; otherwise do nothing."""
        ...

    def lease_owner(self, job_id: str) -> str | None:
        """The owner of the live lease, if any."""
        ...


class LeaseState(NamedTuple):
    """A job's lease as :meth:`LeaseHistory.lease_state` reads it."""

    owner: str | None  # the owner of the live lease, if any
    lapsed: bool  # no live lease, and the last one taken ran out instead of being let go


@runtime_checkable
class LeaseHistory(Protocol):
    """A storage that tells a lease that ran out from one that was let go (a capability).

    A lease is let go by ``release_lease`` or by the commit that releases it;
    one that ran out while still taken means its holder died (or stalled past
    it) in the middle of an attempt: the page's "worker lost", even when the
    attempt journaled nothing. Taking the lease again starts a new one.
    """

    def lease_state(self, job_id: str) -> LeaseState:
        """The job's live lease owner, and whether the last lease taken lapsed (``(None, False)``: unknown job)."""
        ...


FENCED_KEPT = 5
"""How many answers of fenced-off attempts a job keeps (:class:`FencedAnswers`): the newest."""


@runtime_checkable
class FencedAnswers(Protocol):
    """A storage that keeps what attempts fenced off after their model answered were told (a capability).

    Such an attempt can no longer commit (another worker moved the job on),
    so its answer would be lost to the page's model-call view; its usage is
    counted either way (``add_dropped_usage``). Kept outside the version
    fence, beside the record, the newest :data:`FENCED_KEPT` of a job.
    """

    def add_fenced_answer(self, job_id: str, usage: Usage, entry: JSONValue, *, token: str) -> None:
        """``add_dropped_usage(job_id, usage, token=token)`` and keep ``entry`` (JSON), in one write.

        A call re-sent with the same ``token`` writes nothing; an unknown job is ignored.
        """
        ...

    def fenced_answers(self, job_id: str) -> list[JSONValue]:
        """The entries kept, oldest first (``[]`` for an unknown job or none)."""
        ...


@runtime_checkable
class StepPublisher(Protocol):
    """A storage that journals a step and publishes live-stream parts in one write (a capability).

    The agent turn journals the model's answer with the last of its streamed
    text this way: one round trip instead of two. A storage without it gets
    ``record_step`` then ``publish``.
    """

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """``record_step``, then ``publish(parts)`` only if the step was journaled; a re-sent call publishes once."""
        ...


@runtime_checkable
class StepBeforeCommit(Protocol):
    """A storage that journals a phase's last step before its commit without waiting for the reply (a capability).

    The agent turn journals the result of its one tool call this way, and a final answer (no tool calls)
    with its last streamed text, when nothing but its commit follows. The write is sent before the call
    returns, so a crash after it finds the step journaled, as with ``record_step`` (I5); its reply is read
    before the next write of the same thread, the commit, so the turn does not wait a round trip for it.
    ``parts`` are published with it, as by ``record_step_and_publish``. A write refused (the worker fenced
    off) changes nothing: where the storage waited for its reply it raises :class:`StaleVersionError` at
    once, else it calls ``on_refused()`` when the reply is read; the commit, behind the same fence, is
    refused either way. A storage without it gets ``record_step`` (and ``publish``).
    """

    def record_step_before_commit(self, job_id: str, *, version: int, owner: str | None, key: str,
                                  value: JSONValue, parts: Sequence[Event] = (),
                                  on_refused: Callable[[], None] | None = None) -> None:
        """``record_step`` (with ``parts``), its reply read with the next write of this thread (see the class)."""
        ...


@runtime_checkable
class RunStore(JobStore, LeaseStore, InboxStore, Protocol):
    """What the engine needs to run a job: load, lease, journal, commit, the inbox, and publishing live parts.

    (``publish`` is declared on :class:`LiveStore`; a turn's live parts go through
    :mod:`pipelines.engine.writer`.)
    """

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        """Append ephemeral parts (``text_delta``, ``attempt_started``); nothing for an unknown job."""
        ...
