"""Fail if the environment gained start-up hooks it should not have.

Known-malicious litellm releases (1.82.7, 1.82.8) shipped a ``.pth`` file that
runs code at every interpreter start; a ``sitecustomize.py`` does the same.
This lists every such hook in the venv's site-packages and fails on any that
is not on the allow-list below.
"""

from __future__ import annotations

import site
import sys
from pathlib import Path

# What a clean `pip install -e .[dev]` leaves: setuptools' shim and the
# editable-install hooks of this project.
ALLOWED = ("distutils-precedence.pth", "__editable__.phaserunner-", "__editable___phaserunner_", "_phaserunner")


def main() -> int:
    problems = []
    for root in {Path(p) for p in site.getsitepackages()}:
        if not root.is_dir():
            continue
        for path in sorted(root.iterdir()):
            if path.suffix == ".pth" and not path.name.startswith(ALLOWED):
                problems.append(f"unexpected start-up hook {path}")
            if path.name in ("sitecustomize.py", "usercustomize.py"):
                problems.append(f"unexpected {path.name} at {path}")
    for p in problems:
        print(f"site-packages check: {p}", file=sys.stderr)
    if not problems:
        print("site-packages check: no unexpected .pth or sitecustomize files")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
