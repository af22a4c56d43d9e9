"""The :class:`~adapters.base.FlowStore` port in the SQLite file: rate buckets and concurrency slots.

The same buckets and answers as :mod:`adapters.memory.flow` (its
``take_from_bucket`` does the arithmetic), each check-and-take one
``BEGIN IMMEDIATE`` transaction, so every process on the file shares them.
"""

from __future__ import annotations

import sqlite3

from adapters.memory.flow import DEADLINE_BASE, PLACE_BASE, Bucket, line_of, take_from_bucket, take_in_line
from adapters.sqlite.connection import Database
from pipelines.engine.flow import check_block_seconds, check_slot_member, check_slot_ttl

__all__ = ["SQLiteFlowStore"]


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

        def take(conn: sqlite3.Connection) -> float:
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
