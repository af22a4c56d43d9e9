"""The worker's entry point is the App's to tell: queue adapters never name the composing layer (issue 29)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import redis

from adapters.base import WorkerEntry
from adapters.memory import MemoryStorage
from adapters.rq import RQScheduler
from adapters.sqlite import SQLiteStorage
from pipelines import worker
from pipelines.app import App
from pipelines.app.entry import WORKER_ENTRY
from pipelines.engine.errors import ConfigurationError


def _resolve(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_apps_worker_entry_names_the_workers_functions() -> None:
    assert App.worker_entry is WORKER_ENTRY
    assert _resolve(WORKER_ENTRY.advance) is worker.advance_job
    assert _resolve(WORKER_ENTRY.advance_with_default) is worker.advance_with_default
    assert WORKER_ENTRY.advance == worker.ADVANCE_FUNC  # what `pipelines worker` runs is what messages name


@pytest.mark.parametrize("bad", ["", "advance", "pkg.", ".advance", "pkg..advance", "pkg.mod:advance", 3])
def test_a_worker_entry_must_be_dotted_import_paths(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"WorkerEntry\.advance must be a dotted import path"):
        WorkerEntry(advance=bad, advance_with_default="pkg.f")  # type: ignore[arg-type]


def test_an_rq_scheduler_of_no_app_refuses_to_send_before_touching_redis() -> None:
    # Port 1: nothing listens; the refusal comes before any command is sent.
    scheduler = RQScheduler(redis.Redis(port=1, socket_connect_timeout=0.1))
    with pytest.raises(ConfigurationError, match=r"part of no App yet.*App\(storage=\.\.\., scheduler="):
        scheduler.schedule_advance("job-1", version=1)
    with pytest.raises(ConfigurationError, match="part of no App yet"):
        scheduler.entry_point  # noqa: B018
    App(storage=MemoryStorage(), scheduler=scheduler)
    assert scheduler.entry_point == WORKER_ENTRY.advance


def test_a_celery_task_body_of_no_app_says_what_to_build(tmp_path: Path) -> None:
    pytest.importorskip("celery")
    from adapters.celery import ADVANCE_TASK, CeleryScheduler
    from tests.apps.celery_app import make_celery

    celery = make_celery("redis://127.0.0.1:1/0", main="no-app")
    CeleryScheduler(celery)  # registers the task; no App is built with it
    with pytest.raises(ConfigurationError, match="no phaserunner App with it"):
        celery.tasks[ADVANCE_TASK].apply(args=["job-1", 1], throw=True).get()
    with pytest.raises(ConfigurationError, match=r"needs a storage with a key prefix.*SQLiteStorage"):
        CeleryScheduler.for_storage(celery, SQLiteStorage(str(tmp_path / "a.db")))


@pytest.mark.parametrize("module", ["adapters.rq", "adapters.rq.scheduler", "adapters.celery",
                                    "adapters.celery.scheduler"])
def test_the_old_advance_func_of_a_queue_adapter_is_a_deprecated_alias_for_one_release(module: str) -> None:
    if "celery" in module:
        pytest.importorskip("celery")
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=r"ADVANCE_FUNC is deprecated .*App\.worker_entry"):
        value = mod.ADVANCE_FUNC
    want = WORKER_ENTRY.advance_with_default if "celery" in module else WORKER_ENTRY.advance
    assert value == want
    with pytest.raises(AttributeError, match="no attribute 'NOPE'"):
        mod.NOPE  # noqa: B018
