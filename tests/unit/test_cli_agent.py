"""`pipelines agent list` / `pipelines agent run` on an in-memory app."""

from __future__ import annotations

import io

import pytest

from pipelines.cli import main
from tests.apps import children_app

APP = "tests.apps.children_app:app"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    children_app.reset()


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_agent_list_names_each_agent_with_its_model_and_tools() -> None:
    code, out, err = run("agent", "list", "--app", APP)
    rows = dict(line.split("\t", 1) for line in out.splitlines())
    assert code == 0 and err == "" and set(rows) == {"boss", "researcher"}
    assert "tools=researcher" in rows["boss"] and "model=ScriptedModel" in rows["boss"]


def test_agent_run_waits_and_prints_the_answer_or_follows_the_stream() -> None:
    code, out, _ = run("agent", "run", "boss", "--app", APP, "--input", "hi", "--job", "c1")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "job c1" and lines[-1] == "parent heard: child says: look it up"
    code, out, _ = run("agent", "run", "researcher", "--app", APP, "--input", "what?", "--job", "c2", "--follow")
    assert code == 0 and out.splitlines()[1] == "child says: what?"  # streamed, then the turn closed


def test_agent_run_without_input_or_with_bad_context_is_a_clear_error() -> None:
    code, _, err = run("agent", "run", "boss", "--app", APP)
    assert code == 1 and "needs the agent's NAME and --input" in err
    code, _, err = run("agent", "run", "boss", "--app", APP, "--input", "x", "--context", "{nope")
    assert code == 1 and "--context must be JSON" in err
