"""Provenance tags: which app version and which commit started a run (``version:...``, ``commit:...``).

The commit comes from the environment (``PIPELINES_COMMIT``, else
``GIT_COMMIT``, ``SOURCE_COMMIT``) or, failing that, from the git checkout the
process runs in (``.git/HEAD`` read as a file: no ``git`` process is started).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from phases.run_input import check_tags

__all__ = ["COMMIT_ENV", "current_commit", "with_provenance"]

COMMIT_ENV = ("PIPELINES_COMMIT", "GIT_COMMIT", "SOURCE_COMMIT")
_SHA = re.compile(r"[0-9a-f]{7,64}")


def _read_ref(git_dir: Path, ref: str) -> str | None:
    loose = git_dir / ref
    if loose.is_file():
        return loose.read_text().strip()
    packed = git_dir / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, name = line.partition(" ")
            if name == ref:
                return sha
    return None


def current_commit(start: Path | None = None) -> str | None:
    """The commit this process runs (environment first, then the enclosing git checkout), or ``None``."""
    for name in COMMIT_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        git_dir = folder / ".git"
        if git_dir.is_dir():
            try:
                head = (git_dir / "HEAD").read_text().strip()
                sha = _read_ref(git_dir, head[5:].strip()) if head.startswith("ref:") else head
            except OSError:
                return None
            return sha if sha and _SHA.fullmatch(sha) else None
    return None


def with_provenance(tags: object, *, version: str | None, commit: str | None, enabled: bool) -> list[str]:
    """``tags`` checked, plus ``version:`` and ``commit:`` unless given or ``enabled`` is false."""
    out = check_tags(tags if tags is not None else [])
    if not enabled:
        return out
    for prefix, value in (("version:", version), ("commit:", commit)):
        if value and not any(t.startswith(prefix) for t in out):
            out.append(f"{prefix}{value}")
    return check_tags(out)
