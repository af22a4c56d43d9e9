"""``pipelines dev``: one process runs an app's runs on an SQLite file (workers, sweep, web page); ``pipelines
migrate`` upgrades that file's schema."""

from __future__ import annotations

import io
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from adapters.local import LocalScheduler
from adapters.sqlite import SQLiteStorage, schema
from pipelines import JobStatus
from pipelines.cli import main
from pipelines.dev import dev_app
from pipelines.engine.errors import ConfigurationError
from tests.apps import dev_app as dev_module
from tests.apps import sqlite_app
from tests.redis_server import ctrl_c_as_from_a_terminal, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_twin_runs_the_same_agents_and_pipelines_on_sqlite(tmp_path: Path) -> None:
    twin = dev_app(dev_module.app, db=str(tmp_path / "t.db"), workers=2)
    assert isinstance(twin.storage, SQLiteStorage) and twin.storage.path == str(tmp_path / "t.db")
    assert isinstance(twin.scheduler, LocalScheduler) and twin.scheduler.workers == 2
    assert twin.names == ["etl", "w1"] and twin.agents["w1"] is dev_module.app.agents["w1"]
    assert dev_app(twin) is twin  # already on SQLite with local workers: served as it is
    with pytest.raises(ConfigurationError, match="already keeps its runs in"):
        dev_app(twin, db=str(tmp_path / "other.db"))


def test_the_twin_keeps_the_apps_interrupted_turn_limit_and_its_flow_store(tmp_path: Path) -> None:
    from adapters.memory import MemoryScheduler, MemoryStorage
    from pipelines import App
    from pipelines.engine.flow import RateLimit

    agents = list(dev_module.app.agents.values())
    for limit in (20, None):
        app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=agents, max_interrupted_turns=limit)
        assert dev_app(app, db=str(tmp_path / f"{limit}.db")).max_interrupted_turns == limit
    # A flow store the app chose (one shared by its processes) is the twin's too ...
    chosen = MemoryStorage().flow_store()
    limits = [RateLimit(model="m", rpm=60)]
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=agents, rate_limits=limits,
              flow_store=chosen)
    assert dev_app(app, db=str(tmp_path / "chosen.db")).flow.store is chosen
    # ... while the memory storage's own default gives way to the file's.
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=agents, rate_limits=limits)
    twin = dev_app(app, db=str(tmp_path / "own.db"))
    assert type(twin.flow.store).__name__ == "SQLiteFlowStore"


def test_pipelines_dev_serves_runs_left_on_the_file_and_the_web_page(tmp_path: Path) -> None:
    db = tmp_path / "dev.db"
    starter = dev_app(dev_module.app, db=str(db), workers=0)  # another process started these runs
    ids = [f"d{n}" for n in range(3)]
    for job_id in ids:
        starter.run_agent("w1", job_id=job_id, user="go")
    web_port = free_port()
    out = tmp_path / "dev.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", "dev", "--app", "tests.apps.dev_app:app",
                                 "--db", str(db), "--workers", "2", "--port", str(web_port)], cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, preexec_fn=ctrl_c_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                (r := starter.storage.get_job(j)) is None or r.status is not JobStatus.COMPLETE for j in ids):
            assert proc.poll() is None, out.read_text()
            time.sleep(0.1)
        assert all(starter.storage.get_job(j).status is JobStatus.COMPLETE for j in ids), out.read_text()  # type: ignore[union-attr]
        page = ""
        while time.monotonic() < deadline and "d0" not in page:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/", timeout=5) as response:
                    page = response.read().decode()
            except OSError:
                time.sleep(0.1)
        assert all(j in page for j in ids)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    text = out.read_text()
    assert f"runs      {db}" in text and "agents    w1" in text and "pipelines etl" in text
    assert f"web page  http://127.0.0.1:{web_port}/" in text and "3 unfinished: picked up where they stopped" in text
    assert [(m["role"], m.get("content")) for m in starter.storage.messages("d0")] == sqlite_app.expected()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_pipelines_migrate_upgrades_the_file_or_says_there_is_nothing_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.db"
    monkeypatch.setenv("PIPELINES_SQLITE_PATH", str(path))
    monkeypatch.setattr(sqlite_app, "app", sqlite_app.build(), raising=False)
    sqlite_app.app.storage.get_job("x")  # type: ignore[attr-defined]  # the file, at this version
    assert run_cli("migrate", "--app", "tests.apps.sqlite_app:app")[:2] == (
        0, f"{path}: schema already at version {schema.SCHEMA_VERSION}; nothing to do\n")
    now = schema.SCHEMA_VERSION
    monkeypatch.setitem(schema.MIGRATIONS, now + 1, ["CREATE INDEX jobs_pipeline ON jobs (status)"])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)
    with pytest.raises(ConfigurationError, match="pipelines migrate"):
        SQLiteStorage(str(path)).get_job("x")  # a new connection refuses the older file
    with pytest.raises(ConfigurationError,
                       match=rf"version {now} now, and this phaserunner writes version {now + 1} .* nothing"):
        sqlite_app.app.storage.request_control("x", "pause")  # type: ignore[attr-defined]  # so does a write
    assert run_cli("migrate", "--app", "tests.apps.sqlite_app:app")[:2] == (
        0, f"{path}: schema upgraded from version {now} to {now + 1}\n")
    sqlite_app.app.storage.request_control("x", "pause")  # type: ignore[attr-defined]  # at the version again
    code, _, err = run_cli("migrate", "--app", "tests.apps.dev_app:app")
    assert code == 1 and "MemoryStorage keeps no schema version" in err


def _migrate(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setenv("PIPELINES_SQLITE_PATH", str(path))
    monkeypatch.setattr(sqlite_app, "app", sqlite_app.build(), raising=False)
    return run_cli("migrate", "--app", "tests.apps.sqlite_app:app")


def test_pipelines_migrate_refuses_a_missing_file_a_foreign_one_and_a_busy_one_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adapters.sqlite import connection

    for missing in (tmp_path / "typo.db", tmp_path / "no folder" / "app.db"):
        code, out, err = _migrate(missing, monkeypatch)
        assert (code, out) == (1, "") and "does not exist" in err and err.count("\n") == 1, err
        assert not missing.exists()  # a mistyped path is not made into a new, empty database
    (tmp_path / "notes.db").write_text("hello\n")
    code, _, err = _migrate(tmp_path / "notes.db", monkeypatch)
    assert code == 1 and "not a database" in err and err.count("\n") == 1, err
    # Another connection holds the write lock past the busy timeout: one line, not sqlite3's traceback.
    path = tmp_path / "busy.db"
    SQLiteStorage(str(path), busy_timeout=0.1).close()
    monkeypatch.setattr(connection, "RETRY_SECONDS", 0.2)
    monkeypatch.setattr(SQLiteStorage.__init__, "__kwdefaults__",
                        {**SQLiteStorage.__init__.__kwdefaults__, "busy_timeout": 0.1})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        code, _, err = _migrate(path, monkeypatch)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 1 and "locked" in err and err.count("\n") == 1, err


_HOLD_THE_FILE = """
import sys, time
from adapters.sqlite import SQLiteStorage
SQLiteStorage(sys.argv[1]).get_job("x")
print("open", flush=True)
time.sleep(60)
"""


def test_pipelines_migrate_refuses_a_file_another_live_process_has_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "used.db"
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_THE_FILE, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "open\n", proc.stderr
        now = schema.SCHEMA_VERSION  # a phaserunner with one more version: the file is an older one to it
        monkeypatch.setitem(schema.MIGRATIONS, now + 1, ["CREATE INDEX jobs_pipeline ON jobs (status)"])
        monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)
        code, _, err = _migrate(path, monkeypatch)
        assert code == 1 and f"in use by process {proc.pid}" in err and err.count("\n") == 1, err
    finally:
        proc.kill()
        proc.communicate()
    code, out, _ = _migrate(path, monkeypatch)  # gone: its row is no obstacle
    assert (code, out) == (0, f"{path}: schema upgraded from version {now} to {now + 1}\n")


def test_pipelines_dev_on_a_file_that_needs_migrating_says_so_in_one_line_and_starts_no_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import threading

    path = tmp_path / "old.db"
    SQLiteStorage(str(path)).get_job("x")  # the file, at this version
    now = schema.SCHEMA_VERSION  # a newer phaserunner: the file needs `pipelines migrate`
    monkeypatch.setitem(schema.MIGRATIONS, now + 1, ["CREATE INDEX jobs_later ON jobs (status)"])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)
    code, out, err = run_cli("dev", "--app", "tests.apps.dev_app:app", "--db", str(path), "--port", str(free_port()))
    assert (code, out) == (1, "") and "pipelines migrate" in err and err.count("\n") == 1, err
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no worker thread's traceback before it
    assert not [t for t in threading.enumerate() if t.name.startswith("pipelines-local")]
