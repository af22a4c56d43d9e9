"""SQLiteStorage on a real file: its settings, its schema version, what dead processes leave, the live stream's
wake-ups, waiting out a busy file, and that no transaction stays open across a model or tool call."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryScheduler
from adapters.sqlite import SQLiteStorage, connection, schema
from adapters.sqlite.connection import wal_defect
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.errors import ConfigurationError, StaleVersionError
from pipelines.engine.models import Checkpoint, Commit, Event, JobRecord, TurnMark, Usage, dump_record
from pipelines.testing import ScriptedModel, call, reply

ROOT = Path(__file__).resolve().parents[2]


def record(job_id: str = "j", version: int = 1) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={}, version=version, due_at=1.0)
    return JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=version)


def pragma(path: Path, name: str) -> Any:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


# --- settings ---------------------------------------------------------------------------------------
def test_the_file_is_in_wal_mode_with_full_sync_by_default_and_normal_on_request(tmp_path: Path) -> None:
    full = SQLiteStorage(str(tmp_path / "full.db"))
    full.create_job(record())
    assert pragma(tmp_path / "full.db", "journal_mode") == "wal"
    conn = full._db.connection()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    # A lease is written without a sync of its own; the connection is back at FULL for the next commit.
    assert full.acquire_lease("j", "w", 30) is not None
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    normal = SQLiteStorage(str(tmp_path / "normal.db"), synchronous="NORMAL")
    assert normal._db.connection().execute("PRAGMA synchronous").fetchone()[0] == 1
    full.close()
    normal.close()


@pytest.mark.parametrize(("path", "options", "match"), [
    (":memory:", {}, "file on a local disk"),
    ("", {}, "file on a local disk"),
    ("file:x.db?mode=memory", {}, "file on a local disk"),
    ("x.db", {"synchronous": "OFF"}, "synchronous must be one of FULL, NORMAL"),
    ("x.db", {"busy_timeout": 0}, "busy_timeout"),
])
def test_bad_settings_are_refused_by_name(tmp_path: Path, path: str, options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SQLiteStorage(path if not path.startswith("x") else str(tmp_path / path), **options)


def test_urls_name_relative_and_absolute_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert SQLiteStorage.from_url("sqlite:///rel/app.db").path == str(tmp_path / "rel" / "app.db")
    assert SQLiteStorage.from_url(f"sqlite:///{tmp_path}/abs.db").path == str(tmp_path / "abs.db")
    for bad in ("redis://localhost/0", "sqlite://host/app.db", "sqlite:///", "sqlite:///a.db?mode=ro"):
        with pytest.raises(ConfigurationError, match=r"SQLite URL|not an SQLite URL"):
            SQLiteStorage.from_url(bad)


def test_a_file_where_wal_does_not_take_is_refused_with_nothing_written(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # What SQLite does on a network filesystem: asked for WAL, it answers with the mode it kept.
    class NoWal(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql.replace(" ", "").upper() == "PRAGMAJOURNAL_MODE=WAL":
                sql = "PRAGMA journal_mode=DELETE"
            return super().execute(sql, *args)

    real = sqlite3.connect
    monkeypatch.setattr(connection.sqlite3, "connect", lambda *a, **kw: real(*a, **kw, factory=NoWal))
    storage = SQLiteStorage(str(tmp_path / "nfs.db"))
    with pytest.raises(ConfigurationError, match=r"refused WAL mode .* network filesystem"):
        storage.create_job(record())
    monkeypatch.setattr(connection.sqlite3, "connect", real)
    assert pragma(tmp_path / "nfs.db", "user_version") == 0  # no schema, no job


def test_an_sqlite_without_returning_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"SQLite >= 3.35 .* links SQLite 3.34.1"):
        connection.check_sqlite_version("3.34.1")
    connection.check_sqlite_version("3.35.0")


# --- schema version ---------------------------------------------------------------------------------
def test_a_newer_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    first = SQLiteStorage(str(path))
    first.create_job(record())
    first.close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 99")
        conn.execute("PRAGMA journal_mode = DELETE")  # as a newer version might leave it
    with pytest.raises(ConfigurationError, match="schema version 99, written by a newer phaserunner"):
        SQLiteStorage(str(path)).get_job("j")
    with pytest.raises(ConfigurationError, match="newer than this phaserunner"):
        SQLiteStorage(str(path)).migrate()
    assert pragma(path, "user_version") == 99 and pragma(path, "journal_mode") == "delete"


def test_an_older_schema_is_refused_until_migrate_upgrades_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "old.db"
    now = schema.SCHEMA_VERSION
    SQLiteStorage(str(path)).create_job(record())  # written at this library's version
    # This library moves on to the next version, which adds a column.
    monkeypatch.setitem(schema.MIGRATIONS, now + 1, ["ALTER TABLE jobs ADD COLUMN note TEXT"])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)
    with pytest.raises(ConfigurationError,
                       match=rf"schema version {now}; .* needs version {now + 1}. Run `pipelines migrate"):
        SQLiteStorage(str(path)).get_job("j")
    storage = SQLiteStorage(str(path))
    assert storage.migrate() == (now, now + 1)
    assert storage.migrate() == (now + 1, now + 1)  # again: nothing to do
    got = storage.get_job("j")
    assert got is not None and got.job_id == "j"
    with sqlite3.connect(path) as conn:
        assert "note" in [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]


def test_a_version_1_file_migrates_to_the_current_version_keeping_its_jobs_and_keeps_fenced_off_answers(
        tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:  # a file as phaserunner wrote it before version 2
        for statement in schema.MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO jobs (job_id, record, version, status, updated_at) VALUES (?, ?, 1, ?, 0)",
                     ("j", record().model_dump_json(), "running"))
    with pytest.raises(ConfigurationError, match=r"schema version 1; .* needs version 3. Run `pipelines migrate"):
        SQLiteStorage(str(path)).get_job("j")
    storage = SQLiteStorage(str(path))
    assert storage.migrate() == (1, 3)
    assert storage.get_job("j") == record()
    storage.add_fenced_answer("j", Usage(model_calls=1), {"turn": 1, "answer": {"message": {}}}, token="t")
    assert storage.fenced_answers("j") == [{"turn": 1, "answer": {"message": {}}}]
    assert pragma(path, "user_version") == 3


def test_a_version_2_file_migrates_to_version_3_and_counts_a_lease_taken_over_after_it_ran_out(
        tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:  # a file as phaserunner wrote it before version 3
        for statement in (*schema.MIGRATIONS[1], *schema.MIGRATIONS[2]):
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute("INSERT INTO jobs (job_id, record, version, status, updated_at, lease_owner, lease_expires) "
                     "VALUES (?, ?, 1, ?, 0, 'dead-worker', 1)", ("j", record().model_dump_json(), "running"))
        for job_id, text in (("theirs", record("theirs").model_copy(update={"pipeline": "other"}).model_dump_json()),
                             ("broken", "{truncated")):
            conn.execute("INSERT INTO jobs (job_id, record, version, status, updated_at, due_at) "
                         "VALUES (?, ?, 1, 'running', 0, 0)", (job_id, text))
    with pytest.raises(ConfigurationError, match=r"schema version 2; .* needs version 3. Run `pipelines migrate"):
        SQLiteStorage(str(path)).get_job("j")
    storage = SQLiteStorage(str(path))
    assert storage.migrate() == (2, 3)
    assert storage.get_job("j") == record()
    # The records' pipelines are columns now (the default one's record leaves its name out; a broken one has
    # none), which a claim filters by without parsing each record.
    with sqlite3.connect(path) as conn:
        assert dict(conn.execute("SELECT job_id, pipeline FROM jobs")) == {
            "j": "default", "theirs": "other", "broken": None}
    assert storage.claim_due(1e12, limit=5, hold=60, pipelines=["other"]) == ["broken", "theirs"]
    taken = storage.acquire_lease("j", "w", 30)  # the dead worker's lease ran out before the upgrade
    assert taken is not None and taken.interrupted == 1
    assert pragma(path, "user_version") == 3


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(ConfigurationError, match="another program's database"):
        SQLiteStorage(str(path)).get_job("j")
    with sqlite3.connect(path) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["customers"]
    assert pragma(path, "journal_mode") == "delete"  # untouched: it was switched to WAL before the refusal


def test_a_schema_created_by_another_process_while_a_new_file_is_opened_is_not_taken_for_a_foreign_one() -> None:
    # Read in two statements, outside a transaction, another process creating the schema between them showed its
    # tables without its version: "another program's database" (6 of 80 rounds of 8 processes on a new file).
    class SchemaAppearsMeanwhile:
        """A connection to a new file whose schema another process commits right after this one's first read."""

        def __init__(self) -> None:
            self.version, self.tables = 0, 0

        def execute(self, sql: str) -> Any:
            snapshot = (self.version, self.tables)
            self.version, self.tables = schema.SCHEMA_VERSION, 11  # the other process committed

            class Row:
                @staticmethod
                def fetchone() -> tuple[int, ...]:
                    if "pragma_user_version" in sql:
                        return snapshot
                    return (snapshot[0],) if "user_version" in sql else (snapshot[1],)
            return Row()

    schema.refuse_foreign(SchemaAppearsMeanwhile(), "new.db")  # type: ignore[arg-type]  # one snapshot: no refusal


# --- processes -------------------------------------------------------------------------------------
_TAKE_LEASE_AND_DIE = """
import os, sys
from adapters.sqlite import SQLiteStorage
s = SQLiteStorage(sys.argv[1])
assert s.acquire_lease("j", "dead-worker", 600) is not None
s.claim_due(10.0, limit=5, hold=600)
os._exit(0)  # no clean-up of any kind, like kill -9
"""


def test_the_leases_and_claims_of_a_dead_process_are_released_by_the_next_process(tmp_path: Path) -> None:
    path = str(tmp_path / "p.db")
    storage = SQLiteStorage(path)
    storage.create_job(record("j"))
    storage.create_job(record("k"))
    done = run_python(_TAKE_LEASE_AND_DIE, path)
    assert done.returncode == 0, done.stderr
    assert storage.lease_owner("j") == "dead-worker"
    assert storage.claim_due(10.0, limit=5, hold=60) == []  # j leased, k claimed by the dead process
    assert storage.reap_dead_processes() == 1  # only this process is left
    assert storage.lease_owner("j") is None
    # Expired, not released: `pipelines status` still says a worker was lost mid-turn (it said nothing).
    assert storage.lease_state("j").lapsed
    assert storage.claim_due(10.0, limit=5, hold=60) == ["j", "k"]  # both free again, at once
    # A live process's lease is never taken: this one's own.
    assert storage.acquire_lease("k", "me", 600) is not None
    storage.reap_dead_processes()
    assert storage.lease_owner("k") == "me"


_OPEN_AND_WAIT = """
import sys, time
from adapters.sqlite import SQLiteStorage
SQLiteStorage(sys.argv[1]).get_job("x")
print("open", flush=True)
time.sleep(30)
"""


def test_a_second_process_on_the_file_is_warned_of_the_wal_defect_once(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "w.db")
    other = subprocess.Popen([sys.executable, "-c", _OPEN_AND_WAIT, path], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "open"
        with caplog.at_level(logging.WARNING, logger="pipelines"):
            first, second = SQLiteStorage(path), SQLiteStorage(path)
            first.get_job("x")
            second.get_job("x")
            reader = threading.Thread(target=first.get_job, args=("x",))  # another connection: no second warning
            reader.start()
            reader.join()
    finally:
        other.kill()
        other.wait()
        assert other.stdout is not None
        other.stdout.close()
    warned = [r for r in caplog.records if "WAL-reset defect" in r.getMessage()]
    assert len(warned) == (1 if wal_defect() else 0)
    if warned:
        assert "2 processes" in warned[0].getMessage() and sqlite3.sqlite_version in warned[0].getMessage()


def test_one_process_alone_is_not_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        SQLiteStorage(str(tmp_path / "alone.db")).get_job("x")
    assert not [r for r in caplog.records if "WAL-reset defect" in r.getMessage()]


# --- the live stream ----------------------------------------------------------------------------------
def part(text: str) -> Event:
    return Event(timestamp=1.0, type="text_delta", turn=1, data={"text": text})


def test_a_follower_in_this_process_is_woken_by_a_publish(tmp_path: Path) -> None:
    storage = SQLiteStorage(str(tmp_path / "live.db"))
    storage.create_job(record(), events=[Event(timestamp=1.0, type="job_started")])
    start = storage.read_live("j")[-1].id
    got: list[Event] = []
    follower = threading.Thread(target=lambda: got.extend(storage.read_live("j", after=start, block=30)))
    follower.start()
    time.sleep(0.1)
    SQLiteStorage(str(tmp_path / "live.db")).publish("j", [part("hé")])  # another storage object, same file
    follower.join(30)
    assert [p.data["text"] for p in got] == ["hé"]


_PUBLISH_LATER = """
import sys, time
from adapters.sqlite import SQLiteStorage
from pipelines.engine.models import Event
time.sleep(0.3)
SQLiteStorage(sys.argv[1]).publish("j", [Event(timestamp=1.0, type="text_delta", turn=1, data={"text": "far"})])
"""


def test_a_follower_sees_what_another_process_publishes(tmp_path: Path) -> None:
    path = str(tmp_path / "live2.db")
    storage = SQLiteStorage(path)
    storage.create_job(record())
    other = subprocess.Popen([sys.executable, "-c", _PUBLISH_LATER, path], cwd=ROOT)
    try:
        got = storage.read_live("j", block=30)
    finally:
        other.wait(30)
    assert [p.data["text"] for p in got] == ["far"]


def test_the_live_stream_keeps_the_run_in_flight_and_the_one_before_and_every_event(tmp_path: Path) -> None:
    storage = SQLiteStorage(str(tmp_path / "trim.db"))
    rec = record()
    storage.create_job(rec, events=[Event(timestamp=1.0, type="job_started")])

    def commit(turn: int, *events: Event) -> None:
        nonlocal rec
        storage.publish("j", [part(f"t{turn}")])
        new = rec.model_copy(update={"version": rec.version + 1})
        storage.commit(Commit(job_id="j", expected_version=rec.version, token=f"c{turn}", record=new,
                              events=[Event(timestamp=1.0, type="turn_committed", turn=turn), *events]))
        rec = new

    def live() -> list[tuple[str, Any]]:
        return [(p.type, p.data.get("text")) for p in storage.read_live("j")]

    for turn in range(1, 4):
        commit(turn)
    # The run's parts all stay (a client resuming its message is rebuilt from them), with the committed events.
    first_run = [("job_started", None), *[x for t in (1, 2, 3) for x in (("text_delta", f"t{t}"),
                                                                          ("turn_committed", None))]]
    assert live() == first_run
    # A commit that starts a run (a conversation continued) keeps the run before it: a client may still resume it.
    commit(4, Event(timestamp=1.0, type="job_continued"))
    commit(5)
    second_run = [("job_continued", None), ("text_delta", "t5"), ("turn_committed", None)]
    assert live() == [*first_run, ("text_delta", "t4"), ("turn_committed", None), *second_run]
    # The next run start drops the parts before the previous one's start; committed events stay.
    commit(6, Event(timestamp=1.0, type="job_continued"))
    assert live() == [("job_started", None), *[("turn_committed", None)] * 4, *second_run,
                      ("text_delta", "t6"), ("turn_committed", None), ("job_continued", None)]
    assert [e.id for e in storage.events("j")] == [p.id for p in storage.read_live("j") if p.type != "text_delta"]


def test_a_finished_jobs_live_parts_go_after_live_ttl_its_events_stay(tmp_path: Path) -> None:
    now = [1000.0]
    storage = SQLiteStorage(str(tmp_path / "ttl.db"), clock=lambda: now[0], live_ttl=60)
    for job_id, status in (("done", JobStatus.COMPLETE), ("running", JobStatus.RUNNING)):
        rec = record(job_id)
        storage.create_job(rec, events=[Event(timestamp=1.0, type="job_started")])
        storage.publish(job_id, [part("hello")])
        storage.commit(Commit(job_id=job_id, expected_version=rec.version, token="c1",
                              record=rec.model_copy(update={"version": 2, "status": status, "updated_at": now[0]}),
                              events=[Event(timestamp=1.0, type="turn_committed", turn=1)]))
    texts = {j: [p.data.get("text") for p in storage.read_live(j) if p.type == "text_delta"]
             for j in ("done", "running")}
    assert texts == {"done": ["hello"], "running": ["hello"]}
    storage.reap_dead_processes()  # within live_ttl: kept
    assert [p.type for p in storage.read_live("done")] == ["job_started", "text_delta", "turn_committed"]
    now[0] += 61
    storage.reap_dead_processes()
    assert [p.type for p in storage.read_live("done")] == ["job_started", "turn_committed"]
    assert [p.type for p in storage.read_live("running")] == ["job_started", "text_delta", "turn_committed"]
    with pytest.raises(ConfigurationError, match="live_ttl must be a finite number of seconds > 0"):
        SQLiteStorage(str(tmp_path / "ttl.db"), live_ttl=0)


# --- a busy file, and no transaction across a call -------------------------------------------------------
def test_a_write_waits_out_another_connections_long_transaction(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    storage = SQLiteStorage(str(path), busy_timeout=0.05)  # SQLite gives up at once; the adapter waits on
    storage.create_job(record())
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    try:
        storage.request_control("j", "pause")  # no "database is locked" comes out
    finally:
        release.join()
        holder.close()
    got = storage.get_job("j")
    assert got is not None and got.control == "pause"


def test_no_write_lock_is_held_while_a_model_or_tool_runs(tmp_path: Path) -> None:
    path = tmp_path / "calls.db"
    seen: list[str] = []

    def try_to_write(where: str) -> None:
        # Another writer with no patience at all: it gets the lock only if no transaction holds it.
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            seen.append(where)
        finally:
            other.close()

    @tool
    def look(q: str) -> str:
        """Looks."""
        try_to_write("tool")
        return "found"

    def model(messages: list[Any]) -> Any:
        try_to_write("model")
        return reply(None, call("look", q="x")) if len(messages) == 1 else "done"

    storage = SQLiteStorage(str(path))
    app = App(storage=storage, scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(model), tools=[look])])
    assert app.run_agent("a", job_id="c", user="hi").wait().status is JobStatus.COMPLETE
    assert seen == ["model", "tool", "model"]


# --- the records this process keeps with their history apart (adapters.sqlite.history) -----------------
def test_a_record_with_history_reads_back_the_same_whether_this_process_kept_it_or_not(tmp_path: Path) -> None:
    path = str(tmp_path / "history.db")
    storage = SQLiteStorage(path)
    rec = record().model_copy(update={"history": [TurnMark(phases_done=0, state={"turn": 0})]})
    storage.create_job(rec)
    new = None
    for turn in range(1, 6):
        loaded = storage.acquire_lease("j", "w", 30)
        assert loaded is not None
        if new is not None:  # the lease is handed the marks this process kept: the very ones it committed
            assert all(a is b for a, b in zip(loaded.history, new.history, strict=True))
        marks = [*loaded.history, TurnMark(phases_done=turn, transcript_len=turn, next_phase="a",
                                           state={"turn": turn, "text": "é"})]
        new = loaded.model_copy(update={"version": loaded.version + 1, "history": marks[-3:]})  # one dropped too
        storage.commit(Commit(job_id="j", expected_version=loaded.version, token=f"c{turn}", record=new,
                              owner="w"))
        stored = sqlite3.connect(path).execute("SELECT record FROM jobs").fetchone()[0]
        # The text in the file is the whole record, as every process (and version) reads it.
        assert json.loads(stored) == json.loads(dump_record(new, "the record"))
        again = storage.get_job("j")
        assert again == new
        # A reader's marks are its own (a mark's state is a dict it could change): parsed, not the kept ones.
        assert not any(a is b for a, b in zip(again.history, new.history, strict=True))
        other = SQLiteStorage(path)  # another process: nothing kept, the whole text parsed
        assert other.get_job("j") == new
        other.close()
    assert [m.phases_done for m in new.history] == [3, 4, 5]
    # A commit from elsewhere (another process) is read whole: what this process kept is not used.
    other = SQLiteStorage(path)
    theirs = new.model_copy(update={"version": new.version + 1, "history": [TurnMark(phases_done=9)]})
    other.commit(Commit(job_id="j", expected_version=new.version, token="theirs", record=theirs))
    assert storage.get_job("j") == theirs
    other.close()
    storage.close()


class _InterruptedAfterBegin:
    """A thread's connection whose next ``BEGIN`` goes through and is then interrupted (a signal landing there)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.armed = conn, True

    def execute(self, sql: str, *args: Any) -> Any:
        done = self.conn.execute(sql, *args)
        if self.armed and sql.startswith("BEGIN"):
            self.armed = False
            raise KeyboardInterrupt
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


@pytest.mark.parametrize("durable", [True, False])
def test_an_interrupt_right_after_begin_leaves_no_transaction_open_to_lock_the_file(
        tmp_path: Path, durable: bool) -> None:
    storage = SQLiteStorage(tmp_path / "a.db")
    storage.create_job(record())
    real = storage._db.connection()
    storage._db._local.conn = _InterruptedAfterBegin(real)  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        if durable:
            storage.request_control("j", "pause")
        else:
            storage.acquire_lease("j", "w", 30)  # a lease is written without a sync of its own
    assert not real.in_transaction
    other = sqlite3.connect(tmp_path / "a.db", timeout=0.2, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer (another process) is not locked out
    other.execute("ROLLBACK")
    other.close()
    assert pragma(tmp_path / "a.db", "journal_mode") == "wal"
    assert real.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again after a relaxed write
    assert storage.acquire_lease("j", "w", 30) is not None and storage.request_control("j", "pause")
    storage.close()


def test_a_transaction_an_interrupt_left_open_goes_before_the_next_write(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path / "a.db")
    storage.create_job(record())
    storage._db.connection().execute("BEGIN IMMEDIATE")  # left open: an interrupt inside the rollback's handler
    assert storage.acquire_lease("j", "w", 30) is not None
    assert not storage._db.connection().in_transaction
    storage.close()


def test_a_process_whose_first_write_met_a_busy_file_is_registered_all_the_same(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    first = SQLiteStorage(path)
    first.create_job(record())
    first.close()
    with sqlite3.connect(path) as admin:
        admin.execute("DELETE FROM processes")  # as if this process had never written to it
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    releaser = threading.Timer(0.5, lambda: blocker.execute("COMMIT"))
    releaser.start()
    storage = SQLiteStorage(path, busy_timeout=0.1)  # its first write waits out the blocker, retried
    assert storage.acquire_lease("j", "w", 30) is not None
    releaser.join()
    with sqlite3.connect(path) as admin:
        pids = [row[0] for row in admin.execute("SELECT pid FROM processes")]
    assert os.getpid() in pids
    blocker.close()
    storage.close()


def test_a_child_forked_while_another_thread_writes_can_write_to_the_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite notes the locks a process holds in its memory: a child forked while a thread of the parent held
    # the write lock inherited that note and was refused "database is locked" for good. The fork now waits for
    # the write to end.
    monkeypatch.setattr(connection, "RETRY_SECONDS", 2.0)  # a locked-out child fails in seconds, not minutes
    storage = SQLiteStorage(str(tmp_path / "fork.db"), busy_timeout=1)
    storage.create_job(JobRecord(job_id="warm", status=JobStatus.RUNNING, version=1))
    inside = threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE jobs SET updated_at = 1 WHERE job_id = 'warm'")
        inside.set()
        time.sleep(0.5)

    writer = threading.Thread(target=lambda: storage._db.write(slow, "a slow commit"))
    writer.start()
    assert inside.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: one write, its result as the exit code
        try:
            storage.create_job(JobRecord(job_id="child", status=JobStatus.RUNNING, version=1))
            os._exit(0)
        except BaseException:  # noqa: BLE001 - any failure is the test's
            os._exit(3)
    writer.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert storage.get_job("child") is not None
    storage.close()


def test_a_string_utf8_cannot_carry_is_refused_as_bad_input_naming_it(tmp_path: Path) -> None:
    from pipelines.engine.errors import InvalidInputError

    storage = SQLiteStorage(str(tmp_path / "surrogate.db"))
    storage.create_job(record())
    lone = "x\ud83dy"  # half of a surrogate pair: UTF-8 (and so SQLite) cannot hold it
    for call_it in (lambda: storage.get_job(lone), lambda: storage.messages(lone),
                    lambda: storage.acquire_lease("j", lone, 30), lambda: storage.request_control("j", lone)):
        with pytest.raises(InvalidInputError, match=r"holds '\\ud83d', a lone surrogate") as caught:
            call_it()
        str(caught.value).encode()  # the message itself can be written anywhere (a log file, a page)
    assert storage.lease_owner("j") is None and storage.get_job("j").control is None  # type: ignore[union-attr]


def test_a_job_made_again_under_a_deleted_ones_id_numbers_its_parts_above_every_old_cursor(tmp_path: Path) -> None:
    # Parts were numbered from 1 for each job: a follower's cursor from the deleted job (an SSE Last-Event-ID)
    # skipped as many of the new job's events and parts.
    storage = SQLiteStorage(str(tmp_path / "jobs.db"))
    app = App(storage=storage, scheduler=MemoryScheduler(),
              agents=[Agent(name="a", model=ScriptedModel(lambda msgs: f"said {msgs[-1]['content']}"))])
    app.run_agent("a", job_id="chat", messages=["first life"])
    app.drain()
    old_event = app.events("chat")[-1].id
    old_part = list(app.stream("chat", follow=False))[-1].id
    app.delete("chat")
    app.run_agent("a", job_id="chat", messages=["second life"])
    app.drain()
    assert [e.type for e in app.events("chat", after=old_event)] == [e.type for e in app.events("chat")]
    again = list(app.stream("chat", after=old_part, follow=False))
    assert again and [p.id for p in again] == [p.id for p in app.stream("chat", follow=False)]
    assert app.messages("chat")[-1]["content"] == "said second life"
    storage.close()


@pytest.mark.parametrize(("error", "fix"), [
    (sqlite3.OperationalError("database is locked"), "another process held the file's write lock"),
    (sqlite3.DatabaseError("file is not a database"), "is that path the app's SQLite file?"),
    (sqlite3.OperationalError("attempt to write a readonly database"), "can this process read and write the file"),
])
def test_an_unusable_file_says_what_to_check_for_its_own_failure(error: sqlite3.Error, fix: str) -> None:
    # One hint ("read and write access, a disk with room") was given for a held write lock and a file that is
    # not SQLite too.
    from adapters.sqlite.connection import _unavailable

    unavailable = _unavailable("/data/app.db", error, "writing")
    assert str(unavailable).startswith("the SQLite file /data/app.db failed writing")
    assert getattr(unavailable, "fix", "").startswith(fix)


def test_a_record_that_is_not_json_does_not_stop_a_claim_by_pipeline(tmp_path: Path) -> None:
    # A claim that asks for its App's pipelines reads each due record's name; one record damaged by hand
    # made that read fail the whole claim, so no job of the file was claimed again.
    path = str(tmp_path / "c.db")
    storage = SQLiteStorage(path)
    storage.create_job(record("good"))
    storage.create_job(record("bad"))
    storage.create_job(record("theirs").model_copy(update={"pipeline": "another app's"}))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET record = '{truncated' WHERE job_id = 'bad'")
    # The damaged one is claimed whatever its pipeline (its advance says what is wrong), the others by theirs.
    assert sorted(storage.claim_due(1e12, limit=5, hold=60, pipelines=["default"])) == ["bad", "good"]
    assert storage.claim_due(1e12, limit=5, hold=60, pipelines=["another app's"]) == ["theirs"]


class _Clock:
    """A lease clock a test moves: a whole-process stall (Ctrl-Z, a laptop asleep) or a wall-clock step."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_a_process_does_not_take_over_its_own_turn_after_it_stood_still(tmp_path: Path) -> None:
    path = str(tmp_path / "stall.db")
    clock = _Clock()
    storage = SQLiteStorage(path, clock=clock)
    storage.create_job(record("mine"))
    storage.create_job(record("theirs"))
    done = run_python(_TAKE_LEASE_AND_DIE.replace('"j"', '"theirs"'), path)  # a process that died mid-turn
    assert done.returncode == 0, done.stderr
    assert storage.acquire_lease("mine", "worker-1", 10) is not None  # a worker thread of this process
    clock.now += 3600  # the process stood still for an hour (or the clock stepped): every lease looks run out
    # The dead process's turn is taken over; this live process's own is not (its worker thread still runs it).
    assert storage.claim_due(1e12, limit=5, hold=60) == ["theirs"]
    # Its worker thread journals its step and commits before the lease keeper looked again: nobody took the
    # lease, so that is not fenced off (which would run the turn's tools again, one after the other).
    storage.record_step("mine", version=1, owner="worker-1", key="tool:1", value="done")
    rec = record("mine")
    storage.commit(Commit(job_id="mine", expected_version=1, token="t1", owner="worker-1", release_lease=False,
                          record=rec.model_copy(update={"version": 2})))
    # When the process runs again its lease keeper renews the lease nobody took (the commit kept it, as it
    # asked), and the turn goes on.
    assert storage.renew_lease("mine", "worker-1", 10) is True
    assert storage.lease_state("mine") == ("worker-1", False)
    storage.release_lease("mine", "worker-1")
    assert storage.claim_due(1e12, limit=5, hold=60) == ["mine"]  # let go: claimed as ever
    # A lease of the dead process that ran out fences its worker off, as ever.
    with pytest.raises(StaleVersionError):
        storage.record_step("theirs", version=1, owner="dead-worker", key="tool:1", value="late")
    storage.close()


def test_a_run_out_lease_naming_this_process_that_no_thread_of_it_holds_is_claimed(tmp_path: Path) -> None:
    # An orphan: left by a dead process whose pid (and pid namespace) this one reuses (a restarted container's
    # pid 1), or by a release that failed. It named this process, so it was never claimed: the job stayed running.
    from adapters.sqlite import processes

    path = str(tmp_path / "orphan.db")
    clock = _Clock()
    storage = SQLiteStorage(path, clock=clock)
    storage.create_job(record("orphan"))
    storage.create_job(record("held"))
    assert storage.acquire_lease("held", "worker-1", 10) is not None
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE jobs SET lease_owner = 'ghost', lease_expires = ?, lease_proc = ? WHERE job_id = "
                     "'orphan'", (clock.now + 10, processes.me()))
    conn.close()
    clock.now += 3600
    assert storage.claim_due(1e12, limit=5, hold=60) == ["orphan"]  # not 'held': a thread of this process runs it
    storage.close()


def test_a_release_of_dead_processes_that_rolled_back_is_not_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from adapters.sqlite import processes
    from pipelines.engine.errors import StorageUnavailableError

    path = str(tmp_path / "full.db")
    storage = SQLiteStorage(path)
    storage.create_job(record("j"))
    done = run_python(_TAKE_LEASE_AND_DIE, path)
    assert done.returncode == 0, done.stderr
    real = processes.reap

    def then_the_disk_is_full(conn: sqlite3.Connection) -> Any:
        real(conn)
        raise sqlite3.OperationalError("database or disk is full")  # as COMMIT fails on a full disk

    monkeypatch.setattr(processes, "reap", then_the_disk_is_full)
    caplog.set_level(logging.INFO, logger="pipelines")
    for _ in range(3):
        with pytest.raises(StorageUnavailableError, match="disk is full"):
            storage.reap_dead_processes()
    assert storage.lease_owner("j") == "dead-worker"  # rolled back: nothing was released ...
    assert not [r for r in caplog.records if "is gone" in r.getMessage()]  # ... and nothing said so
    monkeypatch.setattr(processes, "reap", real)
    storage.reap_dead_processes()
    said = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("is gone; its leases and claims are released"), said  # committed
    assert storage.lease_owner("j") is None
    storage.close()


def test_a_reader_reads_a_file_it_cannot_write_and_its_first_write_notes_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.sqlite import processes

    path = str(tmp_path / "ro.db")
    made = SQLiteStorage(path)
    made.create_job(record("j"))
    made.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM processes")  # the maker is gone
    real = processes.register

    def cannot_write(conn: sqlite3.Connection, where: str) -> int:
        raise sqlite3.OperationalError("attempt to write a readonly database")  # a full disk, a read-only mount

    monkeypatch.setattr(processes, "register", cannot_write)
    reader = SQLiteStorage(path)
    got = reader.get_job("j")  # pipelines jobs / status / ui --read-only: what sqlite3 reads, this reads
    assert got is not None and got.version == 1 and reader.count_jobs(JobStatus.RUNNING) == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM processes").fetchone()[0] == 0  # nothing written
    # Writable again: the first write (a lease names this process) notes the process before it.
    assert reader.acquire_lease("j", "w", 30) is not None
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT pid FROM processes").fetchall() == [(os.getpid(),)]
    monkeypatch.setattr(processes, "register", real)
    reader.close()
