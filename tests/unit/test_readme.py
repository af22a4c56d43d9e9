"""The README is a guide that stays true: its code runs as written, and what the docs cite exists.

- Every Python block of the README runs as written, offline, in a temp dir (a block that defines
  ``test_*`` functions runs under pytest). The "Production in one screen" blocks need a redis-server and
  a worker: ``tests/system/test_readme_production.py`` runs those. Shell blocks of ``make`` commands are
  the repository's own (``make test`` is this suite).
- Every test the README or a docs page cites as evidence exists, and every file it names.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_blocks import Block, blocks

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = "Production in one screen"  # its blocks run against redis-server and a worker (system test)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_test_named_in_the_readme_and_the_docs_exists() -> None:
    text = "\n".join(p.read_text() for p in DOCS)
    cited = set(re.findall(r"`(test_[a-z0-9_]+)`", text))
    files = set(re.findall(r"`(tests/[\w/]+\.py)`", text))
    defined = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), flags=re.M))
    assert len(cited) >= 15
    assert cited <= defined, f"the docs cite tests that do not exist: {sorted(cited - defined)}"
    assert [f for f in files if not (ROOT / f).is_file()] == []


def test_the_readme_is_a_guide_with_two_commands_and_working_links() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    [two] = [b for b in blocks() if b.section == "Two commands"]
    assert [c.split()[:2] for c in two.commands()] == [["make", "demo"], ["make", "test"]]
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links and [link for link in links if not (ROOT / link).exists()] == []


def test_the_quickstart_runs_as_written() -> None:
    quickstart = next(b for b in blocks() if b.section == "Quickstart" and b.lang == "python")
    out = subprocess.run([sys.executable, "-"], input=quickstart.text, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "complete It has shipped.\n['system', 'user', 'assistant', 'tool', 'assistant']\n"


def runnable() -> list[Block]:
    return [b for b in blocks() if b.lang == "python" and b.section != PRODUCTION]


@pytest.mark.parametrize("block", runnable(), ids=lambda b: re.sub(r"\W+", "-", b.section).strip("-").lower())
def test_every_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    assert block.file is None, "a file block outside the production section: run it in a test that uses it"
    if re.search(r"^def test_", block.text, flags=re.M):
        (tmp_path / "test_readme_block.py").write_text(block.text)
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "test_readme_block.py"]
    else:
        (tmp_path / "block.py").write_text(block.text)
        args = [sys.executable, "block.py"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PIPELINES_BLOCK_REMOTE_MODELS": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_OFFLINE_MODE": "true"}
    out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    if block.section == "Pipelines":
        assert out.stdout == "{'smallest': 1}\n"
    if block.section == "Testing your agent":
        assert "1 passed" in out.stdout


def test_every_readme_block_is_run_by_a_test() -> None:
    found = blocks()
    assert len(found) >= 7
    for block in found:
        ran = block.is_make or (block.lang == "python" and block.section != PRODUCTION) or block.section == PRODUCTION
        assert ran, f"a {block.lang} block in {block.section!r} that no test runs"
    production = [b for b in found if b.section == PRODUCTION]
    assert [b.lang for b in production] == ["python", "python", "sh"] and production[0].file == "myapp/agents.py"
