"""What :class:`~adapters.memory.MemoryStorage` holds for one job (its record, transcript, streams, lease), and the
checks on it that the storage's reads and commits share."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.memory.history import NO_HISTORY, StoredHistory, check_since, dump_apart
from pipelines.engine.errors import InboxNotEmptyError, InvalidInputError
from pipelines.engine.events import check_cursor
from pipelines.engine.models import Commit, JobRecord, Usage, dump_record_apart

__all__ = ["Job", "check_inbox", "checked_record", "position"]


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
    # The record's JSON text without its turn history, which is kept apart (adapters.memory.history); None
    # until something reads it after a commit, which keeps the record it committed (``stored``) instead.
    text: str | None
    history: StoredHistory = NO_HISTORY
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
    # Leases that ran out and were taken over (a worker lost mid-turn), counted at version ``lapsed_at``: a
    # commit moves the version on, which starts the count again (``JobRecord.interrupted``).
    lapses: int = 0
    lapsed_at: int = -1
    # The record the last commit stored, as its JSON reads back (nothing kept beside it): what the next
    # lease hands the engine as it is, unparsed. Its fields were checked when they were stored, and no
    # object a record holds is changed afterwards (the engine builds each record anew, a phase gets a copy
    # of its state), so it stays what its text would read.
    stored: JobRecord | None = None

    @property
    def interrupted(self) -> int:
        """How many times in a row the turn at this version lost its lease without committing."""
        return self.lapses if self.lapsed_at == self.version else 0

    def lease_lapsed(self) -> None:
        """A lease that ran out is taken over: one more interruption of the turn at this version."""
        self.lapses, self.lapsed_at = self.interrupted + 1, self.version

    @property
    def record(self) -> str:
        """The record's JSON text without its history, written when first read after a commit."""
        if self.text is None:
            assert self.stored is not None
            self.text = dump_record_apart(self.stored, f"the record of job {self.stored.job_id!r}")
        return self.text

    @record.setter
    def record(self, text: str) -> None:
        # A record written as text (by a test, say, as other software would): its object goes with the old text.
        self.text = text
        self.stored = None


def check_inbox(job: Job, commit: Commit) -> None:
    """A commit that ends the run is refused while messages it does not take wait (under the commit's lock)."""
    if commit.ends_run and len(job.inbox) > commit.take_inbox:
        raise InboxNotEmptyError(
            f"job {commit.job_id!r}: {len(job.inbox) - commit.take_inbox} message(s) sent to it wait in its inbox; "
            "the run does not end past them", waiting=len(job.inbox))


def checked_record(record: JobRecord, stored: Job | None) -> tuple[str | None, StoredHistory, int]:
    """What a commit of ``record`` stores of it: its text (``None``: kept as the object), history and bytes.

    ``stored``: the job as held now, read without the storage's lock (if another commit lands meanwhile,
    this one is refused anyway). The fields of the record it keeps (the very objects) were checked when
    they were stored; only the others are checked here.
    """
    held = NO_HISTORY if stored is None else stored.history
    what = f"the record of job {record.job_id!r}"
    if stored is not None and stored.stored is not None:
        history, added = check_since(record, held, stored.stored, what)
        return None, history, added
    text, history, added = dump_apart(record, held, what)
    return text, history, added + len(text)
