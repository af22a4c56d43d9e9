"""kill -9 on SQLite: worker processes (one, and four sharing the file) killed at random while W1-like agent jobs
run; every job completes, each transcript exactly as a run without crashes writes it. And eight processes
committing to one file at once: no lock error reaches a caller, every turn is committed exactly once."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from adapters.sqlite import SQLiteStorage
from pipelines import JobStatus
from tests.apps import sqlite_app
from tests.apps.sqlite_app import Workers
from tests.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


def unfinished(storage: SQLiteStorage, ids: list[str]) -> list[str]:
    return [j for j in ids if (r := storage.get_job(j)) is None or r.status is not JobStatus.COMPLETE]


@pytest.mark.parametrize("processes", [1, 4])
def test_kill_9_at_random_every_job_completes_with_its_exact_transcript(tmp_path: Path, processes: int,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path, effects = tmp_path / "w1.db", tmp_path / "effects.db"
    monkeypatch.setenv("PIPELINES_SQLITE_PATH", str(path))
    monkeypatch.setenv("PIPELINES_EFFECTS_PATH", str(effects))  # the tool's effects, counted in their own file
    starter = sqlite_app.build(workers=0)  # the web process: it starts runs and runs none
    # Twelve jobs per process: four fast processes once finished twelve jobs before the third kill landed.
    # Even jobs use the retry tool, odd ones the non-idempotent one that reconciles after a crash.
    ids = [f"w1-{n}" for n in range(12 * processes)]
    for n, job_id in enumerate(ids):
        starter.run_agent("w1" if n % 2 == 0 else sqlite_app.RECONCILE_AGENT, job_id=job_id, user="go")
    storage = starter.storage
    assert isinstance(storage, SQLiteStorage)
    workers = Workers(path, tmp_path)
    rng = random.Random(32 + processes)
    kills = 0
    try:
        for _ in range(processes):
            workers.start()
        deadline = time.monotonic() + 150
        while unfinished(storage, ids) and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.4))
            if kills < 10 and unfinished(storage, ids):
                workers.kill(rng.choice(workers.procs))  # mid-turn or between turns, whichever it hits
                kills += 1
                workers.start()
        left = unfinished(storage, ids)
        assert not left, f"unfinished after {kills} kills: {left}\n{workers.logs()}"
    finally:
        workers.stop_all()
    assert kills >= 3, f"the jobs finished after {kills} kills: too few crashes to prove anything"
    want = sqlite_app.expected()
    for job_id in ids:
        messages = storage.messages(job_id)
        assert [(m["role"], m.get("content")) for m in messages] == want, job_id
        calls = [m["tool_calls"][0]["id"] for m in messages if m.get("tool_calls")]
        answers = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
        assert calls == answers and len(set(calls)) == len(calls)  # each call answered once, in order
        record = storage.get_job(job_id)
        assert record is not None and record.transcript_len == len(messages) and record.result == "done"
    conn = sqlite_app.effects_db(str(effects))
    applied = Counter(key for (key,) in conn.execute("SELECT key FROM applied"))
    conn.close()
    for n, job_id in enumerate(ids):
        calls = [m["tool_calls"][0]["id"] for m in storage.messages(job_id) if m.get("tool_calls")]
        counts = [applied[f"{job_id}/{c}"] for c in calls]
        assert all(counts), (job_id, counts)  # every call's effect landed
        if n % 2:  # reconcile: never applied twice, however the kills fell
            assert counts == [1] * len(calls), (job_id, counts)
    assert sum(applied.values()) - len(applied) <= kills  # retry: again only after a kill mid-call


_COMMITTER = """
import os, sys
from adapters.sqlite import SQLiteStorage
from pipelines.engine.errors import StaleVersionError
from pipelines.engine.models import Commit

storage = SQLiteStorage(sys.argv[1])
shared, own, me = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
won = 0
while True:
    progress = False
    for job in [f"shared-{n}" for n in range(shared)] + [f"own-{me}"]:
        rec = storage.acquire_lease(job, me, 30)
        if rec is None:
            continue  # another process runs its turn now
        target = own if job.startswith("own") else own * 2
        if rec.version > target:
            storage.release_lease(job, me)
            continue
        progress = True
        storage.record_step(job, version=rec.version, owner=me, key="model", value={"by": me})
        new = rec.model_copy(update={"version": rec.version + 1, "transcript_len": rec.transcript_len + 1})
        storage.commit(Commit(job_id=job, expected_version=rec.version, owner=me, token=f"{me}-{job}-{rec.version}",
                              record=new, append_messages=[{"role": "assistant", "content": str(rec.version)}]))
        won += 1
    if not progress and all((r := storage.get_job(j)) is not None and r.version > (own if j.startswith("own")
                            else own * 2) for j in [f"shared-{n}" for n in range(shared)] + [f"own-{me}"]):
        break
print(won)
"""


def test_eight_processes_committing_to_one_file_commit_every_turn_exactly_once(tmp_path: Path) -> None:
    from pipelines.engine.models import Checkpoint, JobRecord

    path = tmp_path / "busy.db"
    storage = SQLiteStorage(str(path))
    shared, own, procs = 3, 15, 8

    def job(job_id: str) -> JobRecord:
        cp = Checkpoint[object](next_phase="a", state={}, version=1, due_at=1.0)
        return JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=1)

    for n in range(shared):
        storage.create_job(job(f"shared-{n}"))
    for n in range(procs):
        storage.create_job(job(f"own-p{n}"))
    children = [subprocess.Popen([sys.executable, "-c", _COMMITTER, str(path), str(shared), str(own), f"p{n}"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=die_with_parent) for n in range(procs)]
    outputs = [c.communicate(timeout=300) for c in children]
    for child, (_, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0 and "locked" not in err, err  # no error of any kind came out
    committed = sum(int(out.strip()) for out, _ in outputs)
    assert committed == shared * own * 2 + procs * own  # every commit that returned landed...
    for job_id, turns in [*((f"shared-{n}", own * 2) for n in range(shared)),
                          *((f"own-p{n}", own) for n in range(procs))]:
        record = storage.get_job(job_id)
        assert record is not None and record.version == turns + 1, job_id
        # ... exactly once, in order, none lost.
        assert [m["content"] for m in storage.messages(job_id)] == [str(v) for v in range(1, turns + 1)], job_id
