"""Honest ports (issue 29 item 3): each adapter declares its features once; they are checked in one place.

The declaration must match the methods (a declared feature is implemented; an
implemented one is declared), the library asks only
``pipelines.engine.capabilities``, and nothing in the library probes an
adapter with ``getattr`` / ``hasattr``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from adapters.base import FEATURE_PROTOCOLS, Feature, ReadStore, RunStore, Storage
from adapters.blobs import DirectoryBlobStore
from adapters.celery import CeleryScheduler
from adapters.local import LocalScheduler
from adapters.memory import MemoryScheduler, MemoryStorage
from adapters.offload import OffloadingStorage
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from adapters.sqlite import SQLiteStorage
from pipelines.app import App
from pipelines.engine import capabilities
from pipelines.engine.capabilities import as_feature, features_of, has

ROOT = Path(__file__).resolve().parents[2]

DECLARING = [MemoryStorage, MemoryScheduler, RedisStorage, RQScheduler, CeleryScheduler, SQLiteStorage,
             LocalScheduler]


def _implements(cls: type, feature: Feature) -> bool:
    proto = FEATURE_PROTOCOLS[feature]
    names = [n for n in vars(proto) if not n.startswith("_")]
    return all(callable(getattr(cls, n, None)) for n in names)


@pytest.mark.parametrize("cls", DECLARING, ids=lambda c: c.__name__)
def test_each_adapter_declares_exactly_what_it_implements(cls: type) -> None:
    declared = cls.features  # type: ignore[attr-defined]
    assert isinstance(declared, frozenset)
    assert declared == {f for f in Feature if _implements(cls, f)}


def test_a_storage_is_the_engines_port_and_the_readers_port() -> None:
    storage = MemoryStorage()
    assert isinstance(storage, RunStore) and isinstance(storage, ReadStore) and isinstance(storage, Storage)
    # The split is real: what the engine runs on has no listing, what readers use has no commit.
    assert "commit" not in vars(ReadStore) and "list_jobs" not in vars(RunStore)


def test_a_wrapper_declares_its_inner_storages_features(tmp_path: Path) -> None:
    wrapped = OffloadingStorage(MemoryStorage(), DirectoryBlobStore(tmp_path))
    # And a last step before the commit, which it packs and hands on (to record_step where the inner has no such).
    assert features_of(wrapped) == MemoryStorage.features | {Feature.STEP_BEFORE_COMMIT}
    assert as_feature(wrapped, Feature.COUNTS, object) is wrapped


class _Undeclared:
    """A third party's storage from before features: it implements counts, declares nothing."""

    def count_jobs(self, status: Any = None) -> int:
        return 3

    def reindex(self) -> int:
        return 0


def test_an_adapter_that_declares_nothing_is_judged_by_its_methods_once() -> None:
    undeclared = _Undeclared()
    assert features_of(undeclared) == {Feature.COUNTS}
    assert has(undeclared, Feature.COUNTS) and not has(undeclared, Feature.FLOW)
    assert _Undeclared in capabilities._DERIVED  # judged once per class


def test_a_declared_feature_is_what_the_library_asks() -> None:
    # A memory storage that says it cannot count: the App believes the declaration, not the methods.
    class Modest(MemoryStorage):
        features = MemoryStorage.features - {Feature.COUNTS}

    app = App(storage=Modest(), scheduler=MemoryScheduler())
    assert app.has_listing_index is False and app.count_jobs() is None
    full = App(storage=MemoryStorage(), scheduler=MemoryScheduler())
    assert full.has_listing_index and full.count_jobs() == 0


def _probes(path: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """``getattr(x.storage/scheduler...)`` / ``hasattr(...)`` on an adapter, in a library module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if any(word in target for word in ("storage", "scheduler", "store", *extra)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_nothing_probes_an_adapter_with_getattr_or_hasattr() -> None:
    files = [p for pkg in ("pipelines", "phases") for p in (ROOT / pkg).rglob("*.py")]
    assert [hit for p in files for hit in _probes(p)] == []


def test_no_adapter_probes_another_or_the_app_it_serves() -> None:
    # One adapter asks another (or the App it is built into) only through a port: a feature's protocol, or the
    # SchedulerHost the App binds. The last two probes (SQLite's reaping, a storage's key prefix) went in issue 29.
    hits = [hit for p in (ROOT / "adapters").rglob("*.py") for hit in _probes(p, extra=("advance", "app", "host"))]
    assert hits == []


def test_no_adapter_names_the_composing_layer() -> None:
    # Queue adapters are told the worker's entry point by the App (WorkerEntry), they never spell it.
    # The one exception: the value of the deprecated ADVANCE_FUNC alias, for one release.
    spelled = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "adapters").rglob("*.py")
               for n, line in enumerate(p.read_text().splitlines(), 1)
               if "pipelines.worker" in line and not line.startswith("_DEPRECATED_ADVANCE_FUNC = ")]
    assert spelled == []
