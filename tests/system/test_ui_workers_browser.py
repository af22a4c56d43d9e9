"""The workers page against real RQ workers, in headless chromium (issue 35).

A ``pipelines worker`` process takes a job whose phase sleeps, journaling
nothing (as a worker killed inside its model call leaves no step); the page
lists the worker, alive, with the job it runs and since when, and the job in
flight. The worker is killed with ``kill -9``: once its
lease (3 s) runs out the job's page says "worker lost" instead of running,
and the workers page lists it so, with the dead worker marked not alive.
``UPDATE_SCREENSHOTS=1`` writes docs/images/ui-workers.png and ui-workers-lost.png.
"""

from __future__ import annotations

import os
import re

import pytest
import redis

from pipelines.app import App
from tests.system.conftest import ROOT, Cluster, wait_for
from tests.system.test_ui_page_browser import _served, browser, text_of
from tests.system.test_workers import NAP_ENV, NAP_STARTED

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

__all__ = ["browser"]
pytestmark = [pytest.mark.redis, pytest.mark.system]


def test_live_workers_their_jobs_and_a_worker_lost(cluster: Cluster, app: App, client: redis.Redis,
                                                   browser: WebDriver) -> None:
    cluster.env.update(NAP_ENV)  # a 3 s lease; the first nap sleeps 60 s
    doomed = cluster.worker("w-doomed", "--sweep-interval", "0", "--alive-ttl", "3")  # shown dead ~3 s after the kill
    # Its nap journals nothing: only the lease that ran out (not let go) tells the page its worker was lost.
    app.run_pipeline("sleepy", job_id="napper")
    app.run_pipeline("sleepy", job_id="waiter")  # waits behind the napper: one worker, one job at a time
    entry = wait_for("napper to start napping", lambda: client.lindex(NAP_STARTED, 0), 20, cluster.logs)
    cluster.pids.append(int(entry.decode().split()[1]))
    with _served(app) as base:
        browser.get(f"{base}/workers")
        worker_row = text_of(browser, "#workers tr[data-worker='w-doomed']")
        assert "yes" in worker_row and "napper" in worker_row and re.search(r"\d+ s", worker_row), worker_row
        assert "napper" in text_of(browser, "#held") and "w-doomed" in text_of(browser, "#held")
        assert "pipelines" in text_of(browser, "#queues")
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            browser.set_window_size(1280, 1100)
            browser.save_screenshot(str(ROOT / "docs" / "images" / "ui-workers.png"))

        browser.get(f"{base}/jobs/napper")
        assert text_of(browser, "#place") == "in flight"
        cluster.kill9(doomed)  # the worker and its horse: the nap ends mid-phase, nothing renews the lease
        wait_for("the page to say the worker was lost",
                 lambda: text_of(browser, "#place") == "worker lost", 20, cluster.logs)
        browser.get(f"{base}/workers")
        assert "napper" in text_of(browser, "#lost")
        if os.environ.get("UPDATE_SCREENSHOTS") == "1":
            browser.save_screenshot(str(ROOT / "docs" / "images" / "ui-workers-lost.png"))

        def dead_worker_shown_dead() -> bool:  # its alive key (a 3 s TTL) runs out, or RQ forgets it
            browser.get(f"{base}/workers")
            row = text_of(browser, "#workers tr[data-worker='w-doomed']")
            return not row or "\tno\t" in row

        wait_for("the killed worker to be shown dead", dead_worker_shown_dead, 30, cluster.logs)
