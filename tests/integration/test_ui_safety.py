"""The web page's safety, round 2 (issue 35): invisible characters shown, sessions revocable, no token in argv."""

from __future__ import annotations

import io
import json
import re
import warnings
from pathlib import Path

import pytest

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, tool
from pipelines.cli import main
from pipelines.engine.models import JobStatus
from pipelines.testing import ScriptedModel, reply
from pipelines.web.guesses import GUESS_BURST, GUESS_REFILL_SECONDS, Guesses
from pipelines.web.text import hidden_chars, visible
from pipelines.web.ui import ui_app
from tests.integration.test_ui import LOCAL, csrf_of

# "pay alice 5" that a bidi override makes read as something else, and a zero-width joiner inside a name.
SNEAKY = "alice\u202e5 :tnuoma\u202c\u200d\u2066x\u2069\ufeff\u2028"


@tool(needs_approval=True)
def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


def _model(msgs: list[dict[str, object]]) -> dict[str, object]:
    if msgs[-1].get("role") == "user":
        return reply(None, {"id": "call\u200bA\u202e", "type": "function",
                            "function": {"name": "pay", "arguments": json.dumps({"to": SNEAKY})}})
    return reply("done")


@pytest.fixture
def app() -> App:
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
               agents=[Agent(name="desk", model=ScriptedModel(_model), tools=[pay])])


def test_visible_marks_every_invisible_or_reordering_character() -> None:
    assert hidden_chars(SNEAKY) == ["U+202E", "U+202C", "U+200D", "U+2066", "U+2069", "U+FEFF", "U+2028"]
    shown = str(visible("<b>\u202e</b>\n\tok"))
    assert shown == ('&lt;b&gt;<span class="invisible" title="an invisible character">&lt;U+202E&gt;</span>'
                     '&lt;/b&gt;\n\tok')
    assert str(visible("plain é 漢字 👍")) == "plain é 漢字 👍"


def test_approval_arguments_and_call_ids_show_hidden_characters(app: App) -> None:
    app.run_agent("desk", job_id="j1", user="pay alice")
    app.drain()
    assert app.get("j1").status is JobStatus.WAITING  # type: ignore[union-attr]
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/j1").text
    approval = page[page.index('id="approvals"'):page.index('id="transcript"')]
    for name in ("U+202E", "U+202C", "U+200D", "U+2066", "U+2069", "U+FEFF", "U+2028"):
        assert f"&lt;{name}&gt;" in approval, name
    shown = re.sub(r'="[^"]*"', "", approval)  # attribute values (the form's call id) keep the id as it is
    for raw in ("\u202e", "\u202c", "\u200d", "\u2066", "\u2069", "\ufeff", "\u2028"):
        assert raw not in shown
    assert "call&lt;U+200B&gt;" in approval.replace('<span class="invisible" title="an invisible character">', "")
    transcript = page[page.index('id="transcript"'):]
    assert "&lt;U+202E&gt;" in transcript  # the call's id and arguments in the conversation too


def test_the_reply_beside_an_approval_and_a_jobs_error_show_hidden_characters() -> None:
    # The assistant's text waiting beside the Approve button is read with the call: "I will pay \u202eecila"
    # displayed reversed; a job's error line carried raw control characters too.
    def model(msgs: list[dict[str, object]]) -> dict[str, object]:
        return reply("I will pay \u202eecila\u202c now", {"id": "c1", "type": "function",
                                                        "function": {"name": "pay", "arguments": '{"to": "x"}'}})

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
              agents=[Agent(name="desk", model=ScriptedModel(model), tools=[pay])])
    app.run_agent("desk", job_id="j1", user="pay alice")
    app.drain()
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        page = c.get("/jobs/j1").text
    reply_text = page[page.index('id="pending-reply"'):]
    reply_text = reply_text[:reply_text.index("</div>", reply_text.index('class="text"'))]
    assert "\u202e" not in reply_text and "&lt;U+202E&gt;" in reply_text
    failing = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
                  agents=[Agent(name="desk", model=ScriptedModel(_boom), tools=[pay])])
    failing.run_agent("desk", job_id="e1", user="hi")
    failing.drain()
    assert failing.get("e1").status is JobStatus.ERROR  # type: ignore[union-attr]
    with TestClient(ui_app(failing), base_url=LOCAL) as c:
        page = c.get("/jobs/e1").text
    error = page[page.index('id="job-error"'):]
    error = error[:error.index("</pre>")]
    assert "\u202e" not in error and "\x1b" not in error and "&lt;U+202E&gt;" in error
    # The jobs list's row carries the error as the title of its "!" (an attribute: no markup), and tags likewise.
    failing.run_agent("desk", job_id="t1", user="hi", tags=["to\u202eme"])
    failing.drain()
    with TestClient(ui_app(failing), base_url=LOCAL) as c:
        listing = c.get("/").text
    row = listing[listing.index('class="err"'):]
    row = row[:row.index("</span>")]
    assert "\u202e" not in row and "\x1b" not in row and "&lt;U+202E&gt;" in row
    with TestClient(ui_app(failing), base_url=LOCAL) as c:
        job_page = c.get("/jobs/t1").text
    for page in (listing, job_page):
        tag = page[page.index('class="tag" title="'):]
        tag = tag[:tag.index("</span> ")]
        assert "\u202e" not in tag and 'title="to&lt;U+202E&gt;me"' in tag and "&lt;U+202E&gt;</span>me" in tag


def _boom(msgs: list[dict[str, object]]) -> dict[str, object]:
    raise ValueError("bad \u202eeulav\u202c \x1b[2J")


def test_logout_ends_the_session_on_the_server(app: App) -> None:
    with TestClient(ui_app(app, token="correct-horse"), base_url=LOCAL) as c:
        ok = c.post("/login", data={"csrf": csrf_of(c.get("/login").text), "token": "correct-horse"},
                    follow_redirects=False)
        assert ok.status_code == 303
        copied = c.cookies.get("pipelines_ui")
        assert copied and c.get("/").status_code == 200
        page = c.get("/").text
        c.post("/logout", data={"csrf": csrf_of(page)}, follow_redirects=False)
    with TestClient(ui_app(app, token="correct-horse"), base_url=LOCAL) as fresh:
        assert fresh.get("/").status_code == 401  # another server: no session at all
    # The same server, the cookie copied before the logout: refused.
    asgi = ui_app(app, token="correct-horse")
    with TestClient(asgi, base_url=LOCAL) as c:
        login = c.post("/login", data={"csrf": csrf_of(c.get("/login").text), "token": "correct-horse"},
                       follow_redirects=False)
        assert login.status_code == 303
        copied = c.cookies.get("pipelines_ui")
        c.post("/logout", data={"csrf": csrf_of(c.get("/").text)})
    with TestClient(asgi, base_url=LOCAL, cookies={"pipelines_ui": copied}) as thief:
        assert thief.get("/").status_code == 401
        assert thief.get("/jobs/x/stream").status_code == 401


def test_a_session_cookie_is_random_not_derived_from_the_token(app: App) -> None:
    asgi = ui_app(app, token="correct-horse")
    ids = set()
    for _ in range(2):
        with TestClient(asgi, base_url=LOCAL) as c:
            c.post("/login", data={"csrf": csrf_of(c.get("/login").text), "token": "correct-horse"})
            ids.add(c.cookies.get("pipelines_ui"))
    assert len(ids) == 2


@pytest.mark.parametrize("command", ["ui", "dev"])
def test_the_token_is_never_taken_from_the_command_line(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINES_UI_TOKEN", raising=False)
    err = io.StringIO()
    code = main([command, "--app", "tests.apps.approval_app:app", "--host", "0.0.0.0", "--token", "s3cret-value"],
                out=io.StringIO(), err=err)
    assert code == 1 and "PIPELINES_UI_TOKEN" in err.getvalue() and "--token-file" in err.getvalue()
    assert "s3cret-value" not in err.getvalue()


def test_token_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.cli.dev import ui_token
    from pipelines.engine.errors import ConfigurationError

    class Args:
        token: str | None = None
        token_file: str | None = None

    args = Args()
    monkeypatch.setenv("PIPELINES_UI_TOKEN", "from-the-env")
    assert ui_token(args) == "from-the-env"  # type: ignore[arg-type]
    secret = tmp_path / "token"
    secret.write_text("from-a-file\n")
    args.token_file = str(secret)
    assert ui_token(args) == "from-a-file"  # type: ignore[arg-type]
    secret.write_text("  \n")
    with pytest.raises(ConfigurationError, match="empty"):
        ui_token(args)  # type: ignore[arg-type]
    args.token_file = str(tmp_path / "missing")
    with pytest.raises(ConfigurationError, match="cannot read"):
        ui_token(args)  # type: ignore[arg-type]


def test_wrong_tokens_from_one_address_are_slowed_to_a_few_a_minute(app: App) -> None:
    asgi = ui_app(app, token="correct-horse")
    with TestClient(asgi, base_url=LOCAL) as c:
        form = csrf_of(c.get("/login").text)
        codes = [c.post("/login", data={"csrf": form, "token": f"guess-{i}"}).status_code for i in range(GUESS_BURST)]
        assert codes == [401] * GUESS_BURST  # a person's typos pass
        refused = c.post("/login", data={"csrf": form, "token": "correct-horse"}, follow_redirects=False)
        # Spent: even the right token is not looked at, so a guesser cannot tell it was right.
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "pipelines_ui" not in c.cookies
        # Bearer guesses count against the same budget, and are refused the same way.
        assert c.get("/", headers={"authorization": "Bearer correct-horse"}).status_code == 429
    with TestClient(asgi, base_url=LOCAL, client=("10.0.0.9", 50000)) as other:  # another address: its own budget
        ok = other.post("/login", data={"csrf": csrf_of(other.get("/login").text), "token": "correct-horse"},
                        follow_redirects=False)
        assert ok.status_code == 303


def test_a_spent_budget_of_wrong_tokens_comes_back_with_time() -> None:
    now = [0.0]
    guesses = Guesses(clock=lambda: now[0])
    for _ in range(GUESS_BURST):
        assert guesses.wait("a") == 0
        guesses.wrong("a")
    assert guesses.wait("a") == GUESS_REFILL_SECONDS and guesses.wait("b") == 0
    now[0] += GUESS_REFILL_SECONDS
    assert guesses.wait("a") == 0  # one wrong token came back
    guesses.wrong("a")
    assert guesses.wait("a") > 0


def test_a_wrong_bearer_token_counts_as_a_guess(app: App) -> None:
    with TestClient(ui_app(app, token="correct-horse"), base_url=LOCAL) as c:
        codes = [c.get("/", headers={"authorization": f"Bearer guess-{i}"}).status_code for i in range(GUESS_BURST)]
        assert codes == [401] * GUESS_BURST
        assert c.get("/", headers={"authorization": "Bearer correct-horse"}).status_code == 429
