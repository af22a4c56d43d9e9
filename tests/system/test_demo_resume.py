"""`make demo` on SQLite: stopped mid-run (kill -9, or Ctrl-C), the next run resumes the same job and says so."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.sqlite import SQLiteStorage
from tests.redis_server import ctrl_c_as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "PIPELINES_BLOCK_REMOTE_MODELS": "1"}



@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_stopped_demo_resumes_its_job_where_it_stopped(tmp_path: Path, stop: signal.Signals) -> None:
    db = tmp_path / "demo.db"
    demo = [sys.executable, "-u", "examples/support_agent.py", "--db", str(db)]
    first = subprocess.Popen([*demo, "--pace", "0.5"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_as_from_a_terminal)
    assert first.stdout is not None
    seen = []
    for line in first.stdout:  # the first turn committed; the second one's model call is under way
        seen.append(line)
        if line.startswith("turn 1:"):
            break
    first.send_signal(stop)
    rest, _ = first.communicate(timeout=60)
    assert "status:" not in rest, "".join(seen) + rest  # it did not get to finish
    if stop is signal.SIGINT:
        assert first.returncode == 130 and "run it again and the job resumes where it stopped" in rest
    started = next(line for line in seen if line.startswith("job ") and line.rstrip().endswith("running turns:"))
    job_id = started.split()[1]  # a name no job had (counting jobs gave a deleted one's number to a live one)
    assert job_id.startswith("support-")
    done = SQLiteStorage(str(db)).messages(job_id)
    assert 4 <= len(done) < 11  # system, user, the first turn's call and result, and less than the whole run

    second = subprocess.run([*demo, "--pace", "0"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                            timeout=120, check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming job {job_id} where it stopped: {len(done)} messages committed before the stop" in second.stdout
    assert "structured result: SupportAnswer(order_id='A-1001', order_status='shipped', refund_issued=True" \
        in second.stdout
    messages = SQLiteStorage(str(db)).messages(job_id)
    assert messages[:len(done)] == done  # what was committed stays as it was
    calls = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert calls == results and len(set(calls)) == len(calls) == 3  # every call answered once
    assert len(messages) == 11


def test_the_demo_still_runs_on_memory_adapters() -> None:
    out = subprocess.run([sys.executable, "examples/support_agent.py", "--memory"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "waiting for a person: issue_refund" in out.stdout and "status: complete" in out.stdout
    assert "SQLite" not in out.stdout


def test_a_second_demo_on_the_same_file_does_not_take_the_running_ones_job(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    demo = [sys.executable, "-u", "examples/support_agent.py", "--db", str(db)]
    first = subprocess.Popen([*demo, "--pace", "0.5"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:
            if line.startswith("job ") and line.rstrip().endswith("running turns:"):
                break
        second = subprocess.run([*demo, "--pace", "0"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                timeout=60, check=False)
        assert second.returncode == 1 and "another demo is running on" in second.stderr
        assert "resuming job" not in second.stdout
    finally:
        first.kill()
        first.communicate(timeout=60)
