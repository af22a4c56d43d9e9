"""The web page's round-2 features (issue 35) in headless Debian chromium, against an in-process App.

The App is a real one (memory storage, the memory scheduler drained by the
test) served by a real uvicorn on 127.0.0.1; the browser is chromium driven by
selenium + chromedriver. What is checked is what a person sees and does.
"""

from __future__ import annotations

import contextlib
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage
from pipelines import Agent, App, tool
from pipelines.testing import ScriptedModel, reply

webdriver = pytest.importorskip("selenium.webdriver")
uvicorn = pytest.importorskip("uvicorn")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

from pipelines.web.ui import ui_app  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="Debian's chromium and chromium-driver are missing (.ci/run installs them)")
SNEAKY = "alice\u202e5 :tnuoma\u202c"


@tool(needs_approval=True)
def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


@tool
def lookup(order: int) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def _model(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    last = msgs[-1]
    text = str(last.get("content") or "")
    if last.get("role") == "user" and "pay" in text:
        return reply("I will pay now.", {"id": "call_pay", "type": "function",
                                          "function": {"name": "pay", "arguments": json.dumps({"to": SNEAKY})}})
    turns = sum(1 for m in msgs if m.get("role") == "assistant")
    if last.get("role") != "assistant" and turns < 3 and "look" in str(msgs[1].get("content") or ""):
        return reply(f"looking ({turns})", {"id": f"call_{turns}", "type": "function",
                                            "function": {"name": "lookup", "arguments": json.dumps({"order": turns})}})
    return reply(f"you said: {text}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def app() -> App:
    return App(storage=MemoryStorage(), scheduler=MemoryScheduler(), provenance=False,
               agents=[Agent(name="desk", model=ScriptedModel(_model), tools=[pay, lookup])])


@pytest.fixture
def base(app: App) -> Iterator[str]:
    with _served(app) as url:
        yield url


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="pr-chromium-") as profile:
        options = Options()
        options.binary_location = CHROMIUM
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    f"--user-data-dir={profile}", "--window-size=1280,1000"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.implicitly_wait(0)
        try:
            yield driver
        finally:
            driver.quit()


def text_of(driver: WebDriver, css: str) -> str:
    text = driver.execute_script("var e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)
    return str(text or "").strip()


def test_a_reply_waiting_for_approval_is_labelled_so_and_shows_hidden_characters(
        app: App, base: str, browser: WebDriver) -> None:
    app.run_agent("desk", job_id="pay-1", user="pay alice")
    app.drain()
    browser.get(f"{base}/jobs/pay-1")
    assert text_of(browser, "#pending-reply .who").lower() == "assistant (waiting for approval)"
    assert "I will pay now." in text_of(browser, "#pending-reply")
    assert not browser.find_element(By.ID, "typing").is_displayed()
    shown = text_of(browser, "#approvals .arguments")
    assert "<U+202E>" in shown and "<U+202C>" in shown and "\u202e" not in shown
    assert text_of(browser, "#approvals .call-id") == "call_pay"  # the call id as it is


def test_the_timeline_shows_each_turn_with_its_spans_attempts_and_opens_the_turn(browser: WebDriver) -> None:
    import os

    from adapters.memory import VirtualClock
    from pipelines.engine.errors import TransientModelError

    clock = VirtualClock(1_800_000_000)
    failed: list[int] = []

    @tool
    def search(order: int) -> str:
        """Search orders."""
        clock.advance(0.5 + order)  # the tool's time, on the scheduler's clock
        return f"order {order}"

    def model(msgs: list[dict[str, Any]]) -> dict[str, Any]:
        clock.advance(2.0)  # the model's time
        n = sum(1 for m in msgs if m.get("role") == "assistant")
        if n == 1 and not failed:
            failed.append(1)
            raise TransientModelError("rate limited (429)", retry_after=3.0)
        if n < 2:
            return reply(f"step {n}", {"id": f"call_{n}", "type": "function",
                                       "function": {"name": "search", "arguments": json.dumps({"order": n})}})
        return reply("all done")

    app = App(storage=MemoryStorage(), scheduler=MemoryScheduler(clock=clock), provenance=False,
              agents=[Agent(name="desk", model=ScriptedModel(model), tools=[search])])
    app.run_agent("desk", job_id="long-1", user="find my orders")
    app.drain()
    with _served(app) as url:
        browser.get(f"{url}/jobs/long-1")
        rows = browser.find_elements(By.CSS_SELECTOR, "#timeline tr.turn")
        assert [r.get_attribute("data-turn") for r in rows] == ["1", "2", "3"]
        first = text_of(browser, "#turn-1")
        assert "2.00s" in first and "search 0.50s" in first  # model 2s, then the tool
        second = text_of(browser, "#turn-2")
        assert "attempt 2 (1 retried)" in second and "search 1.50s" in second
        bars = browser.execute_script(
            "return Array.from(document.querySelectorAll('#turn-2 rect')).map(r => r.textContent);")
        assert bars == ["attempt failed, retried: model: rate limited (429): 3.00s", "model: 2.00s", "search: 1.50s"]
        browser.set_window_size(1280, 700)
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            from tests.system.conftest import ROOT

            browser.execute_script("document.getElementById('timeline').scrollIntoView();")
            browser.save_screenshot(str(ROOT / "docs" / "images" / "ui-timeline.png"))
        browser.find_element(By.CSS_SELECTOR, "#turn-2 a.open-turn").click()
        assert browser.execute_script("return location.hash;") == "#m-3"
        assert "step 1" in text_of(browser, "#m-3")  # the turn's first message, highlighted as the target
        assert text_of(browser, "#m-2 .call-id") == "call_0"  # a call id as it is, not upper-cased with its label
        assert browser.execute_script("return document.querySelector(':target').id;") == "m-3"
        # The turn's model call: what was sent in short, what came back, and the attempt retried before.
        browser.find_element(By.CSS_SELECTOR, "#turn-2 a.open-call").click()
        deadline = time.monotonic() + 10  # a link's click returns before the page it opens has loaded
        while not text_of(browser, "#call-request h2") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "The model call of turn 2" in text_of(browser, "#call-request h2")
        assert text_of(browser, "#call-tools") == "search" and text_of(browser, "#call-messages").startswith("3 ")
        assert "step 1" in text_of(browser, "#call-reply") and "rate limited (429)" in text_of(browser, "#call-retries")
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            from tests.system.conftest import ROOT

            browser.save_screenshot(str(ROOT / "docs" / "images" / "ui-model-call.png"))


def test_an_attempt_fenced_off_after_its_model_answered_shows_what_it_was_told(browser: WebDriver) -> None:
    from tests.integration.test_dropped_usage import StolenOnce
    from tests.unit.helpers import memory

    storage, scheduler, clock = memory()

    def steal(job_id: str) -> None:  # the first worker's lease runs out and another worker takes the job
        clock.advance(61)
        assert storage.acquire_lease(job_id, "thief", 60) is not None
        storage.release_lease(job_id, "thief")

    app = App(storage=storage, scheduler=scheduler, provenance=False,
              agents=[Agent(name="a", model=StolenOnce(steal), stream=False)])
    app.run_agent("a", job_id="fenced-1", messages=["hi"])
    app.drain()
    app.advance_due()
    app.drain()
    with _served(app) as url:
        browser.get(f"{url}/jobs/fenced-1/turns/1")
        kept = text_of(browser, "#fenced-1")
        assert "attempt 1" in kept and "what the fenced-off attempt was told" in kept and "chatcmpl-first" in kept
        assert "100 prompt + 10 completion tokens" in kept and "$0.500000" in kept
        assert browser.find_element(By.CSS_SELECTOR, "#fenced-1").is_displayed()
        assert "done" in text_of(browser, "#call-reply")  # the committed answer stays the turn's


@contextlib.contextmanager
def _served(app: App) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(ui_app(app), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
