"""`bench/run.py --quick` runs to the end and prints its table (no speed is asserted, ever)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_quick_exits_0_and_prints_the_table() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPELINES_APP", None)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    assert "phaserunner bench results" in out.stdout
    assert "| #" in out.stdout and "| figure" in out.stdout
