"""Which processes use an SQLite storage file, and what a dead one leaves behind.

Every process notes itself in the file's ``processes`` table when it first
opens it. That serves two things:

* A lease or a claim records the process that took it. When that process is
  gone (``kill -9``, a crash, a power cut) its leases and claims are released
  at once by the next process that looks (a restart, or a local scheduler's
  sweep), instead of making the job wait out the lease: a restarted
  ``pipelines dev`` resumes its runs immediately. A version-fenced commit
  keeps this safe: a process judged dead cannot commit anyway.
* The WAL-reset defect of SQLite before 3.51.3 (two connections writing or
  checkpointing one WAL file at the same moment can, rarely, corrupt it)
  matters once several processes share the file: the process that finds
  others warns once.

A process is named by its machine (host name and PID namespace, so two
containers that share a volume never judge each other's PIDs) and its PID.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time

from adapters.sqlite.connection import wal_defect
from pipelines.engine.errors import ConfigurationError

__all__ = ["me", "note", "reap", "refuse_if_used", "register", "registered", "say_released"]

logger = logging.getLogger("pipelines")

_WARNED: set[str] = set()  # files this process warned about (once each)


def _machine() -> str:
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}|{namespace}"


def me() -> str:
    """This process, as leases and claims record it: ``<machine>/<pid>``."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:  # once per process (a forked child names itself anew): every lease asks
        _me = (pid, f"{_machine()}/{pid}")
    return _me[1]


_me = (0, "")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    try:  # a killed process its parent has not waited for yet (a zombie) is dead too
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def reap(conn: sqlite3.Connection) -> tuple[int, list[int]]:
    """Inside a write transaction: forget this machine's dead processes, releasing their leases and claims.

    Returns how many processes of this machine are alive (this one included once registered) and the PIDs of
    the dead ones released; the caller says so with :func:`say_released` once the transaction committed (one
    rolled back, a full disk say, released nothing, and a line every look would claim it had).
    """
    machine = _machine()
    pids = [int(r[0]) for r in conn.execute("SELECT pid FROM processes WHERE machine = ?", (machine,)).fetchall()]
    dead = [p for p in pids if p != os.getpid() and not _alive(p)]
    for pid in dead:
        proc = f"{machine}/{pid}"
        # Expired, not let go: a reader still sees that a worker held the job and was lost mid-turn
        # (LeaseState.lapsed: `pipelines status` says so); every taker treats it as free.
        conn.execute("UPDATE jobs SET lease_expires = 0, lease_proc = NULL WHERE lease_proc = ?", (proc,))
        conn.execute("UPDATE jobs SET claim_until = 0, claim_proc = NULL WHERE claim_proc = ?", (proc,))
        conn.execute("DELETE FROM processes WHERE machine = ? AND pid = ?", (machine, pid))
    return len(pids) - len(dead), dead


def say_released(pids: list[int]) -> None:
    """Log the dead processes a committed :func:`reap` released."""
    for pid in pids:
        logger.info("sqlite: process %d is gone; its leases and claims are released", pid)


def refuse_if_used(conn: sqlite3.Connection, path: str) -> None:
    """Inside a write transaction: :class:`ConfigurationError` if another live process of this machine has the
    file open (``pipelines migrate``: a worker running on the old schema would fail each write after it)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'processes'").fetchone() is None:
        return  # a file from before the table: nothing recorded who uses it
    machine = _machine()
    rows = conn.execute("SELECT pid FROM processes WHERE machine = ?", (machine,)).fetchall()
    live = sorted(p for p in (int(r[0]) for r in rows) if p != os.getpid() and _alive(p))
    if live:
        pids = ", ".join(str(p) for p in live)
        raise ConfigurationError(f"{path} is in use by process{'es' if len(live) > 1 else ''} {pids} of this "
                                 "machine: stop the workers, `pipelines dev` and web processes on it first, then "
                                 "migrate; nothing was changed")


def note(conn: sqlite3.Connection) -> tuple[int, list[int]]:
    """Inside a write transaction: note this process in the file and reap the dead (see :func:`reap`)."""
    conn.execute("INSERT OR REPLACE INTO processes (machine, pid, seen) VALUES (?, ?, ?)",
                 (_machine(), os.getpid(), time.time()))
    return reap(conn)


def register(conn: sqlite3.Connection, path: str) -> int:
    """Note this process in the file and reap the dead (one transaction); how many processes use the file."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        live, gone = note(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return registered(path, live, gone)


def registered(path: str, live: int, gone: list[int]) -> int:
    """After :func:`note` committed: say which dead processes it released, and warn once when more than one
    process uses the file and the linked SQLite has the WAL-reset defect; ``live``."""
    say_released(gone)
    if live > 1 and wal_defect() and path not in _WARNED:
        _WARNED.add(path)
        logger.warning(
            "%d processes use the SQLite file %s, and this Python links SQLite %s, which has the WAL-reset "
            "defect (fixed in 3.51.3): processes writing one file at once can, rarely, corrupt it. For several "
            "processes use a Python linked against SQLite >= 3.51.3, or run one process (pipelines dev)",
            live, path, sqlite3.sqlite_version)
    return live
