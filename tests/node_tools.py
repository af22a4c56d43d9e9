"""The AI SDK check's tools: ``node`` runs tests/node/read_ui_message.mjs, ``npm`` installs its locked ``ai``.

``python -m tests.node_tools`` (what ``make node-deps`` runs) installs the package with ``npm ci`` in
tests/node when node and npm are both there; otherwise it prints one line saying which is missing, how
to install it and that the check is skipped, and exits 0. The tests that need node call
:func:`skip_reason` and are skipped with that same line (pytest's summary counts them), never failed:
a machine without node is a machine without the check, not a broken suite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"
INSTALL_COMMAND = "apt-get install -y nodejs npm"


def missing_tools() -> list[str]:
    """Which of node and npm are not on PATH."""
    return [name for name in ("node", "npm") if shutil.which(name) is None]


def installed() -> bool:
    """Whether tests/node's locked ``ai`` package is installed (``npm ci`` ran)."""
    return (NODE_DIR / "node_modules" / "ai").is_dir()


def missing_message(missing: list[str]) -> str:
    """The one line said when node or npm is missing: what, the fix, and what is skipped."""
    return (f"{' and '.join(missing)} not installed: the AI SDK check (tests/node) is skipped; "
            f"install with (Debian, as root): {INSTALL_COMMAND}, then `make node-deps`")


def skip_reason() -> str | None:
    """Why the AI SDK check cannot run here, or None when it can (or when only `make node-deps` is missing).

    node missing, or node without npm and nothing installed: skipped. npm there but ``npm ci`` never run:
    None, and the caller fails naming ``make node-deps`` (a setup step forgotten is not a missing tool).
    """
    missing = missing_tools()
    if "node" in missing or (missing and not installed()):
        return missing_message(missing)
    return None


def main() -> int:
    """``make node-deps``: ``npm ci`` in tests/node, or one line saying the check is skipped and why."""
    missing = missing_tools()
    if missing:
        print(f"node-deps: SKIPPED - {missing_message(missing)}")
        return 0
    cmd = ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    return subprocess.run(cmd, cwd=NODE_DIR, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
