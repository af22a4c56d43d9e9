"""The building blocks every transition is made of, and the status sets and history bounds they share.

A record moved one version on (:func:`_moved`), the :class:`Commit` around it (:func:`_commit`), a fresh
checkpoint with a new transcript epoch (:func:`_fresh`), this turn's mark in the record's history
(:func:`_marked`). Nothing here reads storage or the clock.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pydantic_core import from_json

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import (
    FINISHED_STATUSES,
    Checkpoint,
    Commit,
    Event,
    JobRecord,
    JobStatus,
    LogEntry,
    LogLevel,
    Message,
    TurnMark,
    dump_json,
)

__all__ = ["ACTIVE", "CHILDREN", "FINAL", "FINISHED", "HISTORY_BYTES", "HISTORY_LIMIT"]

ACTIVE = (JobStatus.RUNNING, JobStatus.WAITING, JobStatus.PAUSED)
"""Statuses a restart must not touch: wait for the job, or cancel it first."""
FINAL = (JobStatus.COMPLETE, JobStatus.CANCELLED)
"""Statuses nothing but an explicit restart leaves."""
FINISHED = FINISHED_STATUSES
"""Statuses retention and ``delete`` may remove: no turn runs and no person is asked anything."""

CHILDREN = "children"
"""``record.waiting["kind"]`` of a job waiting for child jobs (see :mod:`pipelines.engine.children`)."""

HISTORY_LIMIT = 50
"""How many turns' checkpoints a record keeps (its ``history``): a fork can start at any of them."""
HISTORY_BYTES = 256 * 1024
"""At most this much state JSON in a record's history: older turns are dropped first (a large state
keeps fewer turns; a state larger than this keeps none), so the record stays far below the size limit."""


_Checkpoint = Checkpoint[Any]  # resolved once: indexing the generic costs a cache lookup per call


def _log(now: float, phase: str | None, message: str, level: LogLevel = "info") -> LogEntry:
    return LogEntry(timestamp=now, phase=phase, level=level, message=message)


def _phase_of(rec: JobRecord) -> str | None:
    return rec.checkpoint.next_phase if rec.checkpoint is not None else None


def _moved(rec: JobRecord, token: str, now: float, cp: Checkpoint[Any] | None, *, stamped: bool = False,
           **fields: Any) -> JobRecord:
    """``rec`` one version on, with ``cp`` stamped by this commit's token (``stamped``: built so already).

    A commit starts the count of the turn's interruptions again (``interrupted``: 0, as storage then holds it).
    """
    if cp is not None and not stamped:
        cp = cp.model_copy(update={"commit_id": token, "updated_at": now, "journal": {}})
    return rec.model_copy(update={**fields, "checkpoint": cp, "version": rec.version + 1, "updated_at": now,
                                  "interrupted": 0})


def _commit(rec: JobRecord, new: JobRecord, token: str, *, owner: str | None = None,
            logs: Sequence[LogEntry] = (), events: Sequence[Event] = (), messages: Sequence[Message] = (),
            keep_journal: bool = True, release_lease: bool = True, truncate_to: int | None = None,
            clear_control: bool = False, take_inbox: int = 0) -> Commit:
    if clear_control:
        new = new.model_copy(update={"control": None})  # the record returned says what storage now holds
    if truncate_to is not None and new.checkpoint is not None:
        # Whatever a worker holds of the transcript may be gone: it must not read on from it.
        new = new.model_copy(update={"checkpoint": new.checkpoint.model_copy(
            update={"transcript_epoch": _new_epoch()})})
    return Commit(job_id=rec.job_id, expected_version=rec.version, owner=owner, token=token, record=new,
                  append_messages=list(messages), truncate_messages_to=truncate_to, logs=list(logs),
                  events=list(events), keep_journal=keep_journal, release_lease=release_lease,
                  clear_control=clear_control, take_inbox=take_inbox)


def _new_epoch() -> str:
    """A transcript epoch (``Checkpoint.transcript_epoch``): random, so a job re-created under the same id
    never gets its predecessor's, whichever process creates it."""
    return os.urandom(8).hex()


def _fresh(phase: str, state: Any, now: float) -> Checkpoint[Any]:
    # A new epoch: a fresh checkpoint starts a job, a fork, a continued run or a truncating retry.
    return _Checkpoint(next_phase=phase, state=state, due_at=now, created_at=now, updated_at=now,
                       transcript_epoch=_new_epoch())


def _running() -> dict[str, Any]:
    return {"status": JobStatus.RUNNING, "error": None, "waiting": None, "stop_reason": None}


def _marked(history: Sequence[TurnMark], *, phases_done: int, transcript_len: int, next_phase: str | None,
            state: Any, code_version: str | None = None) -> list[TurnMark]:
    """``history`` with this turn's checkpoint appended, cut to the newest that fit both bounds."""
    try:
        text = dump_json(state, "state")
    except (InvalidInputError, ValueError):
        return list(history)  # the commit itself refuses this state and says why; no mark for it
    # The mark keeps its own copy, read back from its JSON: the phase's state object lives on (the
    # next turn's ctx.state, under continue_for), and changing it in place must not change this turn's mark.
    kept = [*history, TurnMark(phases_done=phases_done, transcript_len=transcript_len, next_phase=next_phase,
                               state=from_json(text), size=len(text) if text.isascii() else len(text.encode()),
                               code_version=code_version)][-HISTORY_LIMIT:]
    total = sum(m.size for m in kept)
    while kept and total > HISTORY_BYTES:
        total -= kept.pop(0).size
    return kept
