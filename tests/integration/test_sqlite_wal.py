"""The WAL file stays bounded while a follower of the live stream is held open through many commits.

A reader that kept a read transaction open between its reads would pin the
WAL: SQLite could not start it over after a checkpoint, and it would grow by
every commit for as long as the reader lives. The control case shows the
bound catches exactly that.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from adapters.sqlite import SQLiteStorage
from adapters.sqlite.connection import WAL_AUTOCHECKPOINT
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, JobStatus

COMMITS = 1200
MESSAGE = "x" * 32000  # ~54 MB written in all, more than twice BOUND
# The WAL's reset point (frames of a 4 KiB page and a 24-byte header) and 6 MiB over it: the commits a
# follower's read lets through before the WAL can start over (~130 of these).
BOUND = WAL_AUTOCHECKPOINT * (4096 + 24) + 6 * 1024 * 1024


def write_turns(storage: SQLiteStorage) -> None:
    cp = Checkpoint[Any](next_phase="a", state={}, version=1, due_at=1.0)
    rec = JobRecord(job_id="j", status=JobStatus.RUNNING, checkpoint=cp, version=1)
    storage.create_job(rec)
    for n in range(COMMITS):
        storage.publish("j", [Event(timestamp=1.0, type="text_delta", turn=n, data={"text": "t"})])
        new = rec.model_copy(update={"version": rec.version + 1})
        storage.commit(Commit(job_id="j", expected_version=rec.version, token=str(n), record=new,
                              append_messages=[{"role": "assistant", "content": MESSAGE}],
                              events=[Event(timestamp=1.0, type="turn_committed", turn=n)]))
        rec = new


def wal_size(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_the_wal_stays_bounded_while_a_follower_reads_along(tmp_path: Path) -> None:
    path = tmp_path / "wal.db"
    storage = SQLiteStorage(str(path), synchronous="NORMAL")
    stop, seen = threading.Event(), []
    biggest = [0]

    def follow() -> None:
        follower = SQLiteStorage(str(path))
        cursor = None
        while not stop.is_set():
            parts = follower.read_live("j", after=cursor, block=0.2)
            if parts:
                cursor = parts[-1].id
                seen.extend(parts)
            biggest[0] = max(biggest[0], wal_size(path))

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        write_turns(storage)
    finally:
        stop.set()
        reader.join(30)
    assert len(storage.messages("j")) == COMMITS
    assert any(p.type == "turn_committed" for p in seen)  # the follower did read along
    assert max(biggest[0], wal_size(path)) < BOUND


def test_control_a_reader_holding_a_transaction_open_lets_the_wal_grow_past_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "pinned.db"
    storage = SQLiteStorage(str(path), synchronous="NORMAL")
    storage.get_job("j")  # the schema exists before the pinning reader looks
    pinned = sqlite3.connect(path, isolation_level=None)
    pinned.execute("BEGIN")
    pinned.execute("SELECT count(*) FROM jobs").fetchall()  # a snapshot it keeps
    try:
        write_turns(storage)
        assert wal_size(path) > BOUND
    finally:
        pinned.execute("COMMIT")
        pinned.close()
