"""The README's "Production in one screen" runs as written: the app module, the web call, then the shell.

In a temp dir outside the checkout: ``myapp/agents.py`` saved from its block, the web block run as a
program, then each line of the shell block run by bash (``pipelines worker`` in the background, as a
deployment runs it). A real redis-server, a real RQ worker process and litellm's real HTTP path to the
loopback OpenAI-compatible server (``OPENAI_API_BASE``; any other host goes to a dead proxy on
127.0.0.1, so nothing leaves the machine). The job the web call started completes with the tool's result.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_openai import FakeOpenAI, call, text_reply, tool_reply
from tests.leftovers import end_leftovers
from tests.readme_blocks import blocks
from tests.redis_server import die_with_parent

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.system]


def test_the_production_screen_runs_as_written(tmp_path: Path, redis_url: str, fake_openai: FakeOpenAI) -> None:
    module, web, shell = [b for b in blocks() if b.section == "Production in one screen"]
    assert module.file == "myapp/agents.py"
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / module.file).write_text(module.text)
    fake_openai.script(tool_reply(call("lookup_order", {"order_id": "A-1"})), text_reply("It has shipped."))
    env = {k: v for k, v in os.environ.items() if k not in ("PIPELINES_BLOCK_REMOTE_MODELS", "PIPELINES_APP")}
    env.update(REDIS_URL=redis_url, OPENAI_API_BASE=fake_openai.url, OPENAI_API_KEY="sk-test",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")]),
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")

    out = subprocess.run([sys.executable, "-"], input=web.text, cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    workers: list[subprocess.Popen[bytes]] = []
    log = tmp_path / "worker.log"
    try:
        for command in shell.commands():
            if command.startswith("pipelines worker"):
                with log.open("ab") as sink:
                    workers.append(subprocess.Popen(["bash", "-c", command], cwd=tmp_path, env=env, stdout=sink,
                                                    stderr=subprocess.STDOUT, start_new_session=True,
                                                    preexec_fn=die_with_parent))
                continue
            ran = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=120)
            assert ran.returncode == 0, f"{command}: {ran.stdout}{ran.stderr}"
        assert workers, "the shell block starts a worker"
        status = ""
        deadline = time.monotonic() + 240  # the worker imports litellm first: slow on a busy 2-core host
        while time.monotonic() < deadline and "complete" not in status:
            time.sleep(1)
            status = subprocess.run(["bash", "-c", "pipelines status chat-42 --app myapp.agents:app"], cwd=tmp_path,
                                    env=env, capture_output=True, text=True, timeout=120).stdout
        assert "status:      complete" in status, status + log.read_text(errors="replace")[-3000:]
        transcript = subprocess.run(["bash", "-c", "pipelines transcript chat-42 --app myapp.agents:app --pretty"],
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120).stdout
        assert "lookup_order" in transcript and '"status": "shipped"' in transcript
        assert transcript.rstrip().endswith("assistant: It has shipped.")
    finally:
        for proc in workers:
            end_leftovers(proc.pid)  # the worker's horse and scheduler child first, then the worker's group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
