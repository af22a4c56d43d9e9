"""Acting from the page (issue 35): fork / rerun from a turn and send or continue, each behind a confirm step."""

from __future__ import annotations

import re
import warnings
from typing import Any
from urllib.parse import urlencode

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
        once = re.search(r'name="once" value="([^"]+)"', ask.text)
        assert once is not None
        form = {"csrf": csrf_of(ask.text), "text": "and more", "confirmed": "yes", "once": once.group(1)}
        done = c.post("/jobs/c1/send", data=form, follow_redirects=False)
        # Said on a page of its own, after a redirect: reloading what the browser shows sends nothing again.
        assert done.status_code == 303 and done.headers["location"] == "/jobs/c1/done?did=continued"
        # A second post of the same form (a double click on Confirm) says the same and sends nothing.
        again = c.post("/jobs/c1/send", data=form, follow_redirects=False)
        assert again.status_code == 303 and again.headers["location"] == done.headers["location"]
        # A form without its one-time token (built by hand, or a page from before) is refused.
        bare = c.post("/jobs/c1/send", data={**form, "once": ""}, follow_redirects=False)
        assert bare.status_code == 400 and "one-time token" in bare.text
        shown = c.get(done.headers["location"])
        assert "continued c1" in shown.text and 'href="/jobs/c1" id="open-target"' in shown.text
        assert "continued c1" in c.get(done.headers["location"]).text  # the reload
        app.drain()
        assert app.messages("c1")[-1]["content"] == "you said: and more"
        assert [m["content"] for m in app.messages("c1") if m["role"] == "user"].count("and more") == 1
        assert c.get("/jobs/c1/done?did=deleted").status_code == 400
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


# --- bulk actions on the jobs page --------------------------------------------------------------
def _post(c: TestClient, fields: list[tuple[str, str]]) -> Any:
    """A form with a name sent more than once (the ticked jobs), as a browser sends it."""
    return c.post("/bulk", content=urlencode(fields),
                  headers={"content-type": "application/x-www-form-urlencoded"})


def test_bulk_cancel_and_retry_confirm_first_then_act_on_each_ticked_job(app: App) -> None:
    from tests.integration.test_ui import waiting_job

    waiting_job(app, "w1")
    waiting_job(app, "w2")
    _chat(app)  # c1: complete, so cancelling it is refused and said so
    app.run_pipeline("flaky", job_id="f1")
    app.drain()
    assert app.get("f1").status is JobStatus.ERROR  # type: ignore[union-attr]
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/").text
        assert 'form="bulk"' in page and 'id="bulk-cancel"' in page
        ids = [("id", "w1"), ("id", "c1"), ("id", "w2"), ("id", "w1")]  # ticked twice: acted on once
        ask = _post(c, [("csrf", csrf_of(page)), ("action", "cancel"), *ids])
        assert ask.status_code == 200 and "Cancel 3 jobs" in ask.text and 'name="confirmed"' in ask.text
        assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]  # nothing done yet
        done = _post(c, [("csrf", csrf_of(page)), ("action", "cancel"), ("confirmed", "yes"), *ids])
        assert done.status_code == 200 and "cancel: 2 of 3 jobs done" in done.text
        assert 'data-job="c1" data-ok="no"' in done.text and "already complete" in done.text
        assert [app.get(j).status for j in ("w1", "w2", "c1")] == [  # type: ignore[union-attr]
            JobStatus.CANCELLED, JobStatus.CANCELLED, JobStatus.COMPLETE]
        again = _post(c, [("csrf", csrf_of(page)), ("action", "retry"), ("mode", "resume"),
                                      ("confirmed", "yes"), ("id", "f1"), ("id", "w1")])
        assert "retry: 2 of 2 jobs done" in again.text and "from its checkpoint" in again.text
    app.drain()
    assert app.get("f1").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]  # resumed: waits for its approval again


def test_bulk_actions_refuse_bad_input_whole_and_read_only(app: App) -> None:
    from tests.integration.test_ui import waiting_job

    waiting_job(app, "w1")
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        token = csrf_of(c.get("/").text)
        cases = {
            "no job ticked": [("action", "cancel"), ("confirmed", "yes")],
            "unknown action": [("action", "delete"), ("id", "w1"), ("confirmed", "yes")],
            "bad mode": [("action", "retry"), ("mode", "sideways"), ("id", "w1"), ("confirmed", "yes")],
            "bad id": [("action", "cancel"), ("id", "w1"), ("id", "a b/c"), ("confirmed", "yes")],
            "too many": [("action", "cancel"), ("confirmed", "yes"), *[("id", f"j{i}") for i in range(51)]],
        }
        for what, fields in cases.items():
            r = _post(c, [("csrf", token), *fields])
            assert r.status_code == 400, what
        assert _post(c, [("action", "cancel"), ("id", "w1"), ("confirmed", "yes")]).status_code == 403
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]  # nothing half done
    bearer = {"authorization": "Bearer correct-horse"}
    with TestClient(ui_app(app, token="correct-horse", read_only=True), base_url=LOCAL, headers=bearer) as c:
        page = c.get("/").text
        assert 'form="bulk"' not in page and 'id="bulk"' not in page
        refused = _post(c, [("csrf", csrf_of(page)), ("action", "cancel"), ("id", "w1"),
                                        ("confirmed", "yes")])
    assert refused.status_code == 403 and app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]


def test_a_continued_conversations_turns_are_numbered_over_its_life_on_the_page(app: App) -> None:
    # Each run of a conversation counts its own turns from 1; what a turn is on the page (its row, its call, the
    # turn a fork goes on from) is the job's: turn 3 is the third run's first turn, not the first run's.
    import re

    _chat(app)
    for text in ("second question", "third question"):
        app.send("c1", [text])
        app.drain()
    assert [e.turn for e in app.events("c1") if e.type == "turn_committed"] == [1, 2, 3]
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/c1").text
        assert re.findall(r'<tr class="turn" id="turn-(\d+)"', page) == ["1", "2", "3"]
        call = c.get("/jobs/c1/turns/3").text
        assert "you said: third question" in call and "you said: hello" not in call
        done = c.post("/jobs/c1/fork", data={"csrf": csrf_of(page), "at_turn": "3", "confirmed": "yes",
                                             "new_job_id": "c1-3", "run": "no"})
    assert "forked c1 after turn 3 into c1-3" in done.text
    assert app.messages("c1-3") == app.messages("c1")


def test_a_message_as_long_as_promised_is_taken_in_any_script(app: App) -> None:
    from pipelines.web.acts import MAX_MESSAGE_CHARS
    from pipelines.web.auth import MAX_FORM_BYTES

    _chat(app)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        token = csrf_of(c.get("/jobs/c1").text)
        for text in ("é" * MAX_MESSAGE_CHARS, "😀" * MAX_MESSAGE_CHARS):  # 2 and 4 bytes of UTF-8 each
            ask = c.post("/jobs/c1/send", data={"csrf": token, "text": text})
            assert ask.status_code == 200 and "Continue c1" in ask.text
        longer = c.post("/jobs/c1/send", data={"csrf": token, "text": "é" * (MAX_MESSAGE_CHARS + 1)})
        assert longer.status_code == 400 and f"at most {MAX_MESSAGE_CHARS} characters" in longer.text
        huge = c.post("/jobs/c1/send", data={"csrf": token, "text": "x" * (MAX_FORM_BYTES + 1)})
        assert huge.status_code == 413


def _send_form(c: TestClient) -> dict[str, str]:
    ask = c.post("/jobs/c1/send", data={"csrf": csrf_of(c.get("/jobs/c1").text), "text": "and more"})
    once = re.search(r'name="once" value="([^"]+)"', ask.text)
    assert once is not None
    return {"csrf": csrf_of(ask.text), "text": "and more", "confirmed": "yes", "once": once.group(1)}


def test_a_refused_send_leaves_its_forms_token_unspent_so_the_same_form_sends_later(
        app: App, monkeypatch: Any) -> None:
    # The token was spent before the send: refused (a run in progress, a failed job), the same form posted
    # again said "sent" and sent nothing.
    from pipelines.errors import JobConflictError

    _chat(app)
    real, refusals = app.send, ["the run is in progress"]

    def send(job_id: str, messages: list[Any]) -> Any:
        if refusals:
            raise JobConflictError(refusals.pop())
        return real(job_id, messages)

    monkeypatch.setattr(app, "send", send)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        form = _send_form(c)
        refused = c.post("/jobs/c1/send", data=form, follow_redirects=False)
        assert refused.status_code == 409 and "the run is in progress" in refused.text
        sent = c.post("/jobs/c1/send", data=form, follow_redirects=False)
        assert sent.status_code == 303 and sent.headers["location"] == "/jobs/c1/done?did=continued"
    app.drain()
    assert [m["content"] for m in app.messages("c1") if m["role"] == "user"] == ["hello", "and more"]


def test_a_second_post_of_a_form_while_the_first_is_sending_waits_for_it_and_sends_nothing(
        app: App, monkeypatch: Any) -> None:
    import threading

    _chat(app)
    real, entered, go, calls = app.send, threading.Event(), threading.Event(), []

    def slow_send(job_id: str, messages: list[Any]) -> Any:
        calls.append(messages)
        entered.set()
        go.wait(10)
        return real(job_id, messages)

    monkeypatch.setattr(app, "send", slow_send)
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        form = _send_form(c)
        results: list[Any] = []
        first = threading.Thread(target=lambda: results.append(c.post("/jobs/c1/send", data=form,
                                                                       follow_redirects=False)))
        first.start()
        assert entered.wait(10)
        second = threading.Thread(target=lambda: results.append(c.post("/jobs/c1/send", data=form,
                                                                        follow_redirects=False)))
        second.start()
        second.join(0.3)
        assert second.is_alive()  # waiting for the first post's outcome, not answering "sent" before it
        go.set()
        first.join(10)
        second.join(10)
    assert [r.status_code for r in results] == [303, 303] and len(calls) == 1
