"""``pipelines jobs --tag`` and ``App.jobs(tags=...)`` (issue 13: tags and provenance)."""

from __future__ import annotations

import io

import pytest

from pipelines import Agent
from pipelines.cli import main
from pipelines.engine.errors import InvalidInputError
from pipelines.testing import ScriptedModel
from tests.apps import memory_app

APP = "tests.apps.memory_app:app"


def test_jobs_filters_by_every_tag_given_and_shows_the_tags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    app = memory_app.reset()
    app.provenance = False
    app.add_agent(Agent(name="helper", model=ScriptedModel(["a", "b", "c"])))
    app.run_agent("helper", job_id="j1", user="hi", tags=["tenant:acme", "beta"])
    app.run_agent("helper", job_id="j2", user="hi", tags=["tenant:acme"])
    app.run_agent("helper", job_id="j3", user="hi", tags=["tenant:zeta"])
    assert [v.job_id for v in app.jobs(tags=["tenant:acme"])] == ["j1", "j2"]
    out = io.StringIO()
    assert main(["jobs", "--app", APP, "--tag", "tenant:acme", "--tag", "beta"], out=out, err=io.StringIO()) == 0
    rows = [line.split("\t") for line in out.getvalue().splitlines()]
    assert [(r[0], r[-1]) for r in rows] == [("j1", "tenant:acme,beta")]
    with pytest.raises(InvalidInputError, match="without whitespace"):
        app.jobs(tags=["a b"])
    with pytest.raises(InvalidInputError, match="tag"):  # a run is refused it: so is a filter, not an empty page
        app.jobs(tags=["t\ud800"])


def test_jobs_shows_a_tags_control_characters_escaped_not_sent_to_the_terminal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    app = memory_app.reset()
    app.provenance = False
    app.add_agent(Agent(name="helper", model=ScriptedModel(["a"])))
    app.run_agent("helper", job_id="t1", user="hi", tags=["\x1b]0;PWNED\x07\x1b[2J"])  # no whitespace: a valid tag
    for argv in (["jobs", "--app", APP], ["jobs", "--app", APP, "--version"]):
        out = io.StringIO()
        assert main(argv, out=out, err=io.StringIO()) == 0
        assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    out = io.StringIO()
    assert main(["jobs", "--app", APP], out=out, err=io.StringIO()) == 0
    assert out.getvalue().split("\t")[-1].strip() == "\\x1b]0;PWNED\\x07\\x1b[2J"
