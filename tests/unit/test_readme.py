"""The README stays true: every test it cites as evidence exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_named_in_the_readme_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    cited = set(re.findall(r"`(test_[a-z0-9_]+)`", readme))
    files = set(re.findall(r"`(tests/[\w/]+\.py)`", readme))
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), flags=re.M))
    assert len(cited) >= 15
    assert cited <= defined, f"README cites tests that do not exist: {sorted(cited - defined)}"
    assert all((ROOT / f).is_file() for f in files), files


def test_the_quickstart_runs_as_written() -> None:
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()
    quickstart = re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0]
    out = subprocess.run([sys.executable, "-"], input=quickstart, cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("complete It has shipped.\n")
