"""``SQLiteStorage``: the durable embedded storage, one file on a local disk, shared by threads and processes.

::

    storage = SQLiteStorage("app.db")                     # or SQLiteStorage.from_url("sqlite:///app.db")
    app = App(storage=storage, scheduler=LocalScheduler(workers=4))

Every write is one ``BEGIN IMMEDIATE`` transaction: a turn's commit applies
record, transcript appends, logs, events, journal clear, due, finished and
listing indexes, inbox take and control request together, only if the
stored version (and, for a worker, its lease) is the one the turn read; the
model and tool calls of a turn happen between transactions, never inside
one. See :mod:`adapters.sqlite.connection` for the file's settings (WAL,
``synchronous``, busy timeout, retries) and :mod:`adapters.sqlite.schema`
for its tables and version.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar
from urllib.parse import quote, unquote, urlsplit

from adapters.base import FENCED_KEPT, Feature
from adapters.sqlite import processes, schema, writes
from adapters.sqlite.connection import Database, is_busy
from adapters.sqlite.history import Histories
from adapters.sqlite.reads import RECORD_COLUMNS, SQLiteReads, load_record
from adapters.sqlite.wakeup import wakeup_for
from adapters.sqlite.writes import Texts
from pipelines.engine.errors import ConfigurationError, InvalidInputError
from pipelines.engine.models import (
    Commit,
    CommitReply,
    Event,
    JobRecord,
    JSONValue,
    LogEntry,
    Message,
    Usage,
    check_messages,
    dump_events,
    dump_json,
    dump_logs,
    validate_job_id,
)

__all__ = ["SQLiteStorage"]

_EXPIRE_BATCH = 200  # finished jobs whose live parts one sweep drops: a short write, whatever the file holds

# A lease that ran out (its owner kept past its expiry, or reaped from a dead process) taken over is one more
# interruption of the turn at this version (JobRecord.interrupted); a commit moves the version on.
_LAPSED = "lease_owner IS NOT NULL AND lease_expires <= :now"
_TAKE_LEASE = ("UPDATE jobs SET lease_owner = :owner, lease_expires = :until, lease_proc = :proc, "
               f"lapses = CASE WHEN NOT ({_LAPSED}) THEN lapses WHEN lapsed_at = version THEN lapses + 1 ELSE 1 END, "
               f"lapsed_at = CASE WHEN {_LAPSED} THEN version ELSE lapsed_at END WHERE job_id = :job "
               f"AND (lease_owner IS NULL OR lease_expires <= :now OR lease_owner = :owner) RETURNING {RECORD_COLUMNS}")


class SQLiteStorage(SQLiteReads):
    """The :class:`~adapters.base.Storage` port on one SQLite file (see the module docstring).

    ``synchronous``: ``"FULL"`` (default: a returned commit survives a power
    cut) or ``"NORMAL"`` (survives a process crash, may lose the last commits
    on power loss). ``busy_timeout``: seconds a write waits for another's
    transaction before the adapter retries it. ``clock``: the lease clock
    (wall time, shared by every process on the file). ``live_ttl``: how long
    a finished job keeps the live parts of its last runs (text deltas; its
    events stay with the job), as on Redis: dropped by the local scheduler's
    sweep (:meth:`reap_dead_processes`), a batch at a time.
    """

    #: What it can do beyond the port, declared once (the contract suite checks it against the methods).
    features: ClassVar[frozenset[Feature]] = frozenset({
        Feature.STEP_AND_PUBLISH, Feature.ASYNC_LIVE, Feature.COUNTS, Feature.RETENTION, Feature.FLOW,
        Feature.RECENT, Feature.SCHEMA, Feature.CLAIMS, Feature.LEASE_HISTORY, Feature.FENCED_ANSWERS})

    def __init__(self, path: str, *, synchronous: str = "FULL", busy_timeout: float = 30.0,
                 clock: Callable[[], float] | None = None, live_ttl: float = 3600.0) -> None:
        if isinstance(live_ttl, bool) or not isinstance(live_ttl, int | float) or not 0 < live_ttl < math.inf:
            raise ConfigurationError(f"live_ttl must be a finite number of seconds > 0, got {live_ttl!r}")
        self.live_ttl = float(live_ttl)
        self._expired: tuple[float, str] = (0.0, "")  # where the next expiry of finished jobs' live parts starts
        self._clock = clock or time.time
        self._db = Database(path, synchronous=synchronous, busy_timeout=busy_timeout, on_connect=self._checked,
                            on_write=lambda conn: schema.check_version(conn, self.path),
                            on_open=lambda conn: schema.refuse_foreign(conn, self.path))
        self.path = self._db.path
        self._wakeup = wakeup_for(self.path)
        self._kept = Histories()  # the records this process committed lately, their history apart
        self._registered = 0  # pid that noted itself in the file's process table
        # Owners of the leases this process took and has not let go: claim_due passes over a run-out lease of this
        # process only if it is one of these (a turn a worker thread still runs). One of a dead process whose pid
        # this one reuses, or one whose release failed, is an orphan: claimed as any run-out lease.
        self._held: set[str] = set()
        self._held_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SQLiteStorage:
        """``sqlite:///relative/app.db`` or ``sqlite:////absolute/app.db``; ``options`` as for the constructor."""
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme != "sqlite" or parts.netloc or not parts.path.strip("/"):
            raise ConfigurationError(f"not an SQLite URL: {url!r}; expected sqlite:///app.db (relative) or "
                                     "sqlite:////var/lib/app.db (absolute)")
        if parts.query or parts.fragment:
            raise ConfigurationError(f"SQLite URL {url!r}: pass options as keyword arguments, not in the URL")
        return cls(unquote(parts.path[1:]), **options)

    def __repr__(self) -> str:
        return f"SQLiteStorage({self.path!r})"

    def _checked(self, conn: sqlite3.Connection) -> None:
        """Every new connection: the schema must be this library's; the first one notes this process."""
        schema.check_schema(conn, self.path)
        if self._registered != os.getpid():
            try:
                processes.register(conn, self.path)
            except sqlite3.Error as exc:
                if is_busy(exc):
                    raise  # waited out and retried, as every open is
                # A full disk or a read-only file: a reader (pipelines jobs, status, ui --read-only) still reads
                # what sqlite3 reads; the first write notes this process, before any lease or claim names it.
                return
            self._registered = os.getpid()  # after it went: a first write that met a busy file registers again

    def _register(self) -> None:
        """Note this process before its first write (its opening could not: a full disk, a read-only file)."""
        live, gone = self._db.write(processes.note, "noting this process in the file", durable=False)
        processes.registered(self.path, live, gone)
        self._registered = os.getpid()

    def _now(self) -> float:
        return self._clock()

    def close(self) -> None:
        """Close this process's connections (a later call opens new ones)."""
        self._db.close()

    def migrate(self) -> tuple[int, int]:
        """Upgrade the file's schema to this library's; ``(from, to)`` versions (``pipelines migrate``).

        A file that does not exist is made at this version: ``(0, version)`` (``pipelines migrate`` refuses a
        missing path first: a typo must not become a new, empty database). Refused, with nothing changed: a file
        another live process of this machine has open (it would fail every write after). SQLite's errors end as
        the library's (a busy file is waited for and retried as every write is).
        """
        mode = "rw" if os.path.isfile(self.path) else "rwc"  # rw: a file that goes after the check is not made anew

        def run() -> tuple[int, int]:
            conn = sqlite3.connect(f"file:{quote(self.path)}?mode={mode}", uri=True, timeout=self._db.busy_timeout,
                                   isolation_level=None)
            try:
                return schema.migrate(conn, self.path, lambda c: processes.refuse_if_used(c, self.path))
            finally:
                conn.close()

        moved: tuple[int, int] = self._db.retry(run, "migrating its schema")
        return moved

    def _write(self, fn: Callable[[sqlite3.Connection], Any], what: str, *, wake: bool = False,
               durable: bool = True) -> Any:
        if self._registered != os.getpid():
            self._db.connection()  # opened, it notes this process when it can
            if self._registered != os.getpid():  # a lease or claim names this process: it must be listed first
                self._register()
        result = self._db.write(fn, what, durable=durable)
        if wake:
            self._wakeup.notify()
        return result

    # --- JobStore ----------------------------------------------------------------------------
    def create_job(self, record: JobRecord, *, messages: Sequence[Message] = (), logs: Sequence[LogEntry] = (),
                   events: Sequence[Event] = ()) -> None:
        """Insert a new job atomically; ``JobConflictError`` if the id is taken."""
        validate_job_id(record.job_id)
        text, kept = self._kept.dump(record, f"the record of job {record.job_id!r}")
        texts = Texts(text, [dump_json(m, "a transcript message") for m in messages], dump_logs(logs),
                      dump_events(events))
        self._write(lambda c: writes.apply_create(c, record, texts), f"creating job {record.job_id!r}", wake=True)
        self._kept.keep(record.job_id, kept)

    def commit(self, commit: Commit) -> CommitReply:
        """Apply ``commit`` in one transaction: fenced on version and lease, idempotent by token."""
        # Serialised first: a value JSON cannot carry fails here, with nothing written (I1).
        text, kept = self._kept.dump(commit.record, f"the record of job {commit.job_id!r}")
        texts = Texts(text, [dump_json(m, "a transcript message") for m in commit.append_messages],
                      dump_logs(commit.logs), dump_events(commit.events))
        reply: CommitReply = self._write(lambda c: writes.apply_commit(c, commit, texts, self._clock(),
                                                                       processes.me()),
                                         f"committing job {commit.job_id!r}", wake=bool(texts.events))
        self._kept.keep(commit.job_id, kept)
        if commit.release_lease and commit.owner is not None:
            self._let_go(commit.owner)
        return reply

    def _let_go(self, owner: str) -> None:
        with self._held_lock:
            self._held.discard(owner)

    def record_step(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue) -> None:
        text = dump_json(value, f"result of step {key!r}")
        self._write(lambda c: writes.record_step(c, job_id, version=version, owner=owner, key=key, text=text,
                                                 now=self._clock(), proc=processes.me()),
                    f"journaling step {key!r} of job {job_id!r}")

    def record_step_and_publish(self, job_id: str, *, version: int, owner: str | None, key: str, value: JSONValue,
                                parts: Sequence[Event]) -> None:
        """Journal a step and publish ``parts`` in one transaction (the parts only if the step is journaled)."""
        text = dump_json(value, f"result of step {key!r}")
        lines = dump_events(parts)

        def both(conn: sqlite3.Connection) -> None:
            writes.record_step(conn, job_id, version=version, owner=owner, key=key, text=text, now=self._clock(),
                               proc=processes.me())
            writes.add_parts(conn, job_id, lines, durable=False)

        self._write(both, f"journaling step {key!r} of job {job_id!r}", wake=bool(lines))

    def add_dropped_usage(self, job_id: str, usage: Usage, *, token: str) -> None:
        self._write(lambda conn: _count_dropped(conn, job_id, usage, token),
                    f"counting dropped usage of job {job_id!r}")

    def add_fenced_answer(self, job_id: str, usage: Usage, entry: JSONValue, *, token: str) -> None:
        """The usage (as ``add_dropped_usage``) and the answer of a fenced-off attempt, in one transaction."""
        text = dump_json(entry, f"the answer of a fenced-off attempt of job {job_id!r}")

        def add(conn: sqlite3.Connection) -> None:
            if not _count_dropped(conn, job_id, usage, token):
                return
            writes.append(conn, "fenced", job_id, [text])
            conn.execute("DELETE FROM fenced WHERE job_id = ? AND pos <= "
                         "(SELECT max(pos) FROM fenced WHERE job_id = ?) - ?", (job_id, job_id, FENCED_KEPT))

        self._write(add, f"keeping a fenced-off answer of job {job_id!r}")

    def request_control(self, job_id: str, request: str | None) -> bool:
        found: bool = self._write(lambda c: c.execute(  # a pause never replaces a stored cancel
            "UPDATE jobs SET control = CASE WHEN ? = 'pause' AND control = 'cancel' THEN control ELSE ? END "
            "WHERE job_id = ?", (request, request, job_id)).rowcount > 0, f"requesting {request} of job {job_id!r}")
        return found

    def postpone(self, job_id: str, *, version: int, due_at: float) -> bool:
        moved: bool = self._write(lambda c: c.execute(
            "UPDATE jobs SET due_at = ? WHERE job_id = ? AND version = ? AND due_at IS NOT NULL AND due_at < ?",
            (due_at, job_id, version, due_at)).rowcount > 0, f"postponing job {job_id!r}", durable=False)
        return moved

    def delete_job(self, job_id: str, *, if_version: int | None = None) -> bool:
        """Remove the job and everything it owns; with ``if_version``, only if it is still at that version
        (else :class:`StaleVersionError`, nothing removed)."""
        found: bool = self._write(lambda c: writes.delete(c, job_id, if_version), f"deleting job {job_id!r}",
                                  wake=True)
        self._kept.keep(job_id, None)
        return found

    # --- InboxStore, LiveStore -------------------------------------------------------------------
    def send(self, job_id: str, messages: Sequence[Message]) -> int | None:
        lines = [dump_json(m, "a message sent to the job") for m in check_messages(messages, "messages sent")]
        if not lines:
            raise InvalidInputError("send needs at least one message")
        count: int | None = self._write(lambda c: writes.send(c, job_id, lines),
                                        f"sending messages to job {job_id!r}")
        return count

    def publish(self, job_id: str, parts: Sequence[Event]) -> None:
        lines = dump_events(parts)
        if not lines:
            return

        def add(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is not None:
                writes.add_parts(conn, job_id, lines, durable=False)

        self._write(add, f"publishing to job {job_id!r}", wake=True, durable=False)

    # --- LeaseStore ------------------------------------------------------------------------------
    def acquire_lease(self, job_id: str, owner: str, ttl: float) -> JobRecord | None:
        """Take the lease and read the record in one transaction; ``None`` if unknown or leased by another."""
        def take(conn: sqlite3.Connection) -> JobRecord | None:
            now = self._clock()
            # One statement takes a lease that is free, expired or this owner's and returns the record
            # (no row: the job is unknown or another owner's lease is live).
            rows = conn.execute(_TAKE_LEASE, {"owner": owner, "until": now + ttl, "proc": processes.me(),
                                              "job": job_id, "now": now}).fetchall()
            return load_record(conn, rows[0], self._kept) if rows else None

        record: JobRecord | None = self._write(take, f"leasing job {job_id!r}", durable=False)
        if record is not None:
            with self._held_lock:
                self._held.add(owner)
        return record

    def renew_lease(self, job_id: str, owner: str, ttl: float) -> bool:
        def renew(conn: sqlite3.Connection) -> bool:
            now = self._clock()
            # A lease of this process that ran out but that nobody took (its owner is still named: any take
            # or commit since would have changed that) is renewed too: the process stood still (Ctrl-Z, a
            # laptop asleep) or the wall clock stepped, and its turn goes on. claim_due leaves such a lease to
            # this renewal; refusing it would fence the turn off and run its tools again.
            return conn.execute("UPDATE jobs SET lease_expires = ? WHERE job_id = ? AND lease_owner = ? "
                                "AND (lease_expires > ? OR lease_proc = ?)",
                                (now + ttl, job_id, owner, now, processes.me())).rowcount > 0

        renewed: bool = self._write(renew, f"renewing the lease of job {job_id!r}", durable=False)
        return renewed

    def release_lease(self, job_id: str, owner: str) -> None:
        self._let_go(owner)  # first: a release that fails leaves an orphan, claimed once it runs out
        self._write(lambda c: c.execute("UPDATE jobs SET lease_owner = NULL WHERE job_id = ? AND lease_owner = ?",
                                        (job_id, owner)), f"releasing the lease of job {job_id!r}", durable=False)

    # --- for the local scheduler and flow control ---------------------------------------------
    def claim_due(self, cut: float, *, limit: int, hold: float, pipelines: Collection[str] | None = None) -> list[str]:
        """Claim running jobs due at ``cut`` that no worker leases or claimed (see :func:`writes.claim_due`)."""
        with self._held_lock:
            held = sorted(self._held)
        claimed: list[str] = self._write(lambda c: writes.claim_due(c, cut=cut, now=self._clock(), hold=hold,
                                                                    limit=limit, proc=processes.me(),
                                                                    pipelines=pipelines, held=held),
                                         "claiming due jobs", durable=False)
        return claimed

    def reap_dead_processes(self) -> int:
        """Release the leases and claims of this machine's processes that are gone; how many processes live.

        The local scheduler's sweep calls it every few seconds: it also drops the live parts of up to
        ``_EXPIRE_BATCH`` jobs that finished more than ``live_ttl`` ago, and flow-control rows of any key
        that ran out (:func:`adapters.sqlite.flow.drop_expired`).
        """
        live, gone = self._write(processes.reap, "releasing the leases of dead processes", durable=False)
        processes.say_released(gone)  # committed: said only now (a rolled-back release released nothing)
        from adapters.sqlite.flow import drop_expired  # flow control's module, loaded only here and by flow_store

        self._write(lambda c: drop_expired(c, self._clock()), "dropping flow-control slots that ran out",
                    durable=False)
        upto = self._clock() - self.live_ttl
        if upto > self._expired[0]:
            self._expired = self._write(lambda c: writes.expire_live(c, after=self._expired, upto=upto,
                                                                     limit=_EXPIRE_BATCH),
                                        "dropping the live parts of finished jobs", durable=False)
        return int(live)

    def next_due(self) -> float | None:
        """The earliest due time of a running job (``None``: none is running)."""
        row = self._db.read(lambda c: c.execute("SELECT min(due_at) FROM jobs WHERE due_at IS NOT NULL").fetchone(),
                            "reading the due index")
        return None if row is None or row[0] is None else float(row[0])

    def flow_store(self) -> Any:
        """The flow-control state in this file (a :class:`~adapters.sqlite.flow.SQLiteFlowStore`)."""
        from adapters.sqlite.flow import SQLiteFlowStore  # only apps with flow control load it

        return SQLiteFlowStore(self._db)


def _count_dropped(conn: sqlite3.Connection, job_id: str, usage: Usage, token: str) -> bool:
    """Add ``usage`` to the job's dropped usage, once per ``token``; ``False``: an unknown job or a re-sent call."""
    row = conn.execute("SELECT dropped, dropped_token FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
    if row is None or row[1] == token:
        return False
    total = (Usage.model_validate_json(row[0]) if row[0] else Usage()) + usage
    conn.execute("UPDATE jobs SET dropped = ?, dropped_token = ? WHERE job_id = ?",
                 (total.model_dump_json(), token, job_id))
    return True
