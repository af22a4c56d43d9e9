"""Bulk cancel in headless chromium (issue 35): jobs ticked in the table stay ticked through the table's
live refresh; the action confirms which jobs it takes, then says what happened to each."""

from __future__ import annotations

import time

import pytest

from pipelines import App
from pipelines.engine.models import JobStatus
from tests.system.test_ui_page_browser import app, base, browser, text_of  # fixtures, shared

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

__all__ = ["app", "base", "browser"]


def shown(driver: WebDriver, css: str, timeout: float = 10.0) -> str:
    """The text of ``css`` once the page that has it loaded (a form's submit navigates: the click returns first)."""
    deadline = time.monotonic() + timeout
    while not (text := text_of(driver, css)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return text


def ticked(driver: WebDriver) -> list[str]:
    return [str(v) for v in driver.execute_script(
        "return Array.from(document.querySelectorAll('#job-rows input[name=id]:checked')).map(b => b.value);")]


def test_ticked_jobs_survive_the_refresh_and_are_cancelled_after_confirming(app: App, base: str,
                                                                          browser: WebDriver) -> None:
    for job_id in ("pay-1", "pay-2", "pay-3"):
        app.run_agent("desk", job_id=job_id, user="pay alice")
    app.drain()
    assert all(app.get(j).status is JobStatus.WAITING for j in ("pay-1", "pay-2", "pay-3"))  # type: ignore[union-attr]
    browser.get(f"{base}/")
    for job_id in ("pay-1", "pay-3"):
        browser.find_element(By.CSS_SELECTOR, f'#job-rows input[value="{job_id}"]').click()
    before = browser.execute_script("return document.getElementById('job-rows');")
    deadline = time.monotonic() + 10  # the table refreshes itself every 3 s: the rows are new elements then
    while browser.execute_script("return document.getElementById('job-rows');") == before \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert browser.execute_script("return document.getElementById('job-rows');") != before, "no refresh seen"
    assert sorted(ticked(browser)) == ["pay-1", "pay-3"]
    browser.find_element(By.ID, "bulk-cancel").click()
    assert "Cancel 2 jobs" in shown(browser, "#confirm h2")
    assert app.get("pay-1").status is JobStatus.WAITING  # type: ignore[union-attr]  # asked, not done
    browser.find_element(By.ID, "confirm-go").click()
    assert "cancel: 2 of 2 jobs done" in shown(browser, "#did")
    assert [app.get(j).status for j in ("pay-1", "pay-2", "pay-3")] == [  # type: ignore[union-attr]
        JobStatus.CANCELLED, JobStatus.WAITING, JobStatus.CANCELLED]
