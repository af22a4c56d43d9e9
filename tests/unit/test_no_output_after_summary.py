"""Nothing a test left running writes after pytest's summary: the suite ends it first, and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.leftovers import descendants, end_leftovers

ROOT = Path(__file__).resolve().parents[2]

# A test that leaves a process behind which writes to the terminal a moment later (as a worker whose
# redis-server was stopped at the session's end does), holding pytest's stdout open.
LEAKY = '''
import subprocess, sys

LEFT = []  # held, so no "still running" ResourceWarning at its collection: the process simply goes on

def test_leaves_a_process_behind():
    code = "import time; time.sleep(2); print('STRAY' + ' LINE', flush=True)"
    LEFT.append(subprocess.Popen([sys.executable, "-c", code]))
'''


def test_a_process_left_running_is_ended_before_the_summary_and_named(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
            "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path / "test_leaky.py")]
    # capture_output waits for every holder of the pipe: a leftover would show its line here, after the summary.
    run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "STRAY LINE" not in run.stdout + run.stderr
    assert " passed in " in lines[-1]  # the summary is the last thing written
    assert any(line.startswith("killed 1 process(es) tests left running: ") and "time.sleep(2)" in line
               for line in lines)


def test_descendants_are_found_below_children_and_ended() -> None:
    # A child that starts a grandchild: both are below this process, both are ended.
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                              "time.sleep(60)"])
    try:
        for _ in range(200):
            below = descendants(child.pid)
            if below:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(below) == 1
        assert set(descendants(os.getpid())) >= {child.pid, *below}
        named = end_leftovers(child.pid)
        assert len(named) == 1 and "time.sleep(60)" in named[0]
        child.kill()
        child.wait(10)
        assert descendants(child.pid) == []
    finally:
        child.kill()
        child.wait(10)
