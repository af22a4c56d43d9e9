"""The web page in a real browser: headless Debian chromium driven by selenium + chromedriver.

Against a real redis-server, a real ``pipelines worker`` process, a real
``pipelines ui`` process (with a token: the login form is part of the run) and
the loopback model server. One scenario, in the order an operator lives it:
log in, watch a reply stream in, approve a refund, see the job complete without
a reload; filter the jobs page; retry a failed job from its page; open a
hostile transcript and see that nothing ran. It saves screenshots of the jobs
page and a job page (``UPDATE_SCREENSHOTS=1``: the README's, in docs/img/).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apps.ui_app import APP_PATH, build
from tests.fake_openai import (
    FakeOpenAI,
    Reply,
    bad_request,
    call,
    streamed,
    text_reply,
    tool_reply,
)
from tests.system.conftest import ROOT, Cluster, wait_for

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "browser-test-token"
PREAMBLE = "Let me look at your order and refund it for you, one moment please."
HOSTILE = ('<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
           '[click me](javascript:window.pwned=3) <a href="javascript:window.pwned=4">link</a>')
# Screenshots are a test artifact (in the temp dir); UPDATE_SCREENSHOTS=1 writes the README's copies in docs/img/.
SHOTS = ROOT / "docs" / "img" if os.environ.get("UPDATE_SCREENSHOTS") == "1" else \
    Path(tempfile.gettempdir()) / "phaserunner-screenshots"

pytestmark = pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
                                reason="Debian's chromium and chromium-driver are missing (.ci/run installs them)")


def model(failed_once: list[bool]) -> Any:
    """Replies computed from the conversation, so concurrent jobs each get theirs."""

    def answer(body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        first = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        answered = any(m.get("role") == "tool" for m in messages)
        if "refund" in first:
            if answered:
                return streamed(text_reply("Refund done: 7 euros are on their way back to you."), chunk_delay=0.05)
            return streamed(tool_reply(call("refund", {"amount": 7}, id="call_refund"), content=PREAMBLE),
                            chunk_chars=3, chunk_delay=0.12)
        if "fail" in first and not failed_once:
            failed_once.append(True)
            return bad_request("the model refused this request")
        if "hostile" in first:
            return text_reply(HOSTILE)
        return text_reply("Happy to help.")

    return answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    # Read in one script: the page replaces its live part in place, so element handles go stale.
    text = driver.execute_script("var e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css)
    return str(text or "").strip()


def test_watch_approve_filter_retry_and_hostile_page(redis_url: str, cluster: Cluster, fake_openai: FakeOpenAI,
                                                    browser: WebDriver) -> None:
    fake_openai.script(model([]))
    env = {"FAKE_OPENAI_BASE": fake_openai.url}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cluster.start(["-m", "pipelines", "ui", "--app", APP_PATH, "--port", str(port)], "ui",
                  PIPELINES_UI_TOKEN=TOKEN, **env)
    cluster.start(["-m", "pipelines", "worker", "--app", APP_PATH, "--name", "ui-w1", "--log-level", "WARNING"],
                  "worker", **env)
    wait_for("the web page to listen", lambda: _answers(base), 30, cluster.logs)
    app = build(redis_url, fake_openai.url)
    for n in range(3):
        app.run_agent("desk", job_id=f"hello-{n}", user="hello", tags=["demo"])
    app.run_agent("desk", job_id="broken-1", user="fail please")
    app.run_agent("desk", job_id="evil-1", user="hostile " + HOSTILE)

    # Not logged in: the page is the login form, and no job is shown.
    browser.get(f"{base}/jobs/chat-1")
    assert browser.find_elements(By.ID, "token") and "chat-1" not in browser.page_source
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    wait_for("the jobs page after login", lambda: browser.find_elements(By.ID, "jobs"), 10,
             lambda: browser.page_source + cluster.logs())

    # A conversation whose tool needs approval: the reply's words arrive one after another.
    app.run_agent("desk", job_id="chat-1", user="please refund order 7", tags=["vip"])
    browser.get(f"{base}/jobs/chat-1")
    seen: set[str] = set()

    def streaming() -> bool:
        text = text_of(browser, "#typing-text")
        if text and text != PREAMBLE:
            seen.add(text)
        return len(seen) >= 3

    wait_for("the reply's tokens to stream in", streaming, 30, cluster.logs)
    assert all(PREAMBLE.startswith(t) for t in seen)  # growing prefixes of the reply, never anything else
    approve = wait_for("the Approve button", lambda: browser.find_elements(By.CSS_SELECTOR, "button.approve"), 30,
                       cluster.logs)
    assert "waiting for approval" in text_of(browser, "#status")
    assert PREAMBLE in text_of(browser, "#transcript")  # the streamed text, now committed
    browser.execute_script("window.notReloaded = true;")
    _click(browser, approve[0], "button.approve")
    wait_for("the job to complete", lambda: text_of(browser, "#status") == "complete", 30, cluster.logs)
    transcript = text_of(browser, "#transcript")
    assert "refunded 7" in transcript and "Refund done: 7 euros" in transcript
    assert browser.execute_script("return window.notReloaded === true;"), "the page was reloaded"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "ui-job.png"))

    # The jobs page: counts, a status filter, and the screenshot.
    wait_for("the failed job", lambda: _status(app, "broken-1") == "error", 30, cluster.logs)
    wait_for("every other job to finish", lambda: all(
        _status(app, j) == "complete" for j in ("hello-0", "hello-1", "hello-2", "evil-1")), 30, cluster.logs)
    browser.get(f"{base}/")
    assert {"chat-1", "broken-1", "evil-1", "hello-0"} <= _listed(browser)
    browser.save_screenshot(str(SHOTS / "ui-jobs.png"))
    Select(browser.find_element(By.ID, "f-status")).select_by_value("error")
    browser.find_element(By.ID, "f-go").click()
    wait_for("the filtered table", lambda: _listed(browser) == {"broken-1"}, 10, cluster.logs)

    # Retry the failed job from its page: it completes, again without a reload.
    browser.find_element(By.LINK_TEXT, "broken-1").click()
    wait_for("the failed job's page", lambda: browser.find_elements(By.ID, "retry-resume"), 10, cluster.logs)
    assert "the model refused this request" in text_of(browser, "#banner")
    browser.execute_script("window.notReloaded = true;")
    browser.find_element(By.ID, "retry-resume").click()
    wait_for("the retried job to complete", lambda: text_of(browser, "#status") == "complete", 30, cluster.logs)
    assert "Happy to help." in text_of(browser, "#transcript")
    assert browser.execute_script("return window.notReloaded === true;")

    # The hostile transcript shows as text, and none of it ran.
    browser.get(f"{base}/jobs/evil-1")
    wait_for("the hostile page", lambda: browser.find_elements(By.ID, "transcript"), 10, cluster.logs)
    time.sleep(0.5)  # let an injected handler fire, if one had been injected
    assert browser.execute_script("return typeof window.pwned;") == "undefined"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check
    assert "<script>window.pwned=1</script>" in text_of(browser, "#transcript")
    assert not browser.find_elements(By.CSS_SELECTOR, "#transcript img, #transcript a, #transcript script")

    # From the page's own origin, with the session cookie: a POST without the CSRF token is refused.
    status = browser.execute_async_script(
        "var done = arguments[0]; fetch('/jobs/chat-1/cancel', {method: 'POST', credentials: 'same-origin', "
        "body: new URLSearchParams({})}).then(function (r) { done(r.status); });")
    assert status == 403
    # And without the login: refused.
    assert httpx.get(f"{base}/jobs/chat-1").status_code == 401


def _click(browser: WebDriver, element: Any, css: str) -> None:
    """A real click; if the live refresh replaced the element meanwhile, click its replacement."""
    try:
        element.click()
    except StaleElementReferenceException:
        browser.find_element(By.CSS_SELECTOR, css).click()


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/login", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _status(app: Any, job_id: str) -> str:
    view = app.get(job_id)
    return "" if view is None else str(view.status.value)


def _listed(browser: WebDriver) -> set[str]:
    # Read in one script: the table refreshes itself live, so element handles go stale.
    ids = browser.execute_script("return Array.from(document.querySelectorAll('#job-rows tr[data-job]'))"
                                 ".map(function (r) { return r.getAttribute('data-job'); });")
    return set(ids or [])


def test_chromium_is_installed_where_the_tests_expect_it() -> None:
    assert shutil.which("chromium") == CHROMIUM and shutil.which("chromedriver") == CHROMEDRIVER
