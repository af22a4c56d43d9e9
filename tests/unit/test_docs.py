"""The docs site builds offline and by static analysis, and its reference is complete and linked.

`make docs` never imports litellm, redis, rq or the library itself (the CLI page is written by a child
process); the built reference shows no raw Sphinx role (each became a cross-reference or plain code),
documents every public module, and has every command of `pipelines` as its `--help` prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipelines", "adapters", "phases")

# Runs in a child: blocks every socket connection, builds the site with --strict, then reports which of
# the heavy packages got imported on the way.
BUILD = """
import json, socket, sys

def no_network(self, address):
    raise OSError(f"docs build tried to connect to {address!r}")

socket.socket.connect = no_network
sys.argv = ["mkdocs", "build", "--strict", "--quiet", "-d", sys.argv[1]]
from mkdocs.__main__ import cli
try:
    cli()
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "imported": [m for m in ("litellm", "redis", "rq", "pipelines", "adapters", "phases")
                                             if m in sys.modules]}))
"""

RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|data|attr|exc|obj|const):(?:<code>|`)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site, built once for this file's tests into a temp dir (strict, no network)."""
    out = tmp_path_factory.mktemp("docs") / "site"
    run = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "imported": []}, run.stderr
    yield out


def public_modules() -> list[str]:
    """Every module of the three packages whose dotted name has no part starting with ``_``."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if not any(part.startswith("_") for part in parts):
                found.append(".".join(parts))
    return found


def test_the_site_builds_strictly_offline_without_importing_the_code(site: Path) -> None:
    # One page per public area, each with the documented module's own docstring in it.
    errors_page = (site / "reference" / "errors" / "index.html").read_text()
    assert "pipelines.engine.errors" in errors_page
    assert "InvalidInputError" in errors_page
    pages = sorted(p.name for p in (site / "reference").iterdir() if p.is_dir())
    assert pages == ["agents", "app", "cli", "errors", "pipelines", "storage", "testing"]
    # Every guide page is in the navigation (no page only a search finds) and built.
    pages_md = sorted(p.stem for p in (ROOT / "docs" / "guide").glob("*.md"))
    nav = re.findall(r"^\s+- [^:]+: guide/([\w-]+)\.md$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert sorted(nav) == pages_md
    assert sorted(p.name for p in (site / "guide").iterdir() if p.is_dir()) == pages_md
    assert {"agents", "install", "long-lived", "operations", "pipelines", "production", "streaming",
            "testing"} <= set(pages_md)
    assert not (site / "hooks").exists()  # the build's own code is not published


def test_no_raw_sphinx_role_is_left_and_roles_became_links(site: Path) -> None:
    raw = {str(p.relative_to(site)): RAW_ROLE.findall(p.read_text()) for p in site.rglob("*.html")}
    assert {page: found for page, found in raw.items() if found} == {}
    app = (site / "reference" / "app" / "index.html").read_text()
    # pipelines.app's docstrings name :class:`JobView` and :mod:`pipelines.engine.flow`: links now.
    assert 'href="../pipelines/#pipelines.engine.flow"><code>pipelines.engine.flow</code></a>' in app
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#pipelines\.handle\.JobView"', app)


def test_every_public_module_is_in_the_reference(site: Path) -> None:
    lines = "".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    listed = set(re.findall(r"^::: ([\w.]+)", lines, flags=re.M))
    missing = [m for m in public_modules() if m not in listed]
    assert missing == [], f"add a `::: <module>` line to a page of docs/reference/ for: {missing}"
    built = "".join(p.read_text() for p in (site / "reference").rglob("index.html"))
    assert [m for m in public_modules() if f'id="{m}"' not in built] == []
    agents = (site / "reference" / "agents" / "index.html").read_text()
    for name in ("phases.children.pipeline_tool", "phases.children.agent_phase", "phases.compaction.Compaction",
                 "phases.callbacks.Lifecycle"):
        assert f'id="{name}"' in agents, name


def _help(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    from pipelines.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def test_the_cli_page_has_every_command_as_its_help_prints_it(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.cli import build_parser

    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli" / "index.html").read_text()))
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert len(commands) >= 20
    for name in ["", *commands]:
        text = _help([name] if name else [], monkeypatch)
        assert text.strip() in page, f"`pipelines {name} --help` is not on the CLI page as printed"
