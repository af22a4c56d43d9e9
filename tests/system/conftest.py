"""Worker processes for the system tests: started with ``python -m pipelines worker``, always killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.conftest import app  # noqa: F401 - the same app fixture, shared
from tests.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parents[2]

APP_PATH = "tests.apps.redis_app:app"


def wait_for(what: str, check: Callable[[], Any], timeout: float, logs: Callable[[], str] = str) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` (and the logs) at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{logs()}")


class Cluster:
    """Worker (and other) processes of one test, each in its own session so kill -9 takes its whole group."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []  # extra processes to kill at the end (a worker's forked horse)

    def start(self, args: list[str], name: str, **env: str) -> subprocess.Popen[bytes]:
        log = open(self.logdir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until it exits
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**self.env, **env}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)
        log.close()
        self.procs.append(proc)
        return proc

    def worker(self, name: str, *extra: str, **env: str) -> subprocess.Popen[bytes]:
        # PR_TEST_WORKER_LOG=INFO shows every RQ job in the logs printed on a failure.
        level = os.environ.get("PR_TEST_WORKER_LOG", "WARNING")
        return self.start(["-m", "pipelines", "worker", "--app", APP_PATH, "--name", name, "--log-level", level,
                           *extra], name, **env)

    def cli(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pipelines", *args, "--app", APP_PATH], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logdir.glob("*.log")))

    @staticmethod
    def kill9(proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the process's whole group (the worker and RQ's scheduler child), as if the machine died."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    @staticmethod
    def children(pid: int) -> list[int]:
        """Direct children of ``pid`` (a forking worker's horse lives in its own process group)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
        return found

    def stop_all(self) -> None:
        # Horses first: they are in their own groups and would outlive their worker.
        self.pids += [child for proc in self.procs if proc.poll() is None for child in self.children(proc.pid)]
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)  # RQ's warm shutdown: the current job finishes
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill9(proc)


@pytest.fixture
def cluster(redis_url: str) -> Iterator[Cluster]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    env.pop("PIPELINES_APP", None)
    env.pop("FAKE_OPENAI_BASE", None)
    with tempfile.TemporaryDirectory(prefix="pr-system-") as logdir:
        c = Cluster(env, Path(logdir))
        try:
            yield c
        finally:
            c.stop_all()




@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()
