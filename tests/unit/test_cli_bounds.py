"""Issue 30: the command line bounds every number it is given and never sends model text's escapes to a terminal."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import uvicorn

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App
from pipelines.cli import main
from pipelines.cli.args import printable
from pipelines.engine.phase import Fail, Phase, PhaseContext
from pipelines.testing import ScriptedModel

ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[1A\r\x9b31m"  # retitle, clear, cursor up, CR, an 8-bit CSI
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[1A\\x0d\\x9b31m"
SELF = "tests.unit.test_cli_bounds:current"
_app: App | None = None


def current() -> App:
    assert _app is not None
    return _app


def failing(ctx: PhaseContext[Any]) -> Fail:
    ctx.log(f"the model said {ESC}")
    return Fail(f"upstream said {ESC}")


@pytest.fixture(autouse=True)
def app(monkeypatch: pytest.MonkeyPatch) -> App:
    global _app
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    model = ScriptedModel(lambda msgs: f"{ESC}hello\tthere\nsecond line")
    _app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(), agents=[Agent(name="talk", model=model)],
               pipelines={"bad": [Phase("a", failing)]})
    return _app


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("argv", "named"), [
    (["jobs", "--limit", "-5"], "argument --limit: a count must be between 1 and 1000000, got -5"),
    (["jobs", "--limit", "0"], "argument --limit: a count must be between 1 and 1000000, got 0"),
    (["jobs", "--limit", "10000001"], "argument --limit: a count must be between 1 and 1000000"),
    (["jobs", "--limit", "many"], "argument --limit: not a whole number: 'many'"),
    (["advance", "--due", "--limit", "-5"], "argument --limit: a count must be between 1"),
    (["gc", "--limit", "-1"], "argument --limit: a count must be between 1"),
    (["ui", "--port", "70000"], "argument --port: a TCP port must be between 1 and 65535, got 70000"),
    (["ui", "--port", "-1"], "argument --port: a TCP port must be between 1 and 65535, got -1"),
    (["ui", "--port", "0"], "argument --port: a TCP port must be between 1 and 65535, got 0"),
    (["worker", "--background-every", "-1"], "argument --background-every: a number must be between 0"),
    (["worker", "--alive-ttl", "0.5"], "argument --alive-ttl: must be seconds in [1, 3600], got '0.5'"),
    (["worker", "--alive-ttl", "3601"], "argument --alive-ttl: must be seconds in [1, 3600], got '3601'"),
    (["worker", "--alive-ttl", "0"], "argument --alive-ttl: must be > 0, got '0'"),
    (["worker", "--alive-ttl", "nan"], "argument --alive-ttl: must be a finite number >= 0, got 'nan'"),
])
def test_a_number_out_of_bounds_is_a_clear_usage_error_before_anything_runs(
        argv: list[str], named: str, app: App, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_server(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the web page was served")

    monkeypatch.setattr(uvicorn, "run", no_server)
    app.run_pipeline("bad", job_id="b")
    with pytest.raises(SystemExit) as exited:
        run(*argv, "--app", SELF)
    assert exited.value.code == 2 and named in capsys.readouterr().err
    assert app.get("b").status.value == "running"  # type: ignore[union-attr]  # nothing advanced


def test_the_bounds_themselves_are_accepted(app: App) -> None:
    assert run("jobs", "--limit", "1", "--app", SELF)[0] == 0
    assert run("jobs", "--limit", "1000000", "--app", SELF)[0] == 0


def test_printable_escapes_control_characters_but_newline_and_tab() -> None:
    assert printable(f"a{ESC}b\tc\nd\x00\x7f") == f"a{SHOWN}b\tc\nd\\x00\\x7f"
    assert printable("plain ünïcödé ✓") == "plain ünïcödé ✓"


def test_transcript_and_status_json_escape_c1_and_bidi_controls_and_stay_the_same_json(app: App) -> None:
    # JSON leaves U+009B (an 8-bit CSI) and bidi overrides raw: transcript's default output and status --json
    # sent them to the terminal.
    text = "pay \u202ebob\u202c \x9b31m ünï"
    app.run_agent("talk", job_id="tj", messages=[text])
    app.run_pipeline("bad", job_id="bj")
    code, out, _ = run("transcript", "tj", "--app", SELF)
    assert code == 0 and not any(c in out for c in "\u202e\u202c\x9b") and "ünï" in out
    assert json.loads(out.splitlines()[0])["content"] == text  # the same value, escaped
    code, out, _ = run("status", "bj", "--json", "--app", SELF)
    assert code == 0 and "\x9b" not in out and json.loads(out)["job_id"] == "bj"


def test_printable_escapes_bidi_controls_but_keeps_joiners() -> None:
    # An override makes "pay bob 5" read otherwise on a terminal that reorders text; a joiner builds an emoji.
    assert printable("to \u202ebob\u202c and \u2067x\u2069 \u200f\u061c") == \
        "to \\u202ebob\\u202c and \\u2067x\\u2069 \\u200f\\u061c"
    assert printable("family \U0001f468\u200d\U0001f469") == "family \U0001f468\u200d\U0001f469"


def test_transcript_pretty_status_and_log_show_escapes_instead_of_sending_them(app: App) -> None:
    app.run_agent("talk", job_id="t", messages=[f"hi {ESC}"])
    app.run_pipeline("bad", job_id="b")
    app.drain()
    code, out, _ = run("transcript", "t", "--pretty", "--app", SELF)
    assert code == 0 and "\x1b" not in out and "\r" not in out and "\x9b" not in out
    assert out.splitlines() == [f"[0] user: hi {SHOWN}", f"[1] assistant: {SHOWN}hello\tthere", "second line"]
    for argv in (["status", "b"], ["log", "b"]):
        code, out, _ = run(*argv, "--app", SELF)
        assert code == 0 and "\x1b" not in out and SHOWN in out, argv


@pytest.mark.parametrize("follow", [False, True], ids=["wait", "follow"])
def test_agent_run_prints_the_models_escapes_as_text(app: App, follow: bool) -> None:
    code, out, _ = run("agent", "run", "talk", "--input", "hi", "--job", "r", "--app", SELF,
                       *(["--follow"] if follow else []))
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert f"{SHOWN}hello\tthere\nsecond line" in out


def test_a_command_missing_an_optional_dependency_says_which_extra_installs_it(
        app: App, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # `pipelines dev` without starlette ended in a traceback from inside the command.
    import sys

    for name in [m for m in sys.modules if m == "starlette" or m.startswith(("starlette.", "pipelines.web"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)  # what `import starlette` finds when it is not installed
    code, _, err = run("dev", "--db", str(tmp_path / "dev.db"), "--app", SELF)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "needs 'starlette', which phaserunner's 'web' extra installs: pip install 'phaserunner[web]'" in err
