"""A child that watches its parent ends when the parent dies: PR_SET_PDEATHSIG, the polling fallback, a late watch.

A real process tree: a fresh interpreter (the parent) forks a child that
calls :func:`adapters.rq.lifeline.watch_parent` and then sleeps a minute;
the parent prints the child's pid and exits. The child must be gone within
seconds (tests/system/test_worker_death.py does the same with real workers).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TREE = """
import os, signal, sys, time
from adapters.rq import lifeline as rq_lifeline
mode = sys.argv[1]
if mode == "poll":
    rq_lifeline._prctl = None  # as on a system without prctl
parent = os.getpid()
child = os.fork()
if child == 0:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the test reads the parent's output to its end, not this child's
    os.dup2(devnull, 2)
    if mode == "late":
        while os.getppid() == parent:  # the parent dies before the watch is set
            time.sleep(0.01)
    rq_lifeline.watch_parent(signal.SIGKILL, parent, poll=0.05)
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
if mode == "late":
    os._exit(0)
time.sleep(0.3)  # the child has set its watch
os._exit(0)
"""


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("mode", ["prctl", "poll", "late"])
def test_a_watching_child_ends_with_its_parent(mode: str) -> None:
    out = subprocess.run([sys.executable, "-c", TREE, mode], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = running(child)
    if alive:
        os.kill(child, 9)
    assert not alive, f"the child outlived its parent ({mode})"
