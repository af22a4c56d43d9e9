"""Finding runs on the jobs page in headless chromium (issue 35): the search form, and a live refresh that
updates rows where they are (a job that finishes does not jump to the top) and counts what changed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import App, Phase
from pipelines.engine.phase import Done
from tests.system.test_ui_page_browser import CHROMEDRIVER, CHROMIUM, _served, browser, text_of

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

__all__ = ["browser"]  # the fixture, shared
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="see test_ui_page_browser")


def _step(ctx: object) -> Done:
    return Done(result={"ok": True})


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(1_800_000_000)


@pytest.fixture
def app(clock: VirtualClock) -> App:
    return App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
               pipelines={"etl": [Phase("only", _step)], "mail": [Phase("only", _step)]})


@pytest.fixture
def base(app: App) -> Iterator[str]:
    with _served(app) as url:
        yield url


def row_ids(driver: WebDriver) -> list[str]:
    ids = driver.execute_script(
        "return Array.from(document.querySelectorAll('#job-rows tr[data-job]')).map(function (r) {"
        " return r.getAttribute('data-job') + ':' + r.querySelector('.status').textContent; });")
    return [str(i) for i in ids]


def test_search_form_and_rows_updated_in_place(app: App, clock: VirtualClock, base: str, browser: WebDriver) -> None:
    for n in range(4):
        app.run_pipeline("etl" if n % 2 else "mail", job_id=f"order-{n}")
        clock.advance(1)
    app.run_pipeline("etl", job_id="refund-1")
    clock.advance(1)
    browser.get(base + "/")
    assert text_of(browser, "#split [data-place='queued'] b") == "5"
    browser.find_element(By.ID, "f-q").send_keys("order")
    Select(browser.find_element(By.ID, "f-name")).select_by_value("etl")
    browser.find_element(By.ID, "f-go").click()
    # The click submits the form; the new page loads after click() returns.
    WebDriverWait(browser, 10).until(lambda d: "q=order" in d.current_url)
    assert "q=order" in browser.current_url and "name=etl" in browser.current_url
    assert row_ids(browser) == ["order-3:running", "order-1:running"]
    browser.get(base + "/")
    before = row_ids(browser)
    assert [r.split(":")[0] for r in before] == ["refund-1", "order-3", "order-2", "order-1", "order-0"]
    assert not browser.find_element(By.ID, "newer").is_displayed()
    app.drain()  # every job completes; the oldest last touched now come first in a fresh listing
    clock.advance(1)
    app.run_pipeline("etl", job_id="late-1")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and row_ids(browser)[0].endswith("running"):
        time.sleep(0.2)
    after = row_ids(browser)
    assert [r.split(":")[0] for r in after] == [r.split(":")[0] for r in before]  # same rows, same places
    assert all(r.endswith("complete") for r in after), after
    assert browser.find_element(By.ID, "newer").is_displayed()
    assert int(text_of(browser, "#newer-n")) >= 1
