"""What an operator sees from the ``pipelines`` command in a first incident.

- ``agent run --follow`` on a queue with no worker says so after a few seconds, naming the queue and the
  command that starts a worker (real redis-server and RQ queues, no worker process);
- every error is one line on stderr with the fix (an unknown job, a Redis that is down, a wait that ran out);
- a reader that goes away (``pipelines status JOB | head -1``) ends the command quietly: no traceback.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines import worker
from pipelines.cli import agent as cli_agent
from pipelines.cli import main
from pipelines.cli.errors import CLOSED_PIPE_EXIT
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]

QUEUE_APP = """
import os
from adapters.redis import RedisStorage
from adapters.rq import RQScheduler
from pipelines import Agent, App
from pipelines.testing import ScriptedModel

storage = RedisStorage.from_url(os.environ["OPS_REDIS_URL"], prefix="ops")
scheduler = RQScheduler.for_storage(storage, queue="agents", app="{module}:app")
app = App(storage=storage, scheduler=scheduler, agents=[Agent(name="support", model=ScriptedModel(["hi"]))])
"""

MEMORY_APP = """
from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App
from pipelines.testing import ScriptedModel

app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(),
          agents=[Agent(name="support", model=ScriptedModel(["x" * 200_000]))])
app.run_agent("support", job_id="J", messages=["hi"]).wait()
"""


def write_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source.format(module=name)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    worker.forget_apps()
    return f"{name}:app"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.redis
def test_follow_says_when_no_worker_has_taken_the_job_and_which_queue_it_waits_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setenv("OPS_REDIS_URL", redis_url)
    app = write_app(tmp_path, monkeypatch, "ops_queue_app", QUEUE_APP)
    monkeypatch.setattr(cli_agent, "NO_WORKER_SECONDS", 0.3)
    began = time.monotonic()
    code, out, err = run("agent", "run", "support", "--app", app, "--input", "hi", "--job", "j1", "--follow",
                         "--timeout", "1.5")
    # One --timeout for the stream and the wait after it: it waited 1.5 s twice (3 s for 1.5).
    assert time.monotonic() - began < 2.9
    lines = err.splitlines()
    assert code == 1 and out.splitlines() == ["job j1"]
    assert lines[0] == ("waiting: no worker has taken job 'j1' after 0.3s; it waits on queue 'agents': "
                        f"start `pipelines worker --app {app}`")
    # Then the wait runs out: one line, saying the job goes on and how to find it.
    assert lines[1].startswith("error: job 'j1' is still running after 1.5 s; the job goes on; is a worker running")
    assert len(lines) == 2


@pytest.mark.redis
def test_follow_stays_quiet_once_a_worker_has_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    monkeypatch.setenv("OPS_REDIS_URL", redis_url)
    app = write_app(tmp_path, monkeypatch, "ops_taken_app", QUEUE_APP)
    monkeypatch.setattr(cli_agent, "NO_WORKER_SECONDS", 0.5)
    import ops_taken_app  # type: ignore[import-not-found]

    # A worker takes the job as soon as it is queued: it holds the lease, and has not committed a turn yet.
    the_app = ops_taken_app.app
    real_run_agent = the_app.run_agent

    def run_and_take(*args: Any, **kwargs: Any) -> Any:
        handle = real_run_agent(*args, **kwargs)
        assert the_app.storage.acquire_lease(handle.job_id, "worker-1", 30.0) is not None
        return handle

    monkeypatch.setattr(the_app, "run_agent", run_and_take)
    code, _, err = run("agent", "run", "support", "--app", app, "--input", "hi", "--job", "j2", "--follow",
                       "--timeout", "1.2")
    assert code == 1 and "no worker has taken" not in err


def test_an_unknown_job_is_one_line_naming_the_listing_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = write_app(tmp_path, monkeypatch, "ops_memory_app", MEMORY_APP)
    code, out, err = run("status", "nope", "--app", app)
    assert (code, out) == (1, "")
    assert err == f"error: job 'nope' not found; `pipelines jobs --app {app}` lists the jobs this app's storage holds\n"


def test_a_redis_that_is_down_is_one_line_naming_the_health_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPS_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    app = write_app(tmp_path, monkeypatch, "ops_down_app", QUEUE_APP)
    code, out, err = run("status", "J", "--app", app)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("error: Redis is unreachable")
    assert err.endswith(f"`pipelines health --app {app}` checks it\n")


def test_an_unusable_sqlite_file_is_one_line_naming_what_to_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It asked "is the storage server running?": an SQLite file has no server.
    db = tmp_path / "garbage.db"
    db.write_bytes(b"not a database, " * 512)
    monkeypatch.setenv("OPS_DB", str(db))
    app = write_app(tmp_path, monkeypatch, "ops_sqlite_app", """
        import os
        from adapters.memory import MemoryScheduler
        from adapters.sqlite import SQLiteStorage
        from pipelines import Agent, App
        from pipelines.testing import ScriptedModel

        app = App(storage=SQLiteStorage(os.environ["OPS_DB"]), scheduler=MemoryScheduler(),
                  agents=[Agent(name="support", model=ScriptedModel(["hi"]))])
        """)
    code, out, err = run("status", "J", "--app", app)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(f"error: the SQLite file {db} failed")
    assert "is that path the app's SQLite file?" in err and "storage server" not in err
    assert err.endswith(f"`pipelines health --app {app}` checks it\n")


def test_a_sweep_that_could_not_advance_a_job_says_so_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It printed "unknown" (no such job) and exited 0: a cron's monitor saw success.
    app = write_app(tmp_path, monkeypatch, "ops_sweep_app", """
        from adapters.memory import MemoryScheduler, MemoryStorage
        from pipelines import App, Done, Phase
        from pipelines.testing import ScriptedModel

        storage = MemoryStorage()
        older = App(storage=storage, scheduler=MemoryScheduler(), pipelines={{"etl": [Phase("a", lambda ctx: Done())]}})
        older.run_pipeline("etl", job_id="a-etl")
        older.run_pipeline("etl", job_id="b-etl")
        # This deployment lost the "etl" pipeline, and one job runs a pipeline it still has.
        app = App(storage=storage, scheduler=MemoryScheduler(), pipelines={{"p": [Phase("a", lambda ctx: Done())]}})
        app.run_pipeline("p", job_id="c-ok")
        """)
    code, out, _ = run("advance", "--due", "--grace", "0", "--app", app)
    assert code == 1
    assert out.splitlines() == ["a-etl unreached", "b-etl unreached", "c-ok completed"]


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    (tmp_path / "ops_pipe_app.py").write_text(textwrap.dedent(MEMORY_APP))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    for argv in (["status", "J"], ["transcript", "J"]):  # a few lines, and one line of 200 KB
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", *argv, "--app", "ops_pipe_app:app"],
                                stdout=write, stderr=subprocess.PIPE, cwd=tmp_path, env=env)
        os.close(write)
        os.close(read)  # the reader is gone before the command writes a byte (`| head -0`)
        _, stderr = proc.communicate(timeout=120)
        assert stderr.decode() == "", argv
        assert proc.returncode == CLOSED_PIPE_EXIT, argv
