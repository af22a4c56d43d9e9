"""The write transactions of an SQLite storage, each run inside one ``BEGIN IMMEDIATE`` (see ``Database.write``).

Each function gets the connection with the write lock already held and the
values already serialised (what JSON cannot carry failed before the
transaction began, so nothing is half-written). They raise the engine's
errors; the transaction is rolled back by the caller when they do.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from adapters.base import INBOX_OPEN
from pipelines.engine.errors import InboxNotEmptyError, JobConflictError, StaleVersionError
from pipelines.engine.models import Commit, CommitReply, JobRecord, JobStatus, first_run_start

__all__ = ["JOB_TABLES", "Texts", "append", "apply_commit", "apply_create", "claim_due", "delete", "expire_live",
           "fence", "index_columns", "record_step", "send"]

JOB_TABLES = ("messages", "logs", "inbox", "journal", "parts", "fenced")
"""The tables whose rows a job owns beside its row in ``jobs``: they live and die with it."""
_FINISHED = (JobStatus.COMPLETE, JobStatus.ERROR, JobStatus.CANCELLED)


@dataclass(frozen=True)
class Texts:
    """A write's values as the JSON text stored: the record, messages, log lines, events."""

    record: str
    messages: Sequence[str] = ()
    logs: Sequence[str] = ()
    events: Sequence[str] = ()


def index_columns(record: JobRecord) -> tuple[str, float, float | None, float | None]:
    """``(status, updated_at, due_at, finished_at)``: the index columns that move with the record."""
    cp = record.checkpoint
    due = cp.due_at if record.status is JobStatus.RUNNING and cp is not None else None
    finished = record.updated_at if record.status in _FINISHED else None
    return record.status.value, record.updated_at, due, finished


def _top(conn: sqlite3.Connection, table: str, job_id: str) -> int | None:
    # table is one of this module's constants, never caller input.
    top: int | None = conn.execute(f"SELECT max(pos) FROM {table} WHERE job_id = ?", (job_id,)).fetchone()[0]
    return top


def _insert(conn: sqlite3.Connection, table: str, job_id: str, lines: Sequence[str], top: int | None) -> None:
    """Insert ``lines`` into the job's list in ``table`` after position ``top`` (``None``: the list is empty)."""
    if lines:
        first = 0 if top is None else int(top) + 1
        conn.executemany(f"INSERT INTO {table} (job_id, pos, body) VALUES (?, ?, ?)",
                         [(job_id, first + i, line) for i, line in enumerate(lines)])


def append(conn: sqlite3.Connection, table: str, job_id: str, lines: Sequence[str]) -> None:
    """Append ``lines`` to the job's list in ``table`` (messages, logs, inbox, fenced), after its last position."""
    if lines:
        _insert(conn, table, job_id, lines, _top(conn, table, job_id))


def _first_part_id() -> int:
    """The id of a job's first part: the wall clock in microseconds (above what a job deleted before gave out)."""
    return time.time_ns() // 1000


def add_parts(conn: sqlite3.Connection, job_id: str, lines: Sequence[str], *, durable: bool) -> int:
    """Append parts to the job's live stream (``durable``: committed events); the last one's number (0: none)."""
    if not lines:
        return 0
    top = conn.execute("SELECT max(seq) FROM parts WHERE job_id = ?", (job_id,)).fetchone()[0]
    return _insert_parts(conn, job_id, lines, top, durable=durable)


def _insert_parts(conn: sqlite3.Connection, job_id: str, lines: Sequence[str], top: int | None, *,
                  durable: bool) -> int:
    # A job's first part is numbered by the clock (microseconds), not 1: a job made again under a deleted one's
    # id goes on above every id the deleted one gave out, so a reader's cursor from it skips nothing new (Redis
    # stream ids are times too). Later parts count on from it.
    first = _first_part_id() if top is None else int(top) + 1
    conn.executemany("INSERT INTO parts (job_id, seq, durable, body) VALUES (?, ?, ?, ?)",
                     [(job_id, first + i, int(durable), line) for i, line in enumerate(lines)])
    return first + len(lines) - 1


def _inbox_count(conn: sqlite3.Connection, job_id: str) -> int:
    return int(conn.execute("SELECT count(*) FROM inbox WHERE job_id = ?", (job_id,)).fetchone()[0])


def apply_create(conn: sqlite3.Connection, record: JobRecord, texts: Texts) -> None:
    """Insert a new job with its first messages, logs and events; ``JobConflictError`` if the id is taken."""
    job_id = record.job_id
    if conn.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None:
        raise JobConflictError(f"job {job_id!r} already exists")
    for table in JOB_TABLES:  # nothing of an earlier job of this id may leak into the new one
        conn.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
    status, updated, due, finished = index_columns(record)
    conn.execute("INSERT INTO jobs (job_id, record, version, status, updated_at, due_at, finished_at, pipeline) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 (job_id, texts.record, record.version, status, updated, due, finished, record.pipeline))
    append(conn, "messages", job_id, texts.messages)
    append(conn, "logs", job_id, texts.logs)
    add_parts(conn, job_id, texts.events, durable=True)


def fence(row: Sequence[object] | None, job_id: str, *, version: int, owner: str | None, now: float,
          what: str, proc: str | None = None) -> None:
    """Raise :class:`StaleVersionError` unless the row ``(version, lease_owner, lease_expires, lease_proc)`` is
    at ``version`` and, when ``owner`` is given, that owner's lease is live.

    A lease of this process ``proc`` that ran out and that nobody took counts as live: the process stood still
    or the clock stepped (see :func:`claim_due`), and no other worker can have written since (a take names its
    own owner)."""
    if row is None:
        raise StaleVersionError(f"job {job_id!r} no longer exists; {what}")
    stored, holder, expires, holder_proc = row
    if stored != version:
        raise StaleVersionError(f"job {job_id!r} is at version {stored}; {what}")
    if owner is None:
        return
    mine = proc is not None and holder_proc == proc
    live = holder is not None and (mine or (isinstance(expires, float | int) and expires > now))
    if not live:
        raise StaleVersionError(f"job {job_id!r}: no worker holds its lease (this worker's lease expired); {what}")
    if holder != owner:
        raise StaleVersionError(f"job {job_id!r} is leased by another worker; {what}")


# What a commit reads before it writes, in one statement: the fence (version, token, lease), the control
# request, the inbox's length, the live-stream cut, and where the transcript and the live stream end.
_COMMIT_READ = ("SELECT version, token, lease_owner, lease_expires, control, "
                "(SELECT count(*) FROM inbox WHERE inbox.job_id = jobs.job_id), live_cut, "
                "(SELECT max(pos) FROM messages WHERE messages.job_id = jobs.job_id), "
                "(SELECT max(seq) FROM parts WHERE parts.job_id = jobs.job_id), lease_proc FROM jobs WHERE job_id = ?")


def apply_commit(conn: sqlite3.Connection, commit: Commit, texts: Texts, now: float,
                 proc: str | None = None) -> CommitReply:
    """Apply ``commit`` if the job is at its expected version (and lease; ``proc``: this process, see
    :func:`fence`); see the storage contract."""
    job_id = commit.job_id
    row = conn.execute(_COMMIT_READ, (job_id,)).fetchone()
    if row is not None and row[1] == commit.token and row[0] == commit.record.version:
        return CommitReply(row[4], int(row[5]))  # applied already: a retry of the same commit
    fence(None if row is None else (row[0], row[2], row[3], row[9]), job_id, version=commit.expected_version,
          owner=commit.owner, now=now, what=f"commit expected {commit.expected_version}", proc=proc)
    assert row is not None
    waiting = int(row[5])
    if commit.ends_run and waiting > commit.take_inbox:
        raise InboxNotEmptyError(
            f"job {job_id!r}: {waiting - commit.take_inbox} message(s) sent to it wait in its inbox; "
            "the run does not end past them", waiting=waiting)
    top = row[7]
    if commit.truncate_messages_to is not None:
        conn.execute("DELETE FROM messages WHERE job_id = ? AND pos >= ?", (job_id, commit.truncate_messages_to))
        top = _top(conn, "messages", job_id)  # rare (a rewind): read again rather than work it out
    _insert(conn, "messages", job_id, texts.messages, top)
    append(conn, "logs", job_id, texts.logs)
    cut = _commit_events(conn, job_id, texts.events, row[8], first_run_start(commit.events), row[6])
    status, updated, due, finished = index_columns(commit.record)
    release = commit.release_lease and commit.owner is not None
    conn.execute(
        "UPDATE jobs SET record = ?, version = ?, token = ?, status = ?, updated_at = ?, due_at = ?, finished_at = ?, "
        "claim_until = 0, journal_version = ?, live_cut = ?, "
        # Let go, or lapsed before this commit (a retry, a forced cancel): not the next turn's interruption. Kept
        # by its own holder in this process (fenced as live above) it stays, for the lease keeper to renew.
        "lease_owner = CASE WHEN ? OR (lease_expires <= ? AND NOT (lease_owner IS ? AND lease_proc IS ?)) "
        "THEN NULL ELSE lease_owner END, "
        "control = CASE WHEN ? THEN NULL ELSE control END, pipeline = ? WHERE job_id = ?",
        (texts.record, commit.record.version, commit.token, status, updated, due, finished, commit.record.version,
         cut, release, now, commit.owner, proc if commit.owner is not None else None, commit.clear_control,
         commit.record.pipeline, job_id))
    if not commit.keep_journal:
        conn.execute("DELETE FROM journal WHERE job_id = ?", (job_id,))
    if commit.take_inbox > 0:
        conn.execute("DELETE FROM inbox WHERE job_id = ? AND pos IN "
                     "(SELECT pos FROM inbox WHERE job_id = ? ORDER BY pos LIMIT ?)",
                     (job_id, job_id, commit.take_inbox))
    return CommitReply(None if commit.clear_control else row[4], max(0, waiting - commit.take_inbox))


def _commit_events(conn: sqlite3.Connection, job_id: str, lines: Sequence[str], top: int | None,
                   run_start: int | None, cut: int) -> int:
    """Append a commit's events after part ``top``; where the run in flight starts, as the commit leaves it.

    The live stream keeps the run in flight and the one before, not the job's whole life: a commit
    that starts a run (its ``run_start``-th event, 0-based) drops the live parts before the previous
    run's start (``cut``). A client resuming a run's message from a cursor is sent what it misses
    after rebuilding what it holds from every part of that run before the cursor
    (``pipelines.web.sse``); the run before stays for a client still resuming it when the next one
    starts. A reader behind the cut reads the committed events there instead (the transcript holds
    the text those parts carried); a finished job's are dropped after ``live_ttl``
    (:func:`expire_live`).
    """
    if not lines:
        return cut
    first = _insert_parts(conn, job_id, lines, top, durable=True) - len(lines) + 1
    if run_start is None:
        return cut
    if cut:
        conn.execute("DELETE FROM parts WHERE job_id = ? AND durable = 0 AND seq < ?", (job_id, cut))
    return first + run_start


def expire_live(conn: sqlite3.Connection, *, after: tuple[float, str], upto: float,
                limit: int) -> tuple[float, str]:
    """Drop the live parts (not the events) of up to ``limit`` jobs finished after ``after`` (a finish time and a
    job id, in the finished index's order) and by ``upto``, oldest first.

    What Redis's ``live_ttl`` does for a finished job's stream. Returns where the next call starts
    (``after`` itself when no job was left).
    """
    rows = conn.execute("SELECT finished_at, job_id FROM jobs WHERE (finished_at, job_id) > (?, ?) "
                        "AND finished_at <= ? ORDER BY finished_at, job_id LIMIT ?", (*after, upto, limit)).fetchall()
    conn.executemany("DELETE FROM parts WHERE job_id = ? AND durable = 0", [(job_id,) for _, job_id in rows])
    return (float(rows[-1][0]), str(rows[-1][1])) if rows else after


def record_step(conn: sqlite3.Connection, job_id: str, *, version: int, owner: str | None, key: str, text: str,
                now: float, proc: str | None = None) -> None:
    """Journal one step result under ``version``, fenced like a commit."""
    # The usual case in one statement: the job is at the version, its journal already holds this
    # version's steps (a commit leaves it at the version it wrote) and the lease is the owner's.
    if conn.execute(
            "INSERT OR REPLACE INTO journal (job_id, key, body) SELECT job_id, ?, ? FROM jobs WHERE job_id = ? "
            "AND version = ? AND journal_version = ? AND (? IS NULL OR (lease_owner = ? "
            "AND (lease_expires > ? OR lease_proc IS ?)))",
            (key, text, job_id, version, version, owner, owner, now, proc)).rowcount == 1:
        return
    row = conn.execute("SELECT version, lease_owner, lease_expires, lease_proc, journal_version FROM jobs "
                       "WHERE job_id = ?", (job_id,)).fetchone()
    fence(None if row is None else row[:4], job_id, version=version, owner=owner, now=now,
          what=f"step {key!r} at version {version} not recorded", proc=proc)
    assert row is not None
    if row[4] != version:  # the first step of this version: the journal of an older one goes
        conn.execute("DELETE FROM journal WHERE job_id = ?", (job_id,))
        conn.execute("UPDATE jobs SET journal_version = ? WHERE job_id = ?", (version, job_id))
    conn.execute("INSERT OR REPLACE INTO journal (job_id, key, body) VALUES (?, ?, ?)", (job_id, key, text))


def send(conn: sqlite3.Connection, job_id: str, lines: Sequence[str]) -> int | None:
    """Append to the inbox if the job's status (read in this transaction) takes messages; its new length."""
    row = conn.execute("SELECT status FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return None
    if row[0] not in {s.value for s in INBOX_OPEN}:
        raise JobConflictError(f"job {job_id!r} is {row[0]}: its inbox takes no messages (nothing appended)")
    append(conn, "inbox", job_id, lines)
    return _inbox_count(conn, job_id)


def delete(conn: sqlite3.Connection, job_id: str, if_version: int | None) -> bool:
    """Remove the job and every row it owns; with ``if_version``, only at that version."""
    row = conn.execute("SELECT version FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    if row is not None and if_version is not None and row[0] != if_version:
        raise StaleVersionError(f"job {job_id!r} is at version {row[0]}; delete expected {if_version}")
    for table in JOB_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
    # Its places in concurrency keys' lines (adapters.sqlite.flow): a deleted job asks no more, and would hold
    # the jobs behind it back until its place lapsed. One scan of the live rows: no index by member.
    conn.execute("DELETE FROM flow_slots WHERE member IN (?, ?)", ("?" + job_id, "!" + job_id))
    conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
    return row is not None


def claim_due(conn: sqlite3.Connection, *, cut: float, now: float, hold: float, limit: int,
              proc: str, pipelines: Collection[str] | None = None, held: Collection[str] = ()) -> list[str]:
    """Claim up to ``limit`` running jobs due at ``cut``, not leased and not claimed: one ``UPDATE ... RETURNING``.

    A claim keeps other claimers (threads, processes) off the job for
    ``hold`` seconds; the job's next commit clears it, and the claim of a
    process ``proc`` that died is released by the next process that notices.
    ``pipelines``: only jobs of these (``None``: any). Another App on the same
    file may run pipelines this one does not: its jobs are left to it, not
    held for ``hold`` seconds by a process that can only refuse them.

    A lease this very process holds (``lease_proc`` is ``proc`` and its owner is
    one of ``held``) is never taken, even run out: a worker thread of this live
    process runs the turn, and its lease ran out only because the whole process stood still
    (Ctrl-Z, a laptop asleep) or the wall clock stepped forward. Its lease
    keeper renews it when the process runs again (``SQLiteStorage.renew_lease``); claiming it
    would start the turn's tools a second time beside the first run.
    """
    # By the pipeline column (schema 3), not the record's JSON, read from the due index (jobs_due_pipeline):
    # another App's due jobs are passed over without reading their rows, and the walk in due order stops at
    # ``limit``. A record that is not JSON has no pipeline: it is claimed whatever its pipeline (its advance
    # says what is wrong).
    only = ("AND (pipeline IS NULL OR pipeline IN (SELECT value FROM json_each(:names))) "
            if pipelines is not None else "")
    sql = ("UPDATE jobs SET claim_until = :until, claim_proc = :proc WHERE job_id IN (SELECT job_id FROM jobs "
           "INDEXED BY jobs_due_pipeline WHERE due_at IS NOT NULL AND due_at <= :cut AND claim_until <= :now "
           "AND (lease_owner IS NULL OR (lease_expires <= :now AND (lease_proc IS NOT :proc "
           "OR lease_owner NOT IN (SELECT value FROM json_each(:held))))) "
           f"{only}ORDER BY due_at, job_id LIMIT :count) "
           "RETURNING job_id, due_at")
    rows = conn.execute(sql, {"until": now + hold, "proc": proc, "cut": cut, "now": now, "held": json.dumps(held),
                              "names": json.dumps(sorted(pipelines or ())), "count": max(0, min(limit, 1 << 31))}
                        ).fetchall()
    return [job_id for job_id, _ in sorted(rows, key=lambda r: (r[1], r[0]))]
