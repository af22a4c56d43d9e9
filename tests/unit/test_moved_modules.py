"""The adapters' old module paths (issue 29's one package per backend) stay importable for one release: each
warns where it moved, and its names are the moved module's own objects."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALIASES = sorted(p.stem for p in (ROOT / "adapters").glob("*.py")
                 if "moved(__name__" in p.read_text())


def test_every_old_path_of_a_moved_module_is_an_alias() -> None:
    assert {"redis_scripts", "rq_entry", "rq_priority", "rq_lifeline", "memory_flow", "blobs_s3"} <= set(ALIASES)


@pytest.mark.parametrize("old", ALIASES)
def test_an_alias_warns_and_hands_out_the_moved_modules_objects(old: str) -> None:
    name = f"adapters.{old}"
    text = (ROOT / "adapters" / f"{old}.py").read_text()
    new = re.search(r'moved\(__name__, "([\w.]+)"\)', text)
    assert new is not None
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=f"{name} moved to {re.escape(new.group(1))}"):
        alias = importlib.import_module(name)
    target = importlib.import_module(new.group(1))
    assert alias.__all__
    for attr in alias.__all__:
        assert getattr(alias, attr) is getattr(target, attr), attr


def test_nothing_of_ours_imports_an_old_path() -> None:
    old = "|".join(ALIASES)
    pattern = re.compile(rf"\b(?:from|import) adapters\.(?:{old})\b")
    users = [str(p.relative_to(ROOT)) for top in ("pipelines", "phases", "adapters", "tests", "bench", "examples")
             for p in (ROOT / top).rglob("*.py") if "node_modules" not in p.parts and ".venv" not in p.parts
             and not (p.parent == ROOT / "adapters" and p.stem in ALIASES) and pattern.search(p.read_text())]
    assert users == []
