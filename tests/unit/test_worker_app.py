"""A queue message carries data, never a choice of code: the app an advance runs with is the worker's own.

``pipelines.worker.advance_job`` is what every RQ message runs; its ``app``
argument comes from the message. It used to be imported, and a function
there called: a broker writer chose a module to import and a callable to
run. Now the worker's app is fixed at its start, and a message naming any
other is refused, logged, and never imported.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import worker
from pipelines.app import App
from pipelines.engine.errors import ConfigurationError, InvalidInputError
from pipelines.worker import advance_job, advance_with_default
from tests.apps import memory_app

OWN = "tests.apps.memory_app:app"
FOREIGN = "tests.apps.foreign_code:app"
FOREIGN_MODULE = "tests.apps.foreign_code"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(worker.APP_ENV, raising=False)
    worker.forget_apps()
    yield
    worker.forget_apps()
    assert sys.modules.pop(FOREIGN_MODULE, None) is None, "a message's app was imported"


def test_a_message_naming_another_app_is_refused_logged_and_never_imported(caplog: pytest.LogCaptureFixture) -> None:
    worker.use_app(memory_app.app, path=OWN)
    with caplog.at_level(logging.WARNING, logger="pipelines.worker"), \
            pytest.raises(InvalidInputError, match=re.escape(f"refused an advance naming app {FOREIGN!r}")):
        advance_job("etl-1", 1, FOREIGN)
    assert FOREIGN_MODULE not in sys.modules
    assert [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    # Not even a standard-library module and function named by the message (the example).
    with pytest.raises(InvalidInputError, match=re.escape("http.server:test")):
        advance_job("etl-1", 1, "http.server:test")
    # The worker's own app path (a message sent before a rolling upgrade), or none, is served.
    assert advance_job("nope", 1, OWN) == "unknown"
    assert advance_job("nope", 1) == "unknown"


def test_an_app_given_as_an_object_serves_the_path_that_names_it_in_a_module_already_loaded() -> None:
    worker.use_app(memory_app.app)  # no path: the worker's own code handed it over
    assert advance_job("nope", None, OWN) == "unknown"
    # Another attribute of that loaded module is not the worker's app, and nothing there is called.
    with pytest.raises(InvalidInputError, match="refused"):
        advance_job("nope", None, "tests.apps.memory_app:reset")
    with pytest.raises(InvalidInputError, match="refused"):
        advance_job("nope", None, "tests.apps.memory_app:build")


@pytest.mark.parametrize("named", [["tests.apps.foreign_code:app"], 7, {"app": FOREIGN}])
def test_an_app_that_is_not_a_string_is_refused(named: object) -> None:
    worker.use_app(memory_app.app, path=OWN)
    with pytest.raises(InvalidInputError, match=f"naming app a {type(named).__name__}"):
        advance_job("nope", None, named)  # type: ignore[arg-type]


def test_a_long_app_path_is_cut_short_in_the_refusal() -> None:
    worker.use_app(memory_app.app, path=OWN)
    with pytest.raises(InvalidInputError) as caught:
        advance_job("nope", None, "m:" + "x" * 100_000)
    assert len(str(caught.value)) < 600


def test_the_environment_names_the_worker_s_app_never_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="no app for this advance"):
        advance_job("nope", None, OWN)  # no app of its own: the message's is not taken instead
    monkeypatch.setenv(worker.APP_ENV, OWN)
    assert advance_job("nope", None, OWN) == "unknown"
    with pytest.raises(InvalidInputError, match="refused"):
        advance_job("nope", None, FOREIGN)


def test_a_celery_worker_s_default_app_comes_from_its_own_configuration() -> None:
    assert advance_with_default(OWN, "nope", None, OWN) == "unknown"
    with pytest.raises(InvalidInputError, match="refused"):
        advance_with_default(OWN, "nope", None, FOREIGN)
    worker.forget_apps()
    with pytest.raises(ConfigurationError, match="no app for this advance"):
        advance_with_default(None, "nope", None, FOREIGN)


def test_use_app_takes_only_an_app() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("needs a pipelines.App")):
        worker.use_app(MemoryStorage())  # type: ignore[arg-type]
    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler())
    worker.use_app(app, path="some.module:app")
    assert advance_job("nope", None, "some.module:app") == "unknown"


def _rq_app(named: str | None) -> App:
    import redis

    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler

    # Nothing here connects: a redis client connects at its first command, and the checks come first.
    storage = RedisStorage(redis.Redis(port=1), prefix="w")
    return App(storage=storage, scheduler=RQScheduler.for_storage(storage, queue="agents", app=named))


def test_a_worker_whose_app_the_scheduler_does_not_name_refuses_to_start() -> None:
    app = _rq_app("myapp.agents:app")  # the docs' path, the module saved as shop/agents.py
    with pytest.raises(ConfigurationError, match=r"naming app 'myapp.agents:app', but this worker runs "
                                                 r"'shop.agents:app' .* scheduler app='shop.agents:app'"):
        worker.run_rq_worker(app, path="shop.agents:app", burst=True, sweep_interval=0)


def test_a_queue_the_app_does_not_send_to_is_refused() -> None:
    app_queues = ["agents", "agents-background"]
    assert worker.listened_queues(app_queues, None) == app_queues
    assert worker.listened_queues(app_queues, "agents") == app_queues
    assert worker.listened_queues(app_queues, "agents-background") == ["agents-background"]
    with pytest.raises(ConfigurationError, match=r"--queue 'agnets' is not a queue of this app: its scheduler "
                                                 r"sends to agents, agents-background"):
        worker.listened_queues(app_queues, "agnets")
    with pytest.raises(ConfigurationError, match="--queue 'agnets' is not a queue"):
        worker.run_rq_worker(_rq_app(None), path=None, queue="agnets", burst=True, sweep_interval=0)


def test_for_storage_takes_a_redis_storage_through_a_wrapper(tmp_path: Any) -> None:
    import redis

    from adapters.blobs import DirectoryBlobStore
    from adapters.offload import OffloadingStorage
    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler

    # Nothing here connects: a redis client connects at its first command.
    wrapped = OffloadingStorage(RedisStorage(redis.Redis(port=1), prefix="pr"), DirectoryBlobStore(tmp_path))
    scheduler = RQScheduler.for_storage(wrapped, queue="agents")  # type: ignore[arg-type]
    assert scheduler.namespace == "pr" and scheduler.queue_names == ["agents", "agents-background"]
