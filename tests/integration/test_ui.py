"""The web page over HTTP (Starlette's TestClient): pages, filters, actions, and the safety rules of issue 12."""

from __future__ import annotations

import html
import io
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, Done, Phase, PhaseContext, tool
from pipelines.cli import main
from pipelines.engine.errors import ConfigurationError, InvalidInputError
from pipelines.engine.models import JobStatus
from pipelines.testing import ScriptedModel, call, reply
from pipelines.web.ui import CSP, PAGE_SIZE, check_bind, ui_app

LOCAL = "http://127.0.0.1"
HOSTILE = ('<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
           '[click](javascript:alert(1)) <a href="javascript:alert(2)">x</a>')

flaky_runs: list[int] = []


@tool(needs_approval=True)
def refund(amount: int) -> str:
    """Refund an amount."""
    return f"refunded {amount}"


def _flaky(ctx: PhaseContext[Any]) -> Done:
    flaky_runs.append(1)
    if len(flaky_runs) == 1:
        raise RuntimeError("the first run fails")
    return Done(result={"ok": True})


def _model(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    text = str(msgs[-1].get("content") or "")
    if msgs[-1].get("role") == "user" and "refund" in text:
        return reply(None, {**call("refund", amount=7), "id": "r1"})
    return reply(f"you said: {text}")


@pytest.fixture
def app() -> App:
    flaky_runs.clear()
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
               agents=[Agent(name="desk", model=ScriptedModel(_model), tools=[refund])],
               pipelines={"flaky": [Phase("only", _flaky)]})


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        yield c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


def waiting_job(app: App, job_id: str = "w1") -> str:
    app.run_agent("desk", job_id=job_id, user="please refund me")
    app.drain()
    view = app.get(job_id)
    assert view is not None and view.status is JobStatus.WAITING
    return job_id


# --- reading ----------------------------------------------------------------------------------
def test_jobs_page_lists_counts_filters_and_searches(app: App, client: TestClient) -> None:
    waiting_job(app, "w1")
    app.run_agent("desk", job_id="done-1", user="hello")
    app.run_pipeline("flaky", job_id="bad-1")
    app.drain()
    page = client.get("/")
    assert page.status_code == 200
    for job_id in ("w1", "done-1", "bad-1"):
        assert f'href="/jobs/{job_id}"' in page.text
    assert "complete <b>1</b>" in page.text and "error <b>1</b>" in page.text and "waiting <b>1</b>" in page.text
    only_errors = client.get("/", params={"status": "error"}).text
    assert 'href="/jobs/bad-1"' in only_errors and 'href="/jobs/w1"' not in only_errors
    only_desk = client.get("/", params={"name": "desk"}).text
    assert 'href="/jobs/w1"' in only_desk and 'href="/jobs/bad-1"' not in only_desk
    found = client.get("/", params={"q": "done-1"}).text
    assert 'href="/jobs/done-1"' in found and 'href="/jobs/w1"' not in found
    assert "no jobs match" in client.get("/", params={"q": "nobody"}).text


def test_jobs_are_paged_on_the_server(app: App, client: TestClient) -> None:
    for n in range(PAGE_SIZE * 2 + 5):
        app.run_pipeline("flaky", job_id=f"job-{n:03d}")
    first = client.get("/").text
    assert first.count('<tr class="st-') == PAGE_SIZE
    assert 'id="next"' in first and 'id="prev"' not in first
    last = client.get("/", params={"page": 3}).text
    assert last.count('<tr class="st-') == 5
    assert 'id="next"' not in last and 'id="prev"' in last
    # Newest first (ties of the virtual clock by id, descending): the last page holds the oldest.
    assert 'href="/jobs/job-000"' in last and 'href="/jobs/job-104"' not in last
    # The table's live refresh: the rows shown, by id, in the order shown (no counts).
    rows = client.get("/", params={"partial": 1, "ids": "job-004,job-000,job-002"}).text
    assert rows.startswith('<tbody id="job-rows"') and "counts" not in rows
    assert re.findall(r'data-job="([^"]+)"', rows) == ["job-004", "job-000", "job-002"]


def test_next_link_pages_by_cursor_and_a_moved_job_does_not_shift_the_pages(app: App, client: TestClient) -> None:
    for n in range(PAGE_SIZE * 2 + 5):
        app.run_pipeline("flaky", job_id=f"job-{n:03d}")
    first = client.get("/").text
    link = re.search(r'href="\?([^"]*)" id="next"', first)
    assert link is not None and "before=" in link.group(1)
    shown = set(re.findall(r'href="/jobs/(job-\d+)"', first))
    app.storage.delete_job("job-104")  # the newest goes away: an offset page would shift by one
    second = client.get("/?" + html.unescape(link.group(1))).text
    ids = re.findall(r'href="/jobs/(job-\d+)"', second)
    assert len(ids) == PAGE_SIZE and not shown & set(ids)
    assert ids[0] == "job-054" and ids[-1] == "job-005"
    assert client.get("/", params={"before": "yesterday"}).status_code == 400


def test_job_page_shows_conversation_approval_ledger_log_events_and_state(app: App, client: TestClient) -> None:
    waiting_job(app)
    html = client.get("/jobs/w1").text
    assert "waiting for approval" in html
    assert 'action="/jobs/w1/approve"' in html and 'name="call_id" value="r1"' in html
    assert "please refund me" in html  # the user's message
    assert "<b>refund</b>" in html and "&#34;amount&#34;: 7" in html  # the pending call and its arguments
    assert 'class="ledger-intended">intended' in html
    assert "approval needed for refund (r1)" in html  # the log
    assert "<b>approval_requested</b>" in html  # the event timeline
    assert 'id="state"' in html and "&#34;turn&#34;: 0" in html
    assert client.get("/jobs/w1/live").text.startswith('<div id="job-top"><div id="job-status" data-status="waiting"')


def test_stream_endpoint_serves_the_jobs_parts(app: App, client: TestClient) -> None:
    app.run_agent("desk", job_id="s1", user="hello")
    app.drain()
    with client.stream("GET", "/jobs/s1/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = "".join(response.iter_text())
    assert '"type":"job_finished"' in body.replace(" ", "")


# --- acting ---------------------------------------------------------------------------------------
def test_approve_with_csrf_runs_the_call_and_the_job_completes(app: App, client: TestClient) -> None:
    waiting_job(app)
    token = csrf_of(client.get("/jobs/w1").text)
    done = client.post("/jobs/w1/approve", data={"csrf": token, "call_id": "r1"}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/jobs/w1"
    app.drain()
    view = app.get("w1")
    assert view is not None and view.status is JobStatus.COMPLETE
    assert "refunded 7" in client.get("/jobs/w1").text


def test_the_approve_form_carries_what_it_showed_and_a_stale_one_is_refused(app: App, client: TestClient) -> None:
    import re

    waiting_job(app)
    page = client.get("/jobs/w1").text
    (digest,) = set(re.findall(r'name="digest" value="([0-9a-f]{64})"', page))  # approve and reject forms
    assert digest == app.get("w1").pending_calls[0]["digest"]  # type: ignore[union-attr]
    stale = client.post("/jobs/w1/approve", data={"csrf": csrf_of(page), "call_id": "r1", "digest": "0" * 64})
    assert stale.status_code == 409 and "asks something other than what was shown" in stale.text
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]
    done = client.post("/jobs/w1/approve", data={"csrf": csrf_of(page), "call_id": "r1", "digest": digest},
                       follow_redirects=False)
    assert done.status_code == 303


def test_reject_needs_a_reason_and_the_model_reads_it(app: App, client: TestClient) -> None:
    waiting_job(app)
    token = csrf_of(client.get("/jobs/w1").text)
    empty = client.post("/jobs/w1/reject", data={"csrf": token, "call_id": "r1", "reason": " "})
    assert empty.status_code == 400 and "non-empty reason" in empty.text
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]
    client.post("/jobs/w1/reject", data={"csrf": token, "call_id": "r1", "reason": "not today"})
    app.drain()
    assert any("not today" in str(m.get("content")) for m in app.messages("w1") if m["role"] == "tool")


def test_retry_resume_and_full_from_the_page(app: App, client: TestClient) -> None:
    app.run_pipeline("flaky", job_id="bad-1")
    app.drain()
    html = client.get("/jobs/bad-1").text
    assert "the first run fails" in html and 'id="retry-resume"' in html
    assert 'data-confirm="Retry from the start?' in html
    client.post("/jobs/bad-1/retry", data={"csrf": csrf_of(html), "mode": "resume"})
    app.drain()
    assert app.get("bad-1").status is JobStatus.COMPLETE  # type: ignore[union-attr]
    bad_mode = client.post("/jobs/bad-1/retry", data={"csrf": csrf_of(html), "mode": "sideways"})
    assert bad_mode.status_code == 400 and "sideways" in bad_mode.text


def test_pause_resume_and_cancel(app: App, client: TestClient) -> None:
    app.run_agent("desk", job_id="r1", user="hello")  # queued, not drained: running
    token = csrf_of(client.get("/jobs/r1").text)
    assert 'id="pause"' in client.get("/jobs/r1").text
    client.post("/jobs/r1/pause", data={"csrf": token})
    assert app.get("r1").status is JobStatus.PAUSED  # type: ignore[union-attr]
    client.post("/jobs/r1/resume", data={"csrf": token})
    assert app.get("r1").status is JobStatus.RUNNING  # type: ignore[union-attr]
    assert 'data-confirm="Cancel this job?"' in client.get("/jobs/r1").text
    client.post("/jobs/r1/cancel", data={"csrf": token})
    assert app.get("r1").status is JobStatus.CANCELLED  # type: ignore[union-attr]


def test_bad_input_gets_a_clear_error(app: App, client: TestClient) -> None:
    waiting_job(app)
    token = csrf_of(client.get("/jobs/w1").text)
    cases = [(client.get("/", params={"page": "two"}), 400, "page must be a whole number"),
             (client.get("/", params={"status": "sleeping"}), 400, "unknown status &#39;sleeping&#39;"),
             (client.get("/", params={"q": "x" * 201}), 400, "at most 200 characters"),
             (client.get("/", params={"since": "yesterday"}), 400, "since must be a date and time"),
             (client.get("/jobs/nope"), 404, "job &#39;nope&#39; not found"),
             (client.post("/jobs/w1/explode", data={"csrf": token}), 400, "unknown action &#39;explode&#39;"),
             (client.post("/jobs/w1/approve", data={"csrf": token, "call_id": "zz"}), 400, "call &#39;zz&#39;"),
             (client.post("/jobs/w1/fork", data={"csrf": token, "at_turn": "\u00b2"}), 400, "at_turn must be a whole"),
             (client.post("/jobs/w1/fork", data={"csrf": token, "at_turn": "0", "max_turns": "\u00b9"}), 400,
              "max_turns must be a whole number"),
             (client.get("/jobs/w1/done", params={"did": "fork", "at": "\u00b2"}), 400, "at must be a whole")]
    for response, code, text in cases:
        assert response.status_code == code, response.text
        assert text in response.text
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]


# --- safety -------------------------------------------------------------------------------------
def test_hostile_transcript_renders_as_text(app: App, client: TestClient) -> None:
    app.run_agent("desk", job_id="evil", user=HOSTILE, tags=["<b>tag</b>"])
    app.drain()
    response = client.get("/jobs/evil")
    html = response.text
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
    assert "<img" not in html and "<script>" not in html
    assert 'href="javascript' not in html.lower()
    assert "&lt;b&gt;tag&lt;/b&gt;" in html
    # The only scripts are the page's own file; the policy forbids inline ones.
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/ui.js" defer>']
    assert response.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert "&lt;b&gt;tag&lt;/b&gt;" in client.get("/").text


def test_state_changes_need_post_and_csrf(app: App, client: TestClient) -> None:
    waiting_job(app)
    assert client.get("/jobs/w1/approve").status_code == 405
    missing = client.post("/jobs/w1/approve", data={"call_id": "r1"})
    forged = client.post("/jobs/w1/approve", data={"call_id": "r1", "csrf": "0" * 64})
    assert missing.status_code == forged.status_code == 403 and "CSRF" in missing.text
    token = csrf_of(client.get("/jobs/w1").text)
    other_site = client.post("/jobs/w1/approve", data={"call_id": "r1", "csrf": token},
                             headers={"origin": "http://evil.example"})
    assert other_site.status_code == 403
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]


def test_without_a_token_only_loopback_names_are_served(app: App) -> None:
    with TestClient(ui_app(app), base_url="http://rebound.example") as c:
        refused = c.get("/")
    assert refused.status_code == 403 and "PIPELINES_UI_TOKEN" in refused.text
    with TestClient(ui_app(app), base_url="http://localhost:8008") as c:
        assert c.get("/").status_code == 200


def test_token_login_cookie_and_bearer(app: App) -> None:
    waiting_job(app)
    with TestClient(ui_app(app, token="correct-horse"), base_url="http://ui.internal") as c:
        assert c.get("/", headers={"accept": "text/html"}, follow_redirects=False).headers["location"] == "/login"
        assert c.get("/jobs/w1").status_code == 401
        assert c.get("/jobs/w1/stream").status_code == 401
        login = c.get("/login").text
        wrong = c.post("/login", data={"csrf": csrf_of(login), "token": "wrong-horse"})
        assert wrong.status_code == 401 and "wrong token" in wrong.text
        no_csrf = c.post("/login", data={"token": "correct-horse"})
        assert no_csrf.status_code == 403
        ok = c.post("/login", data={"csrf": csrf_of(login), "token": "correct-horse"}, follow_redirects=False)
        cookie = ok.headers["set-cookie"]
        assert ok.status_code == 303 and "HttpOnly" in cookie and "SameSite=strict" in cookie
        page = c.get("/jobs/w1")
        assert page.status_code == 200
        # The login page's token does not act on jobs: the session's own does.
        stale = c.post("/jobs/w1/approve", data={"csrf": csrf_of(login), "call_id": "r1"})
        assert stale.status_code == 403
        assert c.post("/jobs/w1/approve", data={"csrf": csrf_of(page.text), "call_id": "r1"}).status_code == 200
    assert app.get("w1").status is JobStatus.RUNNING  # type: ignore[union-attr]
    with TestClient(ui_app(app, token="correct-horse"), base_url="http://ui.internal") as c:
        assert c.get("/", headers={"authorization": "Bearer correct-horse"}).status_code == 200
        assert c.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401


def test_read_only_hides_and_refuses_actions(app: App) -> None:
    waiting_job(app)
    bearer = {"authorization": "Bearer correct-horse"}
    with TestClient(ui_app(app, token="correct-horse", read_only=True), base_url=LOCAL, headers=bearer) as c:
        html = c.get("/jobs/w1").text
        assert "read-only" in html and 'action="/jobs/w1/approve"' not in html and 'id="cancel"' not in html
        token = csrf_of(html)  # the logout form's: valid, and still refused
        refused = c.post("/jobs/w1/approve", data={"csrf": token, "call_id": "r1"})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert app.get("w1").status is JobStatus.WAITING  # type: ignore[union-attr]


def test_static_files_ship_and_carry_the_policy(client: TestClient) -> None:
    js = client.get("/static/ui.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert js.headers["content-security-policy"] == CSP
    assert client.get("/static/ui.css").status_code == 200


def test_bind_rules_and_bad_arguments(app: App) -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("0.0.0.0", "a-long-token")
    with pytest.raises(ConfigurationError, match="without a token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(InvalidInputError, match="at least 8"):
        ui_app(app, token="short")
    with pytest.raises(InvalidInputError, match=r"pipelines\.App"):
        ui_app(object())  # type: ignore[arg-type]


def test_cli_says_a_port_another_process_holds_before_it_says_serving() -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out, err = io.StringIO(), io.StringIO()
        code = main(["ui", "--app", "tests.apps.approval_app:app", "--port", str(port)], out=out, err=err)
    assert code == 1 and f"cannot serve the web page on 127.0.0.1:{port}" in err.getvalue()
    assert "serving" not in out.getvalue()


def test_cli_refuses_a_public_address_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINES_UI_TOKEN", raising=False)
    err = io.StringIO()
    code = main(["ui", "--app", "tests.apps.approval_app:app", "--host", "0.0.0.0"], out=io.StringIO(), err=err)
    assert code == 1 and "without a token" in err.getvalue()
