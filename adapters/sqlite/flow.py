"""The :class:`~adapters.base.FlowStore` port in the SQLite file: rate buckets and concurrency slots.

The same buckets and answers as :mod:`adapters.memory.flow` (its
``take_from_bucket`` does the arithmetic), each check-and-take one
``BEGIN IMMEDIATE`` transaction, so every process on the file shares them.
"""

from __future__ import annotations

import sqlite3
import time

from adapters.memory.flow import DEADLINE_BASE, PLACE_BASE, Bucket, line_of, take_from_bucket, take_in_line
from adapters.sqlite.connection import Database
from pipelines.engine.flow import check_block_seconds, check_slot_member, check_slot_ttl

__all__ = ["SQLiteFlowStore", "drop_expired"]

CLEAN_EVERY = 5.0
"""Seconds (this process's clock) between one store's passes over every key for rows that ran out."""

CLEAN_BATCH = 500
"""The most rows of each kind one pass removes: a pass stays short however much is left (the next takes it)."""


def drop_expired(conn: sqlite3.Connection, now: float, limit: int = CLEAN_BATCH) -> int:
    """Remove rows of any key that ran out by ``now``; how many. A slot's or a place's own take only looks at
    its key: with a key per user, the rows of a key nobody takes again (a killed worker's slot, the place of a
    job that stopped asking) would stay for ever. Ran out: a slot whose lease expired, a place's deadline
    passed, and a place whose deadline is gone (what :func:`~adapters.memory.flow.take_in_line` drops).
    One scan of the table, which then holds only what lives (slots held, jobs waiting in line)."""
    gone = conn.execute(
        "DELETE FROM flow_slots WHERE (key, member) IN (SELECT key, member FROM flow_slots WHERE expires <= ? "
        "OR (expires >= ? AND expires <= ?) LIMIT ?)", (now, DEADLINE_BASE, DEADLINE_BASE + now, limit)).rowcount
    gone += conn.execute(
        "DELETE FROM flow_slots WHERE (key, member) IN (SELECT p.key, p.member FROM flow_slots AS p "
        "WHERE p.expires >= ? AND p.expires < ? AND NOT EXISTS (SELECT 1 FROM flow_slots AS d "
        "WHERE d.key = p.key AND d.member = '!' || substr(p.member, 2)) LIMIT ?)",
        (PLACE_BASE, DEADLINE_BASE, limit)).rowcount
    return int(gone)


def _bucket(conn: sqlite3.Connection, model: str) -> Bucket:
    row = conn.execute("SELECT requests, tokens, ts, blocked_until FROM flow_buckets WHERE model = ?",
                       (model,)).fetchone()
    return Bucket() if row is None else Bucket(requests=row[0], tokens=row[1], ts=row[2], blocked_until=row[3])


def _save(conn: sqlite3.Connection, model: str, b: Bucket) -> None:
    conn.execute("INSERT OR REPLACE INTO flow_buckets (model, requests, tokens, ts, blocked_until) "
                 "VALUES (?, ?, ?, ?, ?)", (model, b.requests, b.tokens, b.ts, b.blocked_until))


class SQLiteFlowStore:
    """Rate buckets and concurrency slots in an SQLite file (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._clean_at = 0.0  # time.monotonic() of this store's next pass over every key (drop_expired)

    def take_rate(self, model: str, *, rpm: float | None, tpm: float | None, burst: float, tokens: int,
                  now: float) -> float:
        def take(conn: sqlite3.Connection) -> float:
            bucket = _bucket(conn, model)
            wait = take_from_bucket(bucket, rpm=rpm, tpm=tpm, burst=burst, tokens=tokens, now=now)
            if wait == 0:
                _save(conn, model, bucket)
            return wait

        wait: float = self._db.write(take, f"taking from the rate bucket of {model!r}")
        return wait

    def adjust_rate(self, model: str, tokens: int) -> None:
        self._db.write(lambda c: c.execute("UPDATE flow_buckets SET tokens = tokens - ? WHERE model = ? "
                                           "AND tokens IS NOT NULL", (tokens, model)),
                       f"adjusting the rate bucket of {model!r}")

    def block_rate(self, model: str, seconds: float, *, now: float) -> None:
        check_block_seconds(seconds)

        def block(conn: sqlite3.Connection) -> None:
            bucket = _bucket(conn, model)
            bucket.blocked_until = max(bucket.blocked_until, now + seconds)
            _save(conn, model, bucket)

        self._db.write(block, f"blocking the rate bucket of {model!r}")

    def take_slot(self, key: str, member: str, *, limit: int, ttl: float, now: float) -> float:
        check_slot_ttl(ttl)
        check_slot_member(member)

        clean = time.monotonic() >= self._clean_at
        if clean:
            self._clean_at = time.monotonic() + CLEAN_EVERY

        def take(conn: sqlite3.Connection) -> float:
            if clean:  # before this key's rows are read: its own ran out go too
                drop_expired(conn, now)
            before = dict(conn.execute("SELECT member, expires FROM flow_slots WHERE key = ?", (key,)).fetchall())
            after = dict(before)
            wait = take_in_line(after, member, limit=limit, ttl=ttl, now=now)
            gone = [(key, m) for m in before if m not in after]
            if gone:  # killed workers' slots, jobs that stopped asking, a place in line given up for a slot
                conn.executemany("DELETE FROM flow_slots WHERE key = ? AND member = ?", gone)
            changed = [(key, m, e) for m, e in after.items() if before.get(m) != e]
            if changed:
                conn.executemany("INSERT OR REPLACE INTO flow_slots (key, member, expires) VALUES (?, ?, ?)", changed)
            return wait

        wait: float = self._db.write(take, f"taking a slot of {key!r}")
        return wait

    def renew_slot(self, key: str, member: str, *, ttl: float, now: float) -> bool:
        check_slot_ttl(ttl)
        renewed: bool = self._db.write(
            lambda c: c.execute(
                "UPDATE flow_slots SET expires = ? WHERE key = ? AND member = ? AND expires > ? AND expires < ?",
                (now + ttl, key, member, now, PLACE_BASE)).rowcount > 0, f"renewing a slot of {key!r}")
        return renewed

    def release_slot(self, key: str, member: str) -> str | None:
        def release(c: sqlite3.Connection) -> str | None:
            c.execute("DELETE FROM flow_slots WHERE key = ? AND member = ?", (key, member))
            row = c.execute("SELECT member FROM flow_slots WHERE key = ? AND expires >= ? AND expires < ? "
                            "ORDER BY expires LIMIT 1", (key, PLACE_BASE, DEADLINE_BASE)).fetchone()
            return str(row[0])[1:] if row else None

        first: str | None = self._db.write(release, f"releasing a slot of {key!r}")
        return first

    def slots(self, key: str, now: float) -> list[str]:
        """Members holding a live slot of ``key`` (tests, inspection)."""
        rows = self._db.read(lambda c: c.execute("SELECT member FROM flow_slots WHERE key = ? AND expires > ? "
                                                 "AND expires < ? ORDER BY member", (key, now, PLACE_BASE)).fetchall(),
                             f"reading slots of {key!r}")
        return [r[0] for r in rows]

    def line(self, key: str, now: float) -> list[str]:
        """The jobs waiting for a slot of ``key``, first first (tests, inspection)."""
        rows = self._db.read(lambda c: c.execute("SELECT member, expires FROM flow_slots WHERE key = ?",
                                                 (key,)).fetchall(), f"reading the line of {key!r}")
        return line_of(dict(rows), now)
