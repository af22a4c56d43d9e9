"""Opening one SQLite file safely, from many threads and processes, and running transactions on it.

Every thread gets its own connection (``sqlite3`` connections are not meant to be
shared by threads), opened with the file's settings checked:

* WAL journal mode, checked *after* it was asked for: SQLite silently keeps the
  old mode where WAL cannot work (a network filesystem, ``:memory:``), and a
  storage that many processes share must not run without it.
* ``synchronous=FULL`` by default: a commit is on disk when it returns, even
  across a power cut. ``NORMAL`` survives a process crash but may lose the
  last commits on power loss (WAL keeps the file itself consistent).
* A busy timeout (default 30 s): a writer waits for another's transaction.
* ``wal_autocheckpoint`` of :data:`WAL_AUTOCHECKPOINT` pages (about 16 MiB)
  and ``journal_size_limit`` (16 MiB): the WAL is copied into the file and
  started over once it holds that much, and cut back to that size after a
  bigger transaction, so it stays bounded. Each checkpoint syncs the WAL
  and the file (under ``NORMAL`` too): SQLite's default of 1,000 pages made
  a commit in every ~70 W1 turns pay two ``fsync`` calls, on a busy disk the
  largest part of a turn's commit time.

Writes run in ``BEGIN IMMEDIATE`` transactions: the write lock is taken
first, so two writers never both read and then fail to upgrade (the one case
where SQLite gives up at once instead of waiting). If SQLite still reports
the file busy or locked, the whole transaction is retried here with a
backoff, so ``database is locked`` never reaches a caller; only a file that
stays locked past ``busy_timeout`` + :data:`RETRY_SECONDS` ends as
:class:`~pipelines.engine.errors.StorageUnavailableError`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipelines.engine.errors import ConfigurationError, CorruptRecordError, InvalidInputError, StorageUnavailableError

__all__ = ["RETRY_SECONDS", "SYNCHRONOUS", "Database", "check_sqlite_version", "is_busy", "wal_defect"]

logger = logging.getLogger("pipelines")

T = TypeVar("T")

SYNCHRONOUS = ("FULL", "NORMAL")
"""The durability levels offered: FULL (the default) or NORMAL (see the module docstring)."""
RETRY_SECONDS = 120.0
"""How long a transaction that found the file busy is retried (beyond SQLite's own busy timeout)."""
MIN_VERSION = (3, 35, 0)
"""``UPDATE ... RETURNING`` (claiming due work in one statement) needs SQLite 3.35."""
WAL_FIXED = (3, 51, 3)
"""The release that fixed SQLite's WAL-reset defect (two connections writing or checkpointing at once)."""
JOURNAL_SIZE_LIMIT = 16 * 1024 * 1024
"""Bytes of WAL file kept after a checkpoint resets it."""
WAL_AUTOCHECKPOINT = JOURNAL_SIZE_LIMIT // (4096 + 24) - 64
"""Pages in the WAL past which a commit checkpoints it (SQLite's default: 1,000): 4,008, so the WAL at a
checkpoint (frames of a 4 KiB page and a 24-byte header) still fits in :data:`JOURNAL_SIZE_LIMIT` with one
commit of up to 64 pages over it, and is started over in place: were it cut back at every checkpoint, it would
be cut and grown again every few hundred turns."""

_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


def check_sqlite_version(version: str | None = None) -> None:
    """Refuse an SQLite older than 3.35 (no ``RETURNING``), naming the version found."""
    found = version or sqlite3.sqlite_version
    if _version(found) < MIN_VERSION:
        raise ConfigurationError(
            f"SQLiteStorage needs SQLite >= 3.35 (UPDATE ... RETURNING); this Python links SQLite {found}. "
            "Use a Python built against a newer SQLite")


def wal_defect(version: str | None = None) -> bool:
    """Whether the linked SQLite has the WAL-reset defect (fixed in 3.51.3)."""
    return _version(version or sqlite3.sqlite_version) < WAL_FIXED


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says the file was busy or locked (what a retry waits out)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY
    text = str(exc)
    return "locked" in text or "busy" in text


def _unavailable(path: str, exc: sqlite3.Error, what: str) -> Exception:
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in str(exc):
        return CorruptRecordError(f"the SQLite file {path} is damaged ({what}): {exc}")
    text = str(exc)
    if is_busy(exc):
        fix = "another process held the file's write lock longer than busy_timeout: which one, and why so long?"
    elif "not a database" in text:
        fix = "is that path the app's SQLite file? Another file there is refused, not changed"
    else:
        fix = ("can this process read and write the file and its folder (SQLite writes -wal and -shm files beside "
               "it), on a local disk with room?")
    return StorageUnavailableError(f"the SQLite file {path} failed {what}: {type(exc).__name__}: {text}", fix=fix)


_writers: dict[str, threading.RLock] = {}
_writers_lock = threading.Lock()


def _writer_lock(path: str) -> threading.RLock:
    """The one lock of this process's writers to ``path``.

    Writers of one process take turns here before they take SQLite's write
    lock: a waiting thread is handed the file at once instead of polling in
    SQLite's busy handler, and no two connections of this process ever write
    or checkpoint the WAL at the same moment (the condition of SQLite's
    WAL-reset defect, fixed in 3.51.3), so only other processes can meet it.
    """
    with _writers_lock:
        found = _writers.get(path)
        if found is None:
            found = _writers[path] = threading.RLock()
        return found


def _hold_writers() -> None:
    """Before a fork: wait for this process's write transactions to end, and start none until it is done.

    SQLite keeps the locks a process holds on a file in that process's memory. A child forked while a
    thread of the parent held the write lock inherits a note saying so, which no thread of the child will
    ever clear: every later transaction of the child's is refused "database is locked".
    """
    with _writers_lock:
        held = list(_writers.values())
    for lock in held:
        lock.acquire()
    _held_at_fork[:] = held


def _release_writers() -> None:
    held, _held_at_fork[:] = list(_held_at_fork), []
    for lock in reversed(held):
        lock.release()


def _forget_writer_locks() -> None:
    global _writers_lock
    _writers_lock = threading.Lock()
    _writers.clear()
    _held_at_fork.clear()  # the child's locks are new ones: none is held


_held_at_fork: list[threading.RLock] = []
os.register_at_fork(before=_hold_writers, after_in_parent=_release_writers, after_in_child=_forget_writer_locks)


class Database:
    """One SQLite file: a connection per thread (per process), transactions, retries.

    ``on_open(conn)`` runs on every new connection before anything is written (a refusal of a file that is not
    ours leaves it untouched, journal mode included); ``on_connect(conn)`` once on every new connection after
    (the schema check); ``on_write(conn)`` at the start of every write transaction (the version check).
    """

    def __init__(self, path: str, *, synchronous: str = "FULL", busy_timeout: float = 30.0,
                 on_connect: Callable[[sqlite3.Connection], None] | None = None,
                 on_write: Callable[[sqlite3.Connection], None] | None = None,
                 on_open: Callable[[sqlite3.Connection], object] | None = None) -> None:
        check_sqlite_version()
        if synchronous not in SYNCHRONOUS:
            raise ConfigurationError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}, got {synchronous!r}")
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or not 0 < busy_timeout < 3600:
            raise ConfigurationError(f"busy_timeout must be seconds in (0, 3600), got {busy_timeout!r}")
        if not isinstance(path, str | os.PathLike) or str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise ConfigurationError(f"SQLiteStorage needs the path of a file on a local disk, got {path!r} "
                                     "(WAL mode, which several processes need, cannot work in memory)")
        self.path = str(Path(path).resolve())
        self.synchronous = synchronous
        self.busy_timeout = float(busy_timeout)
        self._on_connect = on_connect
        self._on_write = on_write
        self._on_open = on_open
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._pid = os.getpid()
        self._writing = _writer_lock(self.path)

    # --- connections ---------------------------------------------------------
    def _forked(self) -> None:
        if os.getpid() != self._pid:
            # A forked child: the parent's connections must not be used (nor closed) here, and a lock
            # another thread of the parent held at the fork would never be released.
            self._lock = threading.Lock()
            with self._lock:
                self._pid, self._all, self._local = os.getpid(), [], threading.local()
                self._writing = _writer_lock(self.path)

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, opened (and checked) on first use."""
        self._forked()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.retry(self._open, "opening the file")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        with self._writing:  # opening writes (the schema check, the process's row): not across a fork either
            return self._open_held()

    def _open_held(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no transaction opens behind our back; every one is BEGIN'd here.
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        try:
            if self._on_open is not None:
                self._on_open(conn)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ConfigurationError(
                    f"SQLite refused WAL mode for {self.path} (journal mode is {mode!r}): the file is probably on a "
                    "network filesystem, where several processes cannot share it safely; use a local disk")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
            conn.execute("PRAGMA foreign_keys=OFF")
            if self._on_connect is not None:
                self._on_connect(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close every connection this process opened; a later call opens new ones."""
        with self._lock:
            conns, self._all = self._all, []
            self._local = threading.local()
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):  # another thread's statement in flight: it fails on its own
                conn.close()

    # --- transactions ----------------------------------------------------------
    def write(self, fn: Callable[[sqlite3.Connection], T], what: str, *, durable: bool = True) -> T:
        """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction, committed if it returns, rolled back if
        it raises; retried whole while the file is busy (``fn`` must not have effects outside the database).

        ``durable=False``: a write that only matters while this machine runs (a lease, a claim, a live
        text part) is not synced to disk on its own under ``synchronous=FULL``; the next durable commit
        syncs it with its own (the WAL is one file, written in order), and a power cut that loses it
        also stopped every process that could have cared.
        """
        self._forked()
        relaxed = not durable and self.synchronous == "FULL"
        with self._writing:
            return self.retry(lambda: self._in_transaction("BEGIN IMMEDIATE", self._checked(fn), relaxed=relaxed),
                               what)

    def _checked(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
        check = self._on_write
        if check is None:
            return fn

        def run(conn: sqlite3.Connection) -> T:
            check(conn)
            return fn(conn)

        return run

    def read(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn(conn)`` in one read transaction: every statement in it sees the same snapshot."""
        return self.retry(lambda: self._in_transaction("BEGIN", fn), what)

    def _in_transaction(self, begin: str, fn: Callable[[sqlite3.Connection], T], *, relaxed: bool = False) -> T:
        conn = self.connection()
        if conn.in_transaction:
            # Between calls no transaction is ever open here: one is what an interrupt at the wrong moment left
            # (see below). It goes first, or it would hold the file's write lock for every other writer.
            conn.execute("ROLLBACK")
        if relaxed:
            conn.execute("PRAGMA synchronous=NORMAL")  # outside any transaction, where SQLite allows it
        try:
            # BEGIN, the body and COMMIT under one handler: an exception anywhere in them (an interrupt or a
            # signal handler's SystemExit landing right after BEGIN returned, a COMMIT refused) rolls back.
            try:
                conn.execute(begin)
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            if relaxed:
                # Outside the transaction now (SQLite refuses a safety level change inside one). A connection
                # that could not be set back must not serve a durable write at NORMAL: it is dropped (the
                # thread opens another), and the call's own outcome stands.
                try:
                    conn.execute(f"PRAGMA synchronous={self.synchronous}")
                except sqlite3.Error:
                    self._drop(conn)
                except BaseException:  # an interrupt: the connection goes too, and the interrupt goes on
                    self._drop(conn)
                    raise
        return result

    def _drop(self, conn: sqlite3.Connection) -> None:
        """Close this thread's ``conn`` and forget it: the thread's next call opens a new one."""
        with self._lock:
            self._all = [c for c in self._all if c is not conn]
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with contextlib.suppress(sqlite3.Error):
            conn.close()

    def retry(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn()`` retried while the file is busy; SQLite's errors end as the library's (a connection's
        opening, each transaction, ``pipelines migrate``)."""
        deadline = time.monotonic() + RETRY_SECONDS
        pause = 0.005
        while True:
            try:
                return fn()
            except UnicodeEncodeError as exc:
                # A string bound to a statement (a job id, an owner, ...) that UTF-8 cannot carry: bad input,
                # said as such (values are checked before they get here; the transaction was rolled back).
                bad = exc.object[exc.start:exc.end] if isinstance(exc.object, str) else ""
                said = what.encode("utf-8", "backslashreplace").decode()  # the message itself must be writable
                raise InvalidInputError(f"{said}: a string given holds {bad!r}, a lone surrogate UTF-8 cannot "
                                        "carry (nothing written)") from None
            except sqlite3.Error as exc:
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise _unavailable(self.path, exc, what) from exc
                self._drop_failed_transaction()
            # Jittered, so processes that collided do not collide again in step.
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 2, 0.25)

    def _drop_failed_transaction(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.debug("sqlite: rollback after a busy error failed", exc_info=True)
