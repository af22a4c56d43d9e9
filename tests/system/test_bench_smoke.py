"""`bench/run.py` runs to the end and prints its table (no speed is asserted, ever).

``--smoke`` (every figure's code once, at the smallest sizes) runs in ``make test``; ``--quick``, the
CI-sized version whose figures mean something, in ``make test-all``. Figure 18 (``bench.stream_e2e``) at its
smallest, one stream, takes ~10 s (its worker's litellm start): ``make test-all`` only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["--smoke", pytest.param("--quick", marks=pytest.mark.slow)])
def test_bench_exits_0_and_prints_the_table_with_every_figure(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPELINES_APP", None)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), mode], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    assert "phaserunner bench results" in out.stdout and f"({mode[2:]};" in out.stdout
    assert "| #" in out.stdout and "| figure" in out.stdout
    for figure in ("1a", "2a", "3a", "4a", "5a", "6a"):  # every figure ran (redis-server is required here)
        assert f"| {figure} " in out.stdout, f"figure {figure} missing:\n{out.stdout[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_end_to_end_stream_bench_prints_every_row_of_figure_18() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PIPELINES_APP", None)
    out = subprocess.run([sys.executable, "-m", "bench.stream_e2e", "--streams", "1", "--runs", "1", "--turns", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    assert "1 concurrent active streams:" in out.stdout and "never reached" not in out.stdout, out.stdout
    for figure in "abcdefghijklmnop":
        assert f"  18{figure} " in out.stdout, f"figure 18{figure} missing:\n{out.stdout}"
