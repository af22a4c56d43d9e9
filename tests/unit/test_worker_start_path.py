"""A worker's start path does not import litellm (issue 16): it loads on the first model call instead.

Behavioural, not timed: a fresh interpreter imports what ``pipelines worker``
imports and loads apps whose agents name a litellm model (the test apps),
builds their pipelines, and reports which heavy modules it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

START_PATH = """
import json, sys
import pipelines.cli, pipelines.worker, adapters.rq, adapters.rq.priority, rq, rq.serializers
from pipelines.worker import load_app
loaded = {}
for path in ("tests.apps.stream_app:app", "bench.startup_app:app", "bench.apps:app"):
    app = load_app(path)
    for agent in app.agents.values():
        agent.pipeline()  # builds the turn phase: resolve_model makes a LiteLLMModel for a model string
    loaded[path] = sorted(app.agents)
warm_up = pipelines.worker.warm_up(load_app("tests.apps.stream_app:app"))
heavy = ("litellm", "openai", "tiktoken", "aiohttp", "starlette", "jinja2", "celery", "uvicorn")
print(json.dumps({
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(heavy)),
    "loaded": loaded,
    "warm_up": getattr(warm_up, "__name__", None),
}))
"""


def _run(code: str, **env: str) -> Any:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_worker_start_path_of_a_litellm_app_does_not_import_litellm() -> None:
    # Nothing here connects: redis clients connect on their first command, the fake base is never called.
    report = _run(START_PATH, REDIS_URL="redis://127.0.0.1:1/0", BENCH_REDIS_URL="redis://127.0.0.1:1/0",
                  STARTUP_REDIS_URL="redis://127.0.0.1:1/0", STARTUP_QUEUE="q",
                  FAKE_OPENAI_BASE="http://127.0.0.1:1/v1")
    assert report["loaded"]["tests.apps.stream_app:app"] == ["streamer"]  # an agent on "openai/fake-model"
    assert report["loaded"]["bench.startup_app:app"] == ["adder"]
    assert report["heavy"] == []  # not litellm (nor openai, ...), and no web, template or celery module
    assert report["warm_up"] == "warm"  # what the worker runs to its end before its first take


def test_a_scripted_app_gets_no_litellm_warm_up() -> None:
    code = ("import json, pipelines.cli, pipelines.worker\n"
            "from adapters.memory import MemoryScheduler, MemoryStorage\n"
            "from pipelines import Agent, App\n"
            "from pipelines.testing import ScriptedModel\n"
            "app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),\n"
            "          agents=[Agent(name='a', model=ScriptedModel(['hi']))])\n"
            "print(json.dumps(pipelines.worker.warm_up(app)))\n")
    assert _run(code) is None


FORK_PARENT = """
import json, sys
import pipelines.worker
from adapters.rq.priority import PriorityWorker
from pipelines.engine import telemetry
from pipelines.worker import load_app, run_rq_worker
from adapters.redis.keys import layout_key
seen = {}
app = load_app("bench.apps:app")
app.storage.client.delete(layout_key(app.storage.prefix))
def work(self, **kwargs):  # where RQ's loop would start forking horses
    seen["looked_up"] = telemetry._otel is not None
    seen["propagate"] = "opentelemetry.propagate" in sys.modules
    seen["layout"] = (app.storage.client.get(layout_key(app.storage.prefix)) or b"").decode()
PriorityWorker.work = work
before = telemetry._otel is not None
run_rq_worker(app, path="bench.apps:app", sweep_interval=0)
print(json.dumps({"before": before, **seen}))
"""


@pytest.mark.redis
def test_a_forking_worker_does_a_turns_once_a_process_work_before_its_first_horse(redis_url: str) -> None:
    # A horse runs one turn and exits: whatever a turn does once a process, a horse forked before the parent
    # did it does again, every turn. The OpenTelemetry lookup (propagators found through entry points) was
    # ~5 ms of each horse's ~10 ms, the key layout check a round trip (bench/README.md, figure 12).
    report = _run(FORK_PARENT, BENCH_REDIS_URL=redis_url, BENCH_QUEUE="fork-parent")
    assert report == {"before": False, "looked_up": True, "propagate": True, "layout": "buckets=0 records=3"}


WRONG_LAYOUT = """
import json
from adapters.redis import RedisStorage
from adapters.rq.priority import PriorityWorker
from pipelines.engine.errors import ConfigurationError
from pipelines.worker import load_app, run_rq_worker
app = load_app("bench.apps:app")
RedisStorage(app.storage.client, prefix=app.storage.prefix, buckets=4).conn.check_layout(None)  # another layout
PriorityWorker.work = lambda self, **kwargs: print(json.dumps("worked"))
try:
    run_rq_worker(app, path="bench.apps:app", sweep_interval=0)
except ConfigurationError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.mark.redis
def test_a_worker_whose_layout_differs_from_the_prefixs_refuses_to_start(redis_url: str) -> None:
    message = _run(WRONG_LAYOUT, BENCH_REDIS_URL=redis_url, BENCH_QUEUE="wrong-layout")
    assert "written with buckets=4 records=3, this storage uses buckets=0" in message  # not "worked": no job taken
