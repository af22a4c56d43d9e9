"""What :class:`~adapters.memory.MemoryStorage` holds for one job (its record, transcript, streams, lease), and the
checks on it that the storage's reads and commits share."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.memory.history import NO_HISTORY, StoredHistory
from pipelines.engine.errors import InboxNotEmptyError, InvalidInputError
from pipelines.engine.events import check_cursor
from pipelines.engine.models import Commit, Usage

__all__ = ["Job", "check_inbox", "position"]


def position(after: str | None, what: str) -> int:
    """The position a cursor names (ids here are 1-based positions in the log); 0 for none.

    The shared check comes first, so memory refuses what Redis refuses, with the same error.
    """
    if check_cursor(after, what) is None:
        return 0
    assert after is not None
    if "-" in after:
        raise InvalidInputError(f"{what} {after!r} is not an id this storage gave out (a position, not <ms>-<seq>)")
    return int(after)


@dataclass
class Job:
    record: str  # the record's JSON text without its turn history, which is kept apart:
    history: StoredHistory = NO_HISTORY  # (see adapters.memory.history)
    messages: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    live: list[str] = field(default_factory=list)  # every event again, plus ephemeral parts (text deltas)
    journal: dict[str, str] = field(default_factory=dict)
    journal_version: int = -1
    lease_owner: str | None = None
    lease_expires: float = 0.0
    token: str = ""
    version: int = 0
    control: str | None = None  # a pause/cancel requested while a turn was in flight
    inbox: list[str] = field(default_factory=list)  # messages sent to the job, taken by its next turn
    dropped: Usage = field(default_factory=Usage)  # usage of attempts fenced off after paying
    dropped_token: str = ""
    fenced: list[str] = field(default_factory=list)  # what fenced-off attempts were answered (JSON, newest last)


def check_inbox(job: Job, commit: Commit) -> None:
    """A commit that ends the run is refused while messages it does not take wait (under the commit's lock)."""
    if commit.ends_run and len(job.inbox) > commit.take_inbox:
        raise InboxNotEmptyError(
            f"job {commit.job_id!r}: {len(job.inbox) - commit.take_inbox} message(s) sent to it wait in its inbox; "
            "the run does not end past them", waiting=len(job.inbox))
