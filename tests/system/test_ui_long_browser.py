"""A long job in headless chromium (issue 35): a 1,200-message conversation shows its latest page and pages
back; a committed turn appends its messages to the page in place (what was shown stays, nothing is fetched
whole again)."""

from __future__ import annotations

import time

import pytest

from pipelines import App
from pipelines.engine.models import JobStatus
from tests.integration.test_ui_long_jobs import long_job
from tests.system.test_ui_page_browser import app, base, browser, text_of  # fixtures, shared

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

__all__ = ["app", "base", "browser"]


def messages_shown(driver: WebDriver) -> list[str]:
    ids = driver.execute_script("return Array.from(document.querySelectorAll('#messages .msg')).map(m => m.id);")
    return [str(i) for i in ids]


def test_a_long_conversation_pages_back_from_its_latest_messages(app: App, base: str, browser: WebDriver) -> None:
    long_job(app, "long-1")
    browser.get(f"{base}/jobs/long-1")
    shown = messages_shown(browser)
    assert len(shown) == 100 and shown[0] == "m-1100" and shown[-1] == "m-1199"
    assert "1200 messages" in text_of(browser, "#transcript h2")
    browser.find_element(By.ID, "earlier").click()
    shown = messages_shown(browser)
    assert shown[0] == "m-1000" and shown[-1] == "m-1099"
    browser.find_element(By.ID, "latest").click()
    assert messages_shown(browser)[-1] == "m-1199"
    assert "note" in text_of(browser, "#event-list li")  # the newest event first


def test_a_committed_turn_appends_its_messages_in_place(app: App, base: str, browser: WebDriver) -> None:
    app.run_agent("desk", job_id="pay-1", user="pay alice")
    app.drain()
    browser.get(f"{base}/jobs/pay-1")
    assert messages_shown(browser) == ["m-0"]
    browser.execute_script("document.getElementById('m-0').setAttribute('data-mark', 'kept');")
    # Clicked from a script: the page patches its live parts as the stream replays, a handle could go stale.
    browser.execute_script("document.querySelector('#approvals button.approve').click();")
    deadline = time.monotonic() + 10
    while app.get("pay-1").status is JobStatus.WAITING and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    app.drain()
    while len(messages_shown(browser)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert messages_shown(browser)[:3] == ["m-0", "m-1", "m-2"]
    assert browser.execute_script("return document.getElementById('m-0').getAttribute('data-mark');") == "kept"
    assert browser.execute_script("return document.getElementById('messages').getAttribute('data-len');") == \
        str(app.get("pay-1").record.transcript_len)  # type: ignore[union-attr]
    # Each refresh asked only for the messages after those shown (the server sends none before `from`).
    asked = browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.indexOf('/live?') >= 0)"
        ".map(e => new URL(e.name).searchParams.get('from'));")
    assert asked and all(a is not None and int(a) >= 1 for a in asked), asked
    assert "paid" in text_of(browser, "#messages")
    # The log and the events were patched too: new ones on top, none twice, the same as a fresh page's.
    shown_events = browser.execute_script(
        "return Array.from(document.querySelectorAll('#event-list li')).map(li => li.getAttribute('data-event'));")
    assert shown_events == [e.id for e in app.events("pay-1")][::-1]


def test_refreshes_that_overlap_add_each_message_and_event_once(app: App, base: str, browser: WebDriver) -> None:
    """An action's refresh and a committed event's refresh ask from the same point when both are in flight:
    what is new is added once (a slow server makes them overlap every time)."""
    app.run_agent("desk", job_id="pay-2", user="pay alice")
    app.drain()
    browser.get(f"{base}/jobs/pay-2")
    browser.execute_script("""
        const real = window.fetch.bind(window);
        window.fetch = (url, init) => real(url, init).then(
            r => String(url).indexOf('/live?') >= 0 ? new Promise(ok => setTimeout(() => ok(r), 600)) : r);""")
    browser.execute_script("document.querySelector('#approvals button.approve').click();")
    deadline = time.monotonic() + 15
    while app.get("pay-2").status is JobStatus.WAITING and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.05)
    app.drain()
    want_events = [e.id for e in app.events("pay-2")][::-1]
    shown_events: list[str] = []
    while time.monotonic() < deadline:
        shown_events = browser.execute_script(
            "return Array.from(document.querySelectorAll('#event-list li')).map(li => li.getAttribute('data-event'));")
        if len(messages_shown(browser)) >= 3 and len(shown_events) >= len(want_events):
            break
        time.sleep(0.1)
    time.sleep(1.5)  # any refresh still in flight lands
    shown_events = browser.execute_script(
        "return Array.from(document.querySelectorAll('#event-list li')).map(li => li.getAttribute('data-event'));")
    assert shown_events == want_events
    shown = messages_shown(browser)
    assert shown == sorted(set(shown), key=lambda i: int(i[2:])) and shown[:3] == ["m-0", "m-1", "m-2"]


def test_a_page_more_than_a_page_behind_keeps_a_draft_instead_of_reloading(app: App, base: str,
                                                                          browser: WebDriver) -> None:
    # A turn that added more than a page of messages reloaded the page, and the message being typed was lost.
    from pipelines.engine.models import Commit

    long_job(app, "grow", messages=2, events=1, logs=1)
    record = app.storage.get_job("grow")
    assert record is not None
    app.storage.commit(Commit(job_id="grow", expected_version=record.version, token="running", record=record.model_copy(
        update={"version": record.version + 1, "status": JobStatus.RUNNING})))
    browser.get(f"{base}/jobs/grow")
    assert messages_shown(browser) == ["m-0", "m-1"]
    browser.execute_script("window.__loaded = 'first';")
    browser.find_element(By.ID, "send-text").send_keys("a long draft")
    record = app.storage.get_job("grow")
    assert record is not None
    app.storage.commit(Commit(job_id="grow", expected_version=record.version, token="grown",
                              record=record.model_copy(update={"version": record.version + 1,
                                                               "transcript_len": 152}),
                              append_messages=[{"role": "assistant", "content": f"more {n}"} for n in range(150)]))
    deadline = time.monotonic() + 15
    while not browser.execute_script("return !document.getElementById('flash').hidden;") and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert browser.execute_script("return window.__loaded;") == "first"  # not reloaded
    assert browser.find_element(By.ID, "send-text").get_attribute("value") == "a long draft"
    assert "reload the page" in text_of(browser, "#flash")
    assert messages_shown(browser) == ["m-0", "m-1"]  # nothing patched in out of place
    browser.find_element(By.ID, "send-text").clear()
    browser.refresh()
    assert messages_shown(browser)[-1] == "m-151"
