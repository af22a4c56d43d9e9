"""One writer (issue 29 item 2): transitions compute, ``pipelines.engine.writer`` applies, nothing else writes.

An AST scan of every library module outside the adapters: a call of a
storage write method on a storage (``storage.commit(...)``,
``self._storage.publish(...)``, ``app.storage.send(...)``) may appear only in
the writer. The adapters implement storage and are not scanned; a storage
wrapper among them forwards through the writer too (``adapters/offload.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines.engine import transitions, writer
from pipelines.engine.models import JobStatus

ROOT = Path(__file__).resolve().parents[2]

WRITES = frozenset({"create_job", "commit", "record_step", "record_step_and_publish", "add_dropped_usage",
                    "request_control", "delete_job", "send", "publish"})
"""Every storage method that changes what storage holds (the ports in adapters/base/)."""

STORAGE_NAMES = frozenset({"storage", "_storage", "store", "inner"})
"""What the library calls a storage object (a name, or an attribute: ``self.storage``, ``app.storage``)."""

WRITER = ROOT / "pipelines" / "engine" / "writer.py"


def _receiver(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _storage_writes(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES
                and _receiver(node.func.value) in STORAGE_NAMES):
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node.func)}")
    return found


def _library_files() -> list[Path]:
    return sorted(p for pkg in ("pipelines", "phases") for p in (ROOT / pkg).rglob("*.py"))


def test_no_module_but_the_writer_calls_a_storage_write_method() -> None:
    files = _library_files()
    assert len(files) > 40 and WRITER in files
    assert [hit for p in files if p != WRITER for hit in _storage_writes(p)] == []


def test_the_scan_sees_the_writers_own_calls() -> None:
    # The scan is not vacuous: it finds every write the writer makes.
    seen = {hit.rsplit(".", 1)[-1] for hit in _storage_writes(WRITER)}
    assert seen == WRITES


def test_the_scan_finds_a_write_outside_the_writer(tmp_path: Path) -> None:
    # Planted in a copy's layout, never in the checkout: the scans of other tests (run in parallel) read it.
    planted = tmp_path / "pipelines" / "_planted_for_test.py"
    planted.parent.mkdir()
    planted.write_text("def f(app, c):\n    app.storage.commit(c)\n    app.commit(c)\n")
    assert _storage_writes(planted, tmp_path) == ["pipelines/_planted_for_test.py:2 app.storage.commit"]


def test_transitions_write_nothing() -> None:
    # The transitions package computes: none of its functions takes a storage, and it has no apply.
    assert not hasattr(transitions, "apply")
    files = sorted((ROOT / "pipelines" / "engine" / "transitions").glob("*.py"))
    assert len(files) > 1
    for path in files:
        tree = ast.parse(path.read_text())
        args = {a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                for a in n.args.args + n.args.kwonlyargs}
        assert not args & {"storage", "scheduler"}, path.name


def test_apply_creates_commits_and_schedules() -> None:
    storage, scheduler = MemoryStorage(), MemoryScheduler()
    created = transitions.create("j", pipeline="p", first="a", state=None, messages=[], options={}, now=0.0)
    writer.apply(storage, scheduler, created)
    record = storage.get_job("j")
    assert record is not None and record.status is JobStatus.RUNNING
    assert scheduler.pending() == 1  # its first advance is scheduled
    paused = transitions.pause(record, owner=None, now=1.0)
    writer.apply(storage, scheduler, paused)
    again = storage.get_job("j")
    assert again is not None and again.status is JobStatus.PAUSED and again.version == record.version + 1
