"""The tables of an SQLite storage file, their version, and upgrading them.

The schema's version is kept in the file (``PRAGMA user_version``). A library
opens a file at its own version only: a newer file (written by a newer
phaserunner) is refused, since an older library could misread or damage
what it does not know; an older one is refused with the command that
upgrades it (``pipelines migrate --app M:A``, or :func:`migrate`). An empty
file gets the current schema.

Layout (one row per job in ``jobs``; what a job owns is keyed by its id):

* ``jobs``: the record as JSON, with the columns the engine filters on beside
  it (version, commit token, status, ``updated_at``, due time, finish time,
  lease (and the process holding it), journal version, pending control
  request, dropped usage, the live-stream cut and the due-work claim).
* ``messages``, ``logs``, ``inbox``: append-only lists by position.
* ``journal``: step results of the current turn.
* ``parts``: the live stream; committed events are its ``durable`` rows, so
  an event's id and its live part's id are one number (the cursor).
* ``flow_buckets``, ``flow_slots``: flow control (rate buckets, slots).
* ``processes``: which processes opened the file (see :mod:`adapters.sqlite.processes`).
* ``fenced`` (version 2): what the model answered attempts that were fenced
  off before they could commit, the newest few of a job, by position.
* ``jobs.lapses``, ``jobs.lapsed_at`` (version 3): the leases that ran out and
  were taken over since the job's last commit (``JobRecord.interrupted``);
  ``jobs.pipeline`` (version 3): the record's pipeline, which claims filter by.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from pipelines.engine.errors import ConfigurationError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "check_schema", "check_version", "migrate", "refuse_foreign"]

# ``jobs.live_cut``: where the job's run in flight starts in its live stream (``parts``); the commit that
# starts the next run drops the live parts before it (adapters.sqlite.writes). Until 2026-12-05 it was
# the last event of the last commit, where the next one cut: the live stream kept only a turn.
_V1 = [
    """CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY NOT NULL,
        record TEXT NOT NULL,
        version INTEGER NOT NULL,
        token TEXT NOT NULL DEFAULT '',
        status TEXT NOT NULL,
        updated_at REAL NOT NULL,
        due_at REAL,
        finished_at REAL,
        claim_until REAL NOT NULL DEFAULT 0,
        claim_proc TEXT,
        lease_owner TEXT,
        lease_expires REAL NOT NULL DEFAULT 0,
        lease_proc TEXT,
        journal_version INTEGER NOT NULL DEFAULT -1,
        control TEXT,
        dropped TEXT,
        dropped_token TEXT NOT NULL DEFAULT '',
        live_cut INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID""",
    "CREATE INDEX jobs_due ON jobs (due_at, job_id) WHERE due_at IS NOT NULL",
    "CREATE INDEX jobs_finished ON jobs (finished_at, job_id) WHERE finished_at IS NOT NULL",
    "CREATE INDEX jobs_updated ON jobs (updated_at, job_id)",
    "CREATE INDEX jobs_status ON jobs (status, updated_at, job_id)",
    "CREATE TABLE messages (job_id TEXT NOT NULL, pos INTEGER NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, pos)) WITHOUT ROWID",
    "CREATE TABLE logs (job_id TEXT NOT NULL, pos INTEGER NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, pos)) WITHOUT ROWID",
    "CREATE TABLE inbox (job_id TEXT NOT NULL, pos INTEGER NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, pos)) WITHOUT ROWID",
    "CREATE TABLE journal (job_id TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, key)) WITHOUT ROWID",
    "CREATE TABLE parts (job_id TEXT NOT NULL, seq INTEGER NOT NULL, durable INTEGER NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, seq)) WITHOUT ROWID",
    "CREATE TABLE flow_buckets (model TEXT PRIMARY KEY NOT NULL, requests REAL, tokens REAL, ts REAL, "
    "blocked_until REAL NOT NULL DEFAULT 0) WITHOUT ROWID",
    "CREATE TABLE flow_slots (key TEXT NOT NULL, member TEXT NOT NULL, expires REAL NOT NULL, "
    "PRIMARY KEY (key, member)) WITHOUT ROWID",
    "CREATE TABLE processes (machine TEXT NOT NULL, pid INTEGER NOT NULL, seen REAL NOT NULL, "
    "PRIMARY KEY (machine, pid)) WITHOUT ROWID",
]

_V2 = [
    "CREATE TABLE fenced (job_id TEXT NOT NULL, pos INTEGER NOT NULL, body TEXT NOT NULL, "
    "PRIMARY KEY (job_id, pos)) WITHOUT ROWID",
]

# ``jobs.lapses``: how many leases that ran out were taken over at version ``lapsed_at``, none committing (the
# record's ``interrupted``: the runner fails a job whose turn keeps killing its workers); a commit moves the
# version on, which starts the count again.
# ``jobs.pipeline``: the record's pipeline (``default`` where the record leaves it out), which a local scheduler
# claims by (``claim_due(pipelines=...)``) without parsing each due record's JSON; NULL for a record that is
# not JSON (claimed by any App, whose advance says what is wrong).
_V3 = [
    "ALTER TABLE jobs ADD COLUMN lapses INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE jobs ADD COLUMN lapsed_at INTEGER NOT NULL DEFAULT -1",
    "ALTER TABLE jobs ADD COLUMN pipeline TEXT",
    "UPDATE jobs SET pipeline = CASE WHEN json_valid(record) THEN coalesce(json_extract(record, '$.pipeline'), "
    "'default') END",
    # The due order with each job's pipeline beside it: a claim by pipeline passes over another App's due jobs
    # in the index, without reading their rows (a row's columns after its record sit on the record's overflow
    # pages), and stops at its limit.
    "CREATE INDEX jobs_due_pipeline ON jobs (due_at, job_id, pipeline, claim_until, lease_owner, lease_expires) "
    "WHERE due_at IS NOT NULL",
]

MIGRATIONS: dict[int, list[str]] = {1: _V1, 2: _V2, 3: _V3}
"""The statements that take a file from version ``n - 1`` to ``n``, for each ``n``."""
SCHEMA_VERSION = 3
"""The version this library reads and writes."""


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _foreign_tables(conn: sqlite3.Connection) -> bool:
    return int(conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]) > 0


def refuse_foreign(conn: sqlite3.Connection, path: str) -> int:
    """The file's schema version (0: none yet), reading only; refused if this library must not touch the file
    (another program's database, a newer schema)."""
    # One statement, so one snapshot: read apart (outside a transaction), a process creating the schema
    # between the two reads showed its tables without its version: "another program's database".
    found, tables = conn.execute("SELECT (SELECT user_version FROM pragma_user_version), "
                                 "(SELECT count(*) FROM sqlite_master WHERE type = 'table')").fetchone()
    if int(found) == 0 and int(tables) > 0:
        raise ConfigurationError(f"{path} holds tables but no phaserunner schema: it is another program's "
                                 "database; give SQLiteStorage a file of its own")
    if int(found) > SCHEMA_VERSION:
        raise ConfigurationError(
            f"{path} has schema version {found}, written by a newer phaserunner; this one reads version "
            f"{SCHEMA_VERSION}. Upgrade phaserunner (pip install -U phaserunner); nothing was changed")
    return int(found)


def check_schema(conn: sqlite3.Connection, path: str) -> None:
    """Make sure ``conn``'s file holds this library's schema: create it in an empty file, refuse any other."""
    found = refuse_foreign(conn, path)
    if found == 0:
        conn.execute("BEGIN IMMEDIATE")  # two processes opening a new file: one creates, the other sees it
        try:
            found = refuse_foreign(conn, path)  # again, under the lock: another process may have written meanwhile
            if found == 0:
                _apply(conn, 0, SCHEMA_VERSION)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    if 0 < found < SCHEMA_VERSION:
        raise ConfigurationError(
            f"{path} has schema version {found}; this phaserunner needs version {SCHEMA_VERSION}. Run "
            "`pipelines migrate --app package.module:app` (stop the workers first); nothing was changed")


def check_version(conn: sqlite3.Connection, path: str) -> None:
    """Inside a write transaction: the file is still at this library's version (no newer process migrated it
    since this connection was checked); else :class:`ConfigurationError` and the write is rolled back."""
    found = _user_version(conn)
    if found != SCHEMA_VERSION:
        raise ConfigurationError(f"{path} is at schema version {found} now, and this phaserunner writes version "
                                 f"{SCHEMA_VERSION} (was the file migrated while this process ran?): restart it "
                                 "with a phaserunner of the file's version; nothing was written")


def _apply(conn: sqlite3.Connection, start: int, stop: int) -> None:
    """Run the migrations from ``start`` to ``stop`` inside the caller's transaction."""
    for version in range(start + 1, stop + 1):
        for statement in MIGRATIONS[version]:
            conn.execute(statement)
        # PRAGMA takes no parameters; the version is an int from this module.
        conn.execute(f"PRAGMA user_version = {int(version)}")


def migrate(conn: sqlite3.Connection, path: str,
            check: Callable[[sqlite3.Connection], None] | None = None) -> tuple[int, int]:
    """Upgrade ``conn``'s file to :data:`SCHEMA_VERSION` in one transaction; ``(from, to)`` versions.

    A file already at the version is left alone; a newer one is refused. ``check(conn)`` runs first inside the
    transaction (a refusal raised there changes nothing).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _user_version(conn)
        if check is not None and found < SCHEMA_VERSION:
            check(conn)
        if found > SCHEMA_VERSION:
            raise ConfigurationError(f"{path} has schema version {found}, newer than this phaserunner's "
                                     f"{SCHEMA_VERSION}: upgrade phaserunner instead; nothing was changed")
        if found == 0 and _foreign_tables(conn):
            raise ConfigurationError(f"{path} holds tables but no phaserunner schema; nothing was changed")
        _apply(conn, found, SCHEMA_VERSION)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return found, SCHEMA_VERSION
