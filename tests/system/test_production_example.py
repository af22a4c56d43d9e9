"""examples/production works as its docstring says: web call, a real worker process, cron sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis

from adapters.redis import RedisStorage

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_production_example_runs_a_conversation_through_a_real_worker(redis_url: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    env.pop("SUPPORT_MODEL", None)
    web = run(["-m", "examples.production.web", "Where is my order A-1001?", "--job", "support-t1"], env)
    assert web.returncode == 0, web.stderr
    assert web.stdout.strip() == "support-t1"
    client = redis.Redis.from_url(redis_url)
    assert client.exists("support:{support-t1}:record")  # written by the web call, before any worker ran

    # A background run goes to agents-background: a worker given --queue agents (as the docs show) takes it too.
    background = run(["-c", "from examples.production.app import app; app.run_agent('support', job_id='support-bg', "
                            "messages=['Where is my order A-1001?'], priority='background')"], env)
    assert background.returncode == 0, background.stderr
    worker = run(["-m", "pipelines", "worker", "--app", "examples.production.app:app", "--queue", "agents",
                  "--burst", "--simple"], env)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    storage = RedisStorage.from_url(redis_url, prefix="support")
    for job in ("support-t1", "support-bg"):
        record = storage.get_job(job)
        assert record is not None and record.status.value == "complete", (job, record and record.status)
    # The cron sweep finds nothing left to do; status shows the finished job.
    cron = run(["-m", "pipelines", "advance", "--app", "examples.production.app:app", "--due"], env)
    assert cron.returncode == 0, cron.stderr
    status = run(["-m", "pipelines", "status", "support-t1", "--app", "examples.production.app:app"], env)
    assert status.returncode == 0 and "complete" in status.stdout, status.stdout + status.stderr
    transcript = run(["-m", "pipelines", "transcript", "support-t1", "--app", "examples.production.app:app"], env)
    assert "DHL" in transcript.stdout and "lookup_order" in transcript.stdout
