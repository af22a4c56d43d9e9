"""The API reference builds offline and by static analysis: `make docs` never imports litellm, redis or rq."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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


def test_the_reference_builds_strictly_offline_without_importing_the_code(tmp_path: Path) -> None:
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-c", BUILD, str(site)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "imported": []}, run.stderr
    # One page per public area, each with the documented module's own docstring in it.
    errors_page = (site / "reference" / "errors" / "index.html").read_text()
    assert "pipelines.engine.errors" in errors_page
    assert "InvalidInputError" in errors_page
    pages = sorted(p.name for p in (site / "reference").iterdir() if p.is_dir())
    assert pages == ["agents", "app", "errors", "pipelines", "storage", "testing"]
