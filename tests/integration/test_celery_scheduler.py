"""CeleryScheduler against a real Redis broker: configuration refused, ids, what a message carries, errors."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import pytest

pytest.importorskip("celery", reason="the celery extra is not installed (pip install phaserunner[celery])")

from celery import Celery

from adapters.celery import (
    ADVANCE_TASK,
    CeleryScheduler,
    celery_task_id,
    parse_celery_task_id,
)
from pipelines.engine.errors import (
    ConfigurationError,
    InvalidInputError,
    InvalidJobIdError,
    StorageUnavailableError,
)
from tests.apps.celery_app import make_celery


def pickled(**conf: Any) -> Celery:
    app = Celery("pickled", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(**conf)
    return app


@pytest.mark.parametrize("conf", [
    {"task_serializer": "pickle", "accept_content": ["pickle"]},
    {"accept_content": ["json", "pickle"]},
    {"accept_content": ["application/x-python-serialize"]},
    {"result_serializer": "pickle"},
    {"result_accept_content": ["json", "pickle"]},
    {"accept_content": "json"},  # a string, not a list: Celery would read it as characters
])
def test_a_celery_app_configured_for_anything_but_json_is_refused(conf: dict[str, Any]) -> None:
    app = pickled(**conf)
    with pytest.raises(ConfigurationError, match=r"only JSON.*accept_content=\['json'\]") as err:
        CeleryScheduler(app, queue="q")
    bad = next(iter(conf))
    assert f"{bad}=" in str(err.value)  # names the setting that is wrong
    assert ADVANCE_TASK not in app.tasks  # refused before anything was registered


def test_the_default_celery_configuration_is_json_only_and_gets_the_advance_task() -> None:
    app = pickled()
    scheduler = CeleryScheduler(app, queue="q", app="tests.apps.celery_app:app")
    task = app.tasks[ADVANCE_TASK]
    assert scheduler.task is task and task.acks_late and task.reject_on_worker_lost and task.serializer == "json"
    assert CeleryScheduler(app, queue="other").task is task  # registered once per Celery app


@pytest.mark.parametrize("kwargs", [{"queue": ""}, {"app": "no_colon"}, {"namespace": "has space"},
                                    {"namespace": ""}, {"precision": -1}])
def test_bad_scheduler_options_are_configuration_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        CeleryScheduler(pickled(), **kwargs)


def test_task_ids_name_namespace_job_and_version_injectively() -> None:
    ids = {celery_task_id(j, v, ns) for ns in ("pr", "a_n", "a.b:c") for j in ("x", "x_n", "a:b.c_d", "n_x")
           for v in (0, 1, 12)}
    assert len(ids) == 36 and all(set(i) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
                                  for i in ids)
    for ns, job, v in (("pr", "a:b.c_d", 3), ("a_n.x", "n_x-v1", 0)):
        assert parse_celery_task_id(celery_task_id(job, v, ns)) == (ns, job, v)
    with pytest.raises(InvalidJobIdError):
        celery_task_id("bad id", 1)
    with pytest.raises(InvalidInputError):
        celery_task_id("ok", -1)
    with pytest.raises(InvalidInputError, match="not a task id"):
        parse_celery_task_id("some-uuid")


def _messages(client: Any, queue: str) -> list[tuple[dict[str, Any], list[Any]]]:
    out = []
    for raw in reversed(client.lrange(queue, 0, -1)):  # oldest first
        envelope = json.loads(raw)
        assert envelope["content-type"] == "application/json"
        out.append((envelope["headers"], json.loads(base64.b64decode(envelope["body"]))))
    return out


@pytest.mark.redis
def test_a_message_carries_only_the_job_the_turn_and_the_app_path_with_its_delay_as_eta(redis_url: str) -> None:
    import redis

    scheduler = CeleryScheduler(make_celery(redis_url), queue="q1", app="tests.apps.celery_app:app", namespace="ns")
    before = time.time()
    scheduler.schedule_advance("chat:1", 0, version=4)
    scheduler.schedule_advance("chat:1", 30, version=5)
    scheduler.requeue("chat:1", version=5)
    client = redis.Redis.from_url(redis_url)
    (h1, b1), (h2, b2), (h3, b3) = _messages(client, "q1")
    assert h1["task"] == h2["task"] == h3["task"] == ADVANCE_TASK
    assert (h1["id"], h2["id"]) == (celery_task_id("chat:1", 4, "ns"), celery_task_id("chat:1", 5, "ns"))
    # The sweep's re-send names the same turn under a fresh id (a worker drops ids it saw revoked).
    assert h3["id"].startswith(celery_task_id("chat:1", 5, "ns") + "-r")
    assert parse_celery_task_id(h3["id"]) == ("ns", "chat:1", 5)
    app_kwargs = {"app": "tests.apps.celery_app:app"}
    assert [b1[:2], b2[:2], b3[:2]] == [[["chat:1", 4], app_kwargs], [["chat:1", 5], app_kwargs],
                                        [["chat:1", 5], app_kwargs]]
    assert h1["eta"] is None and h3["eta"] is None
    eta = datetime.fromisoformat(h2["eta"]).timestamp()
    assert before + 30 <= eta <= time.time() + 30
    client.close()


@pytest.mark.redis
def test_bad_input_is_refused_with_nothing_sent(redis_url: str) -> None:
    import redis

    scheduler = CeleryScheduler(make_celery(redis_url), queue="q2")
    for call in (lambda: scheduler.schedule_advance("bad id", 0, version=1),
                 lambda: scheduler.schedule_advance("ok", -1, version=1),
                 lambda: scheduler.schedule_advance("ok", float("nan"), version=1),
                 lambda: scheduler.schedule_advance("ok", 0, version=-2),
                 lambda: scheduler.requeue("", version=1)):
        with pytest.raises(InvalidInputError):
            call()
    client = redis.Redis.from_url(redis_url)
    assert client.llen("q2") == 0
    client.close()


def test_an_unreachable_broker_is_storage_unavailable() -> None:
    app = make_celery("redis://127.0.0.1:1/0")
    app.conf.update(task_publish_retry=False, broker_connection_timeout=0.5, broker_connection_max_retries=0)
    scheduler = CeleryScheduler(app, queue="q")
    with pytest.raises(StorageUnavailableError, match="Celery broker unreachable"):
        scheduler.schedule_advance("j", 0, version=1)


def test_pipelines_and_adapters_import_no_celery() -> None:
    code = ("import sys, pipelines, adapters, adapters.base, adapters.memory, pipelines.worker\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'billiard')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.redis
def test_the_examples_beat_sweep_resends_a_job_whose_message_was_lost(redis_url: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    import redis

    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.delenv("SUPPORT_MODEL", raising=False)
    example = importlib.reload(importlib.import_module("examples.celery.app"))
    monkeypatch.setattr(example, "SWEEP_GRACE", 0.0)
    client = redis.Redis.from_url(redis_url)
    example.app.run_agent("support", job_id="chat-7", messages=["Where is my order A-1001?"])
    view = example.app.get("chat-7")
    assert view is not None
    [(first, _)] = _messages(client, "agents")
    assert first["id"] == celery_task_id("chat-7", view.record.version, "support")
    client.delete("agents")  # the broker lost it

    assert example.sweep.apply().get() == ["chat-7"]
    [(again, body)] = _messages(client, "agents")
    assert parse_celery_task_id(again["id"]) == ("support", "chat-7", view.record.version)
    assert body[:2] == [["chat-7", view.record.version], {"app": example.APP_PATH}]
    client.close()
    example.storage.close()


def test_the_examples_beat_sweep_goes_to_a_queue_its_documented_workers_consume(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import re

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # routing only: nothing is sent
    monkeypatch.delenv("SUPPORT_MODEL", raising=False)
    example = importlib.reload(importlib.import_module("examples.celery.app"))
    try:
        # The worker command the example documents: a sweep sent anywhere else is never run (Celery's
        # default queue "celery" included), and a killed worker's job would stay running for good.
        [queues] = re.findall(r"celery -A examples\.celery\.app:celery worker -Q (\S+)", example.__doc__ or "")
        consumed = set(queues.split(","))
        entry = example.celery.conf.beat_schedule["phaserunner-sweep"]
        assert entry["task"] == example.sweep.name
        # What beat does with an entry: the task's apply_async with the entry's options, routed by the app's router.
        route = example.celery.amqp.router.route(dict(entry.get("options") or {}), entry["task"])
        assert route["queue"].name in consumed
    finally:
        example.storage.close()


@pytest.mark.parametrize(("args", "kwargs", "said"), [
    (["ok-1", 1], {"app": "os:system"}, "refused an advance naming app 'os:system'"),  # another app's message
    (["bad{id", 1], {}, "invalid job id 'bad{id'"),
])
def test_a_message_the_worker_refuses_is_one_log_line_with_no_traceback(
        args: list[Any], kwargs: dict[str, Any], said: str, caplog: pytest.LogCaptureFixture) -> None:
    from adapters.celery.scheduler import REFUSED
    from adapters.memory import MemoryStorage
    from pipelines.app import App
    from pipelines.worker import forget_apps, use_app

    celery = make_celery("redis://127.0.0.1:1/0")
    scheduler = CeleryScheduler(celery, queue="q", app="tests.apps.celery_app:app")
    use_app(App(storage=MemoryStorage(), scheduler=scheduler, pipelines={}), path="tests.apps.celery_app:app")
    try:
        result = scheduler.task.apply(args=args, kwargs=kwargs)  # the task body, as a worker runs it
    finally:
        forget_apps()
    assert result.successful() and result.get() == REFUSED  # not a task failure Celery logs with its traceback
    refusals = [r for r in caplog.records if r.name == "adapters.celery.scheduler"]
    assert len(refusals) == 1 and not refusals[0].exc_info and said in refusals[0].getMessage()
    assert refusals[0].getMessage().count("\n") == 0


class _Worker:
    """What a worker_init signal's sender has that the check reads: the worker's Celery app and soft limit."""

    def __init__(self, app: Celery, soft_time_limit: float | None = None) -> None:
        self.app = app
        self.soft_time_limit = soft_time_limit


def test_a_worker_warns_at_start_when_a_soft_time_limit_applies_to_the_advance_task(
        caplog: pytest.LogCaptureFixture) -> None:
    # SoftTimeLimitExceeded inside a turn is taken for the job's own error and fails the job for good; the task
    # cannot opt out (the pool's default applies to it, and a soft limit of its own would disarm the hard one).
    from celery import signals

    plain, conf, flag, annotated = (make_celery("redis://127.0.0.1:1/0") for _ in range(4))
    conf.conf.task_soft_time_limit = 30
    annotated.conf.task_annotations = {ADVANCE_TASK: {"soft_time_limit": 60}}
    for app in (plain, conf, flag, annotated):
        CeleryScheduler(app, queue="q")
    assert CeleryScheduler(plain, queue="q").task.soft_time_limit is None  # the hard task_time_limit stays armed
    signals.worker_init.send(sender=_Worker(plain))
    assert [r for r in caplog.records if r.name == "adapters.celery.scheduler"] == []
    for worker in (_Worker(conf, 30), _Worker(flag, 45), _Worker(annotated)):  # the worker's default, or the task's
        signals.worker_init.send(sender=worker)
    warned = [r.getMessage() for r in caplog.records if r.name == "adapters.celery.scheduler"]
    assert [w.split(" applies")[0] for w in warned] == [f"a soft time limit of {n}s" for n in (30, 45, 60)], warned
