"""The commit: one atomic write of a job's new record with its turn's appends, and storage's reply to it."""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, Field, model_validator

from pipelines.engine.models.records import Event, JobRecord, JobStatus, LogEntry
from pipelines.engine.models.values import Message

__all__ = ["Commit", "CommitReply"]


class Commit(BaseModel):
    """One atomic write: the new record plus the turn's appends (I1).

    Storage applies it only if the stored version is ``expected_version`` and,
    for a worker's commit (``owner`` set), the live lease is ``owner``'s; otherwise it raises
    :class:`~pipelines.engine.errors.StaleVersionError` and changes nothing (I2). A
    commit whose ``token`` is already the stored one was applied before (its
    reply was lost and the client retried): storage returns without writing.
    """

    job_id: str
    expected_version: int
    owner: str | None = None
    token: str
    record: JobRecord
    append_messages: list[Message] = Field(default_factory=list)
    truncate_messages_to: int | None = Field(default=None, ge=0)  # keep the first N messages (a rewind)
    logs: list[LogEntry] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    keep_journal: bool = False
    release_lease: bool = True
    # Drop a pending pause/cancel request (the commit applies it or makes it moot).
    clear_control: bool = False
    # How many messages this commit took from the front of the job's inbox into the transcript.
    take_inbox: int = Field(default=0, ge=0)
    # The commit ends the run: storage refuses it (InboxNotEmptyError, nothing written) if the inbox
    # holds more than ``take_inbox`` messages, checked in the same atomic step that writes, so a run
    # never completes past messages sent while its last turn ran.
    ends_run: bool = False

    @model_validator(mode="after")
    def _of_its_job(self) -> Commit:
        # A commit writes its job's record: one of another job would be stored under this job's id.
        if self.record.job_id != self.job_id:
            raise ValueError(f"the commit of job {self.job_id!r} holds the record of job {self.record.job_id!r}")
        return self

    @property
    def due_at(self) -> float | None:
        """The due-index score: set while running, absent otherwise."""
        cp = self.record.checkpoint
        if self.record.status is JobStatus.RUNNING and cp is not None:
            return cp.due_at
        return None


class CommitReply(NamedTuple):
    """What storage reports after a commit: what a worker keeping the lease must know."""

    control: str | None = None  # a pause or cancel request still pending
    inbox: int = 0  # messages waiting in the job's inbox
