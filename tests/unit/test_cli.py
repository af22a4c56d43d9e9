"""The ``pipelines`` command on an in-memory app: every command's output, and its errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.memory import MemoryStorage
from pipelines import JobStatus
from pipelines.app import App
from pipelines.cli import main
from pipelines.engine.control import cancel_job
from pipelines.engine.errors import JobConflictError, JobNotFoundError, StaleVersionError
from pipelines.engine.models import Commit
from tests.apps import memory_app

APP = "tests.apps.memory_app:app"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    return memory_app.reset()


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def drain(app: App) -> None:
    app.scheduler.drain()  # type: ignore[attr-defined]


# --- jobs, status ---------------------------------------------------------------
def test_jobs_lists_every_job_and_filters_by_status(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    app.run_pipeline("flaky", job_id="flaky-1")
    drain(app)
    app.run_pipeline("slow", job_id="slow-1")

    code, out, err = run("jobs", "--app", APP)
    assert code == 0 and err == ""
    rows = [line.split("\t") for line in out.splitlines()]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("etl-1", "complete", "etl"), ("flaky-1", "error", "flaky"), ("slow-1", "running", "slow"),
    ]
    code, out, _ = run("jobs", "--app", APP, "--status", "running")
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["slow-1"]


def test_status_of_a_running_job_shows_its_phase(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    code, out, _ = run("status", "--app", APP, "etl-1")
    assert code == 0
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["status"].strip() == "running"
    assert fields["phase"].strip() == "extract"
    assert fields["pipeline"].strip() == "etl"


def test_status_says_when_no_worker_of_this_app_runs_the_jobs_pipeline(app: App) -> None:
    # A job of a pipeline taken out of the app (or another app's on the storage) stayed "running" for good, and
    # status gave no hint why.
    from adapters.memory import MemoryScheduler
    from pipelines import Done, Phase

    other = App(storage=app.storage, scheduler=MemoryScheduler(), pipelines={"old": [Phase("a", lambda c: Done())]})
    other.run_pipeline("old", job_id="o-1")
    app.run_pipeline("etl", job_id="etl-1")
    fields = dict(line.split(":", 1) for line in run("status", "--app", APP, "o-1")[1].splitlines())
    assert fields["pipeline"].strip().startswith("old (not registered in this app: another app's on the storage")
    fields = dict(line.split(":", 1) for line in run("status", "--app", APP, "etl-1")[1].splitlines())
    assert fields["pipeline"].strip() == "etl"


def test_status_says_who_holds_the_lease_and_when_a_worker_was_lost_mid_turn(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    assert app.storage.acquire_lease("etl-1", "worker-a", 30) is not None
    app.scheduler.clock.advance(31)  # type: ignore[attr-defined]  # nothing renewed it: its worker died mid-turn
    fields = dict(line.split(":", 1) for line in run("status", "--app", APP, "etl-1")[1].splitlines())
    assert "its worker was lost mid-turn" in fields["lease"] and "pipelines advance --due" in fields["lease"]
    assert "interrupted" not in fields
    assert app.storage.acquire_lease("etl-1", "worker-b", 30) is not None  # the next worker takes the turn
    fields = dict(line.split(":", 1) for line in run("status", "--app", APP, "etl-1")[1].splitlines())
    assert fields["lease"].strip() == "held by worker-b"
    assert fields["interrupted"].strip() == ("1 time(s) in a row without committing (its worker died or stalled "
                                             "past its lease); the job fails at 5")
    app.storage.release_lease("etl-1", "worker-b")
    assert "lease" not in dict(line.split(":", 1) for line in run("status", "--app", APP, "etl-1")[1].splitlines())


def test_status_of_a_complete_job_shows_its_result_and_json_is_the_record(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    drain(app)
    code, out, _ = run("status", "--app", APP, "etl-1")
    assert code == 0 and "complete" in out and 'result:      {"loaded": 3}' in out
    code, out, _ = run("status", "--app", APP, "etl-1", "--json")
    assert code == 0 and json.loads(out)["result"] == {"loaded": 3}


def test_status_of_a_failed_job_shows_the_error(app: App) -> None:
    app.run_pipeline("flaky", job_id="f")
    drain(app)
    code, out, _ = run("status", "--app", APP, "f")
    assert code == 0 and "error:       boom: upstream said no" in out
    assert "due:" not in out  # its kept checkpoint is due nowhere (a retry makes it due)


def test_status_of_a_paused_job_shows_the_due_time_its_resume_keeps(app: App) -> None:
    app.run_pipeline("slow", job_id="s")
    assert app.scheduler.run_next()  # type: ignore[attr-defined]  # its phase asked to wait an hour
    app.pause("s")
    code, out, _ = run("status", "--app", APP, "s")
    assert code == 0 and "paused" in out and "due:" in out


@pytest.mark.parametrize("command", ["status", "log", "transcript", "retry", "cancel", "advance"])
def test_an_unknown_job_is_an_error_with_exit_code_1(app: App, command: str) -> None:
    code, out, err = run(command, "--app", APP, "nope")
    assert code == 1 and out == ""
    assert err == f"error: job 'nope' not found; `pipelines jobs --app {APP}` lists the jobs this app's storage holds\n"


def test_an_invalid_job_id_is_a_clear_error(app: App) -> None:
    code, _, err = run("status", "--app", APP, "bad id")
    assert code == 1 and err.startswith("error: invalid job id 'bad id'")


# --- advance ---------------------------------------------------------------------
def test_advance_one_job_runs_one_phase_and_prints_the_result(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    assert run("advance", "--app", APP, "etl-1") == (0, "etl-1 advanced\n", "")
    assert run("advance", "--app", APP, "etl-1") == (0, "etl-1 completed\n", "")
    assert run("advance", "--app", APP, "etl-1") == (0, "etl-1 not_running\n", "")


def test_advance_due_advances_every_due_job_once_like_cron(app: App) -> None:
    app.run_pipeline("etl", job_id="a")
    app.run_pipeline("etl", job_id="b")
    app.run_pipeline("slow", job_id="s")
    app.scheduler.drop_all()  # type: ignore[attr-defined]  # the queue lost every message
    code, out, _ = run("advance", "--app", APP, "--due", "--grace", "0")
    assert code == 0 and sorted(out.splitlines()) == ["a advanced", "b advanced", "s advanced"]
    # "s" waits an hour now: only a and b are due.
    code, out, _ = run("advance", "--app", APP, "--due", "--grace", "0")
    assert sorted(out.splitlines()) == ["a completed", "b completed"]
    assert run("advance", "--app", APP, "--due", "--grace", "0") == (0, "", "")


def test_advance_due_leaves_fresh_jobs_to_the_workers_by_default(app: App) -> None:
    # A cron run of the default command touches what no worker took within the workers' sweep grace (5 s):
    # not every job just started, whose queue message is fine (it ran their turns in the cron process).
    app.run_pipeline("etl", job_id="fresh")
    assert run("advance", "--app", APP, "--due") == (0, "", "")
    app.scheduler.drop_all()  # type: ignore[attr-defined]  # its message was lost
    app.scheduler.clock.advance(5.0)  # type: ignore[attr-defined]
    assert run("advance", "--app", APP, "--due") == (0, "fresh advanced\n", "")


def test_advance_needs_either_due_or_a_job(app: App) -> None:
    code, _, err = run("advance", "--app", APP)
    assert code == 1 and "either --due or one JOB" in err
    code, _, err = run("advance", "--app", APP, "--due", "x")
    assert code == 1 and "either --due or one JOB" in err


def test_sweep_with_a_grace_period_skips_jobs_that_only_just_became_due(app: App) -> None:
    app.run_pipeline("etl", job_id="fresh")
    assert app.advance_due(grace=5.0) == []
    app.scheduler.clock.advance(6)  # type: ignore[attr-defined]
    assert [(j, r.value) for j, r in app.advance_due(grace=5.0)] == [("fresh", "advanced")]


def test_requeue_enqueues_overdue_unleased_jobs_without_running_them(app: App) -> None:
    app.run_pipeline("etl", job_id="lost")
    app.run_pipeline("etl", job_id="held")
    app.scheduler.drop_all()  # type: ignore[attr-defined]
    assert app.storage.acquire_lease("held", "a-worker", 60) is not None
    assert app.requeue_overdue(grace=5.0) == []  # not overdue yet
    app.scheduler.clock.advance(6)  # type: ignore[attr-defined]
    assert app.requeue_overdue(grace=5.0) == ["lost"]
    rec = app.storage.get_job("lost")
    assert rec is not None and rec.phases_done == 0  # nothing ran here
    app.scheduler.drain()  # type: ignore[attr-defined]
    rec = app.storage.get_job("lost")
    assert rec is not None and rec.status is JobStatus.COMPLETE


# --- log, transcript ------------------------------------------------------------
def test_log_prints_one_line_per_entry(app: App) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    drain(app)
    code, out, _ = run("log", "--app", APP, "etl-1")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert lines[0].startswith("2023-11-14T22:13:20.000Z  info ")
    assert lines[0].endswith("extract  job started")
    assert lines[1].endswith("extract  extracted 3 rows")
    assert lines[2].endswith("load  job complete")


def test_transcript_prints_json_lines_or_pretty(app: App) -> None:
    app.run_pipeline("chat", job_id="c")
    drain(app)
    code, out, _ = run("transcript", "--app", APP, "c")
    messages = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages == app.storage.messages("c")
    code, out, _ = run("transcript", "--app", APP, "c", "--pretty")
    assert code == 0
    assert out.splitlines() == [
        "[0] assistant:",
        '    -> add({"a": 1}) [c1]',
        '[1] tool (c1): {"sum": 2}',
        "[2] assistant: the sum is 2",
    ]


# --- retry, cancel ----------------------------------------------------------------
def test_retry_resumes_a_failed_job_from_its_checkpoint(app: App) -> None:
    app.run_pipeline("flaky", job_id="f")
    drain(app)
    code, out, _ = run("retry", "--app", APP, "f")
    assert (code, out) == (0, "f: retried (resume) at phase 'flaky', status running\n")
    drain(app)
    rec = app.storage.get_job("f")
    assert rec is not None and rec.status is JobStatus.COMPLETE and rec.result == "ok"


def test_retry_full_restarts_from_the_first_phase(app: App) -> None:
    app.run_pipeline("etl", job_id="e")
    drain(app)
    code, out, _ = run("retry", "--app", APP, "e", "--full")
    assert (code, out) == (0, "e: retried (full) at phase 'extract', status running\n")


def test_retry_of_a_running_job_is_a_conflict(app: App) -> None:
    app.run_pipeline("slow", job_id="s")
    code, _, err = run("retry", "--app", APP, "s")
    assert code == 1 and err.startswith("error: job 's' is running")


def test_cancel_keeps_the_checkpoint_and_retry_resumes_it(app: App) -> None:
    app.run_pipeline("slow", job_id="s")
    drain_once = app.scheduler.run_next  # type: ignore[attr-defined]
    drain_once()
    code, out, _ = run("cancel", "--app", APP, "s")
    assert (code, out) == (0, "s: cancelled, checkpoint kept at phase 'wait'\n")
    rec = app.storage.get_job("s")
    assert rec is not None and rec.status is JobStatus.CANCELLED and rec.checkpoint is not None
    assert app.storage.due_jobs(float("inf")) == []  # no longer due anywhere
    code, _, err = run("cancel", "--app", APP, "s")
    assert code == 1 and err == "error: job 's' is already cancelled; nothing to cancel\n"
    code, out, _ = run("retry", "--app", APP, "s")
    assert code == 0 and "status running" in out


def test_cancel_of_a_complete_job_is_a_conflict(app: App) -> None:
    app.run_pipeline("etl", job_id="e")
    drain(app)
    with pytest.raises(JobConflictError, match="already complete"):
        cancel_job("e", storage=app.storage, scheduler=app.scheduler)
    with pytest.raises(JobNotFoundError):
        app.retry("nope")


def test_a_forced_cancel_fences_off_a_turn_in_flight(app: App) -> None:
    app.run_pipeline("etl", job_id="e")
    storage = app.storage
    assert isinstance(storage, MemoryStorage)
    before = storage.acquire_lease("e", "worker-1", 60)  # a worker is mid-phase
    assert before is not None
    cancel_job("e", storage=storage, scheduler=app.scheduler, force=True)
    with pytest.raises(StaleVersionError):
        storage.record_step("e", version=before.version, owner="worker-1", key="model", value=1)
    done = before.model_copy(update={"status": JobStatus.COMPLETE, "version": before.version + 1})
    with pytest.raises(StaleVersionError):
        storage.commit(Commit(job_id="e", expected_version=before.version, owner="worker-1", token="t", record=done))
    rec = storage.get_job("e")
    assert rec is not None and rec.status is JobStatus.CANCELLED


# --- configuration errors ---------------------------------------------------------
def test_the_app_can_come_from_the_environment(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINES_APP", APP)
    assert run("jobs") == (0, "", "")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (None, "error: no app given: pass --app package.module:app or set PIPELINES_APP"),
        ("nocolon", "error: app path must look like 'package.module:app', got 'nocolon'"),
        ("tests.apps.no_such_module:app", "error: cannot import 'tests.apps.no_such_module'"),
        ("tests.apps.memory_app:nothing", "error: module 'tests.apps.memory_app' has no attribute 'nothing'"),
        ("tests.apps.memory_app:START", "error: 'tests.apps.memory_app:START' is a float, not a pipelines.App"),
        ("tests.apps.broken_app:app", "error: cannot load app 'tests.apps.broken_app:app': KeyError:"),
    ],
)
def test_bad_app_paths_are_clear_errors(
    app: App, monkeypatch: pytest.MonkeyPatch, path: str | None, message: str
) -> None:
    code, out, err = run("jobs", *(["--app", path] if path else []))
    assert code == 1 and out == ""
    assert err.startswith(message) and "Traceback" not in err


def test_a_bad_redis_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "http://127.0.0.1:6379/0")
    monkeypatch.delitem(sys.modules, "tests.apps.redis_app", raising=False)
    code, _, err = run("jobs", "--app", "tests.apps.redis_app:app")
    assert code == 1 and err.startswith("error: bad Redis URL 'http://127.0.0.1:6379/0'")


def test_worker_needs_an_rq_scheduler(app: App) -> None:
    code, _, err = run("worker", "--app", APP, "--burst")
    assert code == 1
    assert err.startswith("error: `pipelines worker` needs an app whose scheduler is adapters.rq.RQScheduler")
    assert err.endswith("not MemoryScheduler\n")


def test_usage_errors_exit_with_2(app: App, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["jobs", "--app", APP, "--status", "sleeping"], ["frobnicate"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "usage: pipelines" in capsys.readouterr().err


def test_python_dash_m_pipelines_runs_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "pipelines", "jobs", "--app", APP], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = subprocess.run([sys.executable, "-m", "pipelines", "status", "--app", APP, "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    hint = f"`pipelines jobs --app {APP}` lists the jobs this app's storage holds"
    assert (proc.returncode, proc.stderr) == (1, f"error: job 'x' not found; {hint}\n")


def test_jobs_lists_the_rest_and_names_an_unreadable_record(app: App, caplog: pytest.LogCaptureFixture) -> None:
    app.run_pipeline("etl", job_id="etl-1")
    app.run_pipeline("etl", job_id="etl-2")
    app.storage._jobs["etl-1"].record = "{not json"  # type: ignore[attr-defined]
    with caplog.at_level("ERROR", logger="pipelines"):
        code, out, _ = run("jobs", "--app", APP)
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["etl-2"]
    assert "job etl-1: unreadable record skipped" in caplog.text


@pytest.mark.parametrize("argv", [("tail", "j", "--poll", "-1"), ("tail", "j", "--poll", "0"),
                                  ("cancel", "j", "--wait", "inf"), ("pause", "j", "--wait", "nan")])
def test_bad_seconds_on_the_command_line_are_usage_errors_naming_the_option(argv: tuple[str, ...],
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(*argv, "--app", APP)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[2]}" in err and "Traceback" not in err
