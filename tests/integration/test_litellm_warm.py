"""litellm off the worker's start path (issue 16): the background warm-up, forks during it, real calls after it.

Each case runs in a fresh interpreter (litellm is already loaded in the test
process): that is the only place where "before the import finished" exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rq import Queue, Worker
from rq.serializers import JSONSerializer

from adapters.rq.priority import PrioritySimpleWorker
from tests.fake_openai import FakeOpenAI, streamed, text_reply
from tests.rq_workers import without_commands

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, timeout: float = 90, **extra_env: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra_env}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


FORK_DURING_WARM_UP = """
import json, os, signal, sys
from phases import litellm_model
thread = litellm_model.warm_in_background()
alive_at_fork = thread.is_alive()
pid = os.fork()  # waits for the warm-up: a child must never inherit a half-imported litellm
if pid == 0:
    signal.alarm(30)  # a child that hangs on an inherited lock dies instead of keeping the test waiting
    try:
        import litellm  # the parent's module, complete: this must not hang on a lock of a thread that is gone
        spec = getattr(litellm, "__spec__", None)
        ok = litellm_model._litellm_module is litellm and not getattr(spec, "_initializing", False)
        reply = litellm.completion(model="openai/x", messages=[{"role": "user", "content": "hi"}],
                                   mock_response="pong")
        ok = ok and reply.choices[0].message.content == "pong"
    except BaseException:
        os._exit(2)
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print(json.dumps({"alive_at_fork": alive_at_fork, "child_exit": os.waitstatus_to_exitcode(status),
                  "same_thread_again": litellm_model.warm_in_background() is thread}))
"""


def test_a_fork_during_the_warm_up_waits_and_the_child_has_a_whole_litellm() -> None:
    report = _run(FORK_DURING_WARM_UP)
    assert report["alive_at_fork"] is True  # the fork really came while the import was under way
    assert report["child_exit"] == 0
    assert report["same_thread_again"] is True  # once per process


REAL_CALL = """
import json, sys
from phases import litellm_model
from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest
before = "litellm" in sys.modules
litellm_model.warm_in_background()  # a worker taking its first job: the call below joins the import
model = LiteLLMModel("openai/fake-model", params={"api_base": sys.argv[1], "api_key": "sk-test", "timeout": 20})
plain = model.complete(ModelRequest(messages=[{"role": "user", "content": "one"}]))
deltas = []
streamed = model.complete(ModelRequest(messages=[{"role": "user", "content": "two"}], on_delta=deltas.append))
print(json.dumps({"before": before, "plain": plain.message["content"], "streamed": streamed.message["content"],
                  "deltas": "".join(str(d) for d in deltas)}))
"""


def test_a_real_litellm_call_right_after_the_lazy_start(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(text_reply("first answer"), streamed(text_reply("second answer"), chunk_chars=3))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", REAL_CALL, fake_openai.url], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["before"] is False  # importing the model seam did not import litellm
    assert report["plain"] == "first answer"
    assert report["streamed"] == "second answer" and report["deltas"] == "second answer"
    assert len(fake_openai.requests) == 2


def test_the_worker_warms_up_once_registered_and_before_it_first_asks_for_a_job(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    queue = Queue("warm-test", connection=client, serializer=JSONSerializer)
    worker = without_commands(PrioritySimpleWorker)([queue], connection=client, name="warm-test",
                                                    serializer=JSONSerializer)
    key = f"{Worker.redis_worker_namespace_prefix}warm-test"
    seen: list[tuple[bool, Any]] = []
    worker.warm_up = lambda: seen.append((bool(client.exists(key)), client.hget(key, "state")))
    try:
        worker.work(burst=True)  # an empty queue: one dequeue, then it stops
        worker.work(burst=True)
    finally:
        client.close()
    # Once; registered with RQ, in its work loop, but not yet "idle": RQ's first ask for a job comes after it.
    assert seen == [(True, b"started")]


WORKER_WARM_UP = """
import json, threading
import pipelines.cli, pipelines.worker
from phases import litellm_model
from pipelines.worker import load_app
warm_up = pipelines.worker.warm_up(load_app("tests.apps.stream_app:app"))
before = litellm_model._litellm_module is not None
warm_up()  # what PrioritySimpleWorker / PriorityWorker run before their first take
print(json.dumps({"before": before, "loaded": litellm_model._litellm_module is not None,
                  "threads": [t.name for t in threading.enumerate() if t is not threading.main_thread()]}))
"""


def test_the_workers_warm_up_has_loaded_litellm_when_it_returns() -> None:
    # Liveness: a worker takes its first job only after this returns. Had it only started the import on a
    # thread, the first turn would hold its lease through the import (chaos: 0 jobs advanced under restarts).
    report = _run(WORKER_WARM_UP, REDIS_URL="redis://127.0.0.1:1/0", FAKE_OPENAI_BASE="http://127.0.0.1:1/v1")
    assert report["before"] is False
    assert report["loaded"] is True
    assert not [name for name in report["threads"] if name.startswith("pipelines-warm")]


HORSE_CALL = """
import json, os, sys
from phases import litellm_model
from phases.litellm_model import LiteLLMModel
from phases.model import ModelRequest
litellm_model.warm()  # what a forking worker's parent runs before its first fork
read, write = os.pipe()
pid = os.fork()  # a work-horse: its first real call, streamed as a turn's is
if pid == 0:
    before = set(sys.modules)
    model = LiteLLMModel("openai/fake-model", params={"api_base": sys.argv[1], "api_key": "sk-test", "timeout": 20})
    deltas = []
    answer = model.complete(ModelRequest(messages=[{"role": "user", "content": "one"}], on_delta=deltas.append))
    os.write(write, json.dumps({"answer": answer.message["content"], "deltas": "".join(map(str, deltas)),
                                "imported": sorted(set(sys.modules) - before)}).encode())
    os._exit(0)
os.close(write)
_, status = os.waitpid(pid, 0)
print(os.read(read, 1 << 20).decode())
"""


def test_a_horse_forked_after_the_warm_up_imports_nothing_for_its_first_real_call(fake_openai: FakeOpenAI) -> None:
    # A forking worker's parent never makes a real call: whatever that call imports, every horse (one a turn)
    # imported again at its first, ~90 ms a turn for httpcore, h2 and litellm's service logger.
    fake_openai.script(streamed(text_reply("the answer"), chunk_chars=3))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", HORSE_CALL, fake_openai.url], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["answer"] == "the answer" and report["deltas"] == "the answer"
    assert report["imported"] == []
    assert len(fake_openai.requests) == 1
