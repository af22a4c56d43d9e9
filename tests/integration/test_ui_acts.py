"""Acting from the page (issue 35): fork / rerun from a turn and send or continue, each behind a confirm step."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

from pipelines import App
from pipelines.engine.models import JobStatus
from pipelines.web.ui import ui_app
from tests.integration.test_ui import LOCAL, app, csrf_of  # app: the fixture

__all__ = ["app"]


def _chat(app: App) -> None:
    app.run_agent("desk", job_id="c1", user="hello")
    app.drain()
    assert app.get("c1").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_fork_asks_first_then_forks_and_says_what_it_did(app: App) -> None:
    _chat(app)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/c1").text
        assert 'action="/jobs/c1/fork"' in page
        ask = c.post("/jobs/c1/fork", data={"csrf": csrf_of(page), "at_turn": "1"})
        assert ask.status_code == 200 and "Fork c1 after turn 1" in ask.text and 'name="confirmed"' in ask.text
        assert [r.job_id for r in app.storage.list_jobs(limit=10)] == ["c1"]  # nothing done yet
        done = c.post("/jobs/c1/fork", data={"csrf": csrf_of(ask.text), "at_turn": "1", "confirmed": "yes",
                                             "new_job_id": "c1-b", "run": "no", "max_turns": "3"})
    assert done.status_code == 200 and "forked c1 after turn 1 into c1-b, paused" in done.text
    fork = app.get("c1-b")
    assert fork is not None and fork.record.forked_from == "c1"  # type: ignore[attr-defined]


def test_rerun_runs_the_fork_at_once(app: App) -> None:
    _chat(app)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        token = csrf_of(c.get("/jobs/c1").text)
        done = c.post("/jobs/c1/fork", data={"csrf": token, "at_turn": "0", "confirmed": "yes",
                                             "new_job_id": "c1-r", "run": "yes"})
    assert "running now" in done.text
    app.drain()
    assert app.get("c1-r").status is JobStatus.COMPLETE  # type: ignore[union-attr]


def test_send_continues_a_finished_conversation_after_confirming(app: App) -> None:
    _chat(app)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/c1").text
        assert 'id="send">Continue' in page
        ask = c.post("/jobs/c1/send", data={"csrf": csrf_of(page), "text": "and more\u202e"})
        assert "Continue c1" in ask.text and "&lt;U+202E&gt;" in ask.text
        assert len(app.messages("c1")) == 2  # nothing sent yet
        done = c.post("/jobs/c1/send", data={"csrf": csrf_of(ask.text), "text": "and more", "confirmed": "yes"})
        assert "continued c1" in done.text
        app.drain()
        assert app.messages("c1")[-1]["content"] == "you said: and more"
        empty = c.post("/jobs/c1/send", data={"csrf": csrf_of(ask.text), "text": "  ", "confirmed": "yes"})
        assert empty.status_code == 400
        bad = c.post("/jobs/c1/fork", data={"csrf": csrf_of(ask.text), "at_turn": "-1"})
        assert bad.status_code == 400 and "at_turn" in bad.text


def test_the_confirm_step_needs_csrf_and_read_only_refuses(app: App) -> None:
    _chat(app)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        assert c.post("/jobs/c1/fork", data={"at_turn": "1", "confirmed": "yes", "new_job_id": "x"}).status_code == 403
    bearer = {"authorization": "Bearer correct-horse"}
    with TestClient(ui_app(app, token="correct-horse", read_only=True), base_url=LOCAL, headers=bearer) as c:
        page = c.get("/jobs/c1").text
        assert 'action="/jobs/c1/fork"' not in page and 'id="send"' not in page
        refused = c.post("/jobs/c1/send", data={"csrf": csrf_of(page), "text": "hi", "confirmed": "yes"})
    assert refused.status_code == 403
    assert app.get("x") is None and len(app.messages("c1")) == 2
