"""A poison turn on real processes: a tool that kills its worker (``os._exit``) fails the job after the limit.

A supervisor (what systemd's ``Restart=always`` or a Deployment does) starts a new worker process each time one
dies. Without a count of interrupted turns the job's turn is handed to every new worker, which dies too, for
ever. With it the job ends ``error`` once ``max_interrupted_turns`` (5) workers died running it, and the next
worker lives on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.sqlite import SQLiteStorage
from pipelines import JobStatus
from pipelines.engine.runner import DEFAULT_MAX_INTERRUPTED_TURNS
from tests.apps import poison_app
from tests.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


def test_a_tool_that_kills_its_worker_fails_the_job_after_five_dead_workers_and_the_sixth_lives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINES_SQLITE_PATH", str(tmp_path / "poison.db"))
    monkeypatch.setenv("PIPELINES_POISON_LOG", str(tmp_path / "crashes.log"))
    env = dict(os.environ)
    starter = poison_app.build()  # the web process: it starts the run and runs none
    starter.run_agent(poison_app.AGENT, job_id="poisoned", messages=["go"])
    storage = starter.storage
    assert isinstance(storage, SQLiteStorage)

    deaths: list[int] = []
    proc: subprocess.Popen[bytes] | None = None
    log = tmp_path / "workers.log"
    deadline = time.monotonic() + 90
    try:
        with open(log, "ab") as out:
            while time.monotonic() < deadline and len(deaths) <= 2 * DEFAULT_MAX_INTERRUPTED_TURNS:
                if proc is None or proc.poll() is not None:  # the supervisor restarts a dead worker
                    if proc is not None:
                        deaths.append(proc.returncode)
                    proc = subprocess.Popen([sys.executable, "-m", "tests.apps.poison_app"], cwd=ROOT, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
                rec = storage.get_job("poisoned")
                if rec is not None and rec.status is not JobStatus.RUNNING:
                    time.sleep(1.0)  # the worker that failed it stays alive: no more deaths come
                    break
                time.sleep(0.05)
        assert proc is not None
        assert proc.poll() is None, f"the worker that failed the job died too\n{log.read_text()[-3000:]}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    crashes = (tmp_path / "crashes.log").read_text().split()
    rec = storage.get_job("poisoned")
    assert rec is not None
    assert rec.status is JobStatus.ERROR, (rec.status, deaths, log.read_text()[-3000:])
    assert deaths == [137] * DEFAULT_MAX_INTERRUPTED_TURNS  # five workers died, each in the tool
    assert len(crashes) == DEFAULT_MAX_INTERRUPTED_TURNS and len(set(crashes)) == DEFAULT_MAX_INTERRUPTED_TURNS
    assert rec.error is not None and rec.error.startswith(
        "job 'poisoned': its turn was interrupted 5 times in a row without committing (the worker process died "
        "or its lease ran out each time); failed so it does not take down more workers")
    assert [e.type for e in storage.events("poisoned")][-1] == "job_failed"
    text = log.read_text()
    for n in range(1, DEFAULT_MAX_INTERRUPTED_TURNS):  # each take-over of the dead worker's lease is logged
        assert f"its turn lost its lease without committing {n} time(s) in a row" in text, text[-3000:]
