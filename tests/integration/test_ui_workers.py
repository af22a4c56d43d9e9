"""The workers page and the "worker lost" signal (issue 35), over HTTP against an in-process App.

Running jobs are told apart from what storage holds: a lease held (in flight),
due and held by nobody (queued; "not in any queue" when the scheduler has no
advance for it), due later (scheduled), and an attempt whose worker's lease
ran out instead of being let go (worker lost), journaled steps or not.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.local import LocalScheduler
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.sqlite import SQLiteStorage
from pipelines import App, Phase
from pipelines.engine.models import JobStatus
from pipelines.engine.phase import Done
from pipelines.web.ui import ui_app
from tests.integration.test_ui_find import put

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

LOCAL = "http://127.0.0.1"
T0 = 1_800_000_000.0


def _noop(ctx: object) -> Done:
    return Done(result=None)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(T0)


@pytest.fixture
def app(clock: VirtualClock) -> App:
    return App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
               pipelines={"etl": [Phase("only", _noop)]})


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        yield c


def lost_and_held(app: App, clock: VirtualClock) -> None:
    """held: a worker holds it; dead: its worker journaled the model's answer, then died; orphan: due, and the
    queue has no advance for it; later: due in a minute; fresh: started, its advance queued."""
    now = clock()
    for job_id, due in (("held", now), ("dead", now), ("orphan", now - 30), ("later", now + 600)):
        put(app, job_id, at=now - 40, status=JobStatus.RUNNING, due=due)
    app.run_pipeline("etl", job_id="fresh")
    assert app.storage.acquire_lease("dead", "owner-dead", 30) is not None
    app.storage.record_step("dead", version=0, owner="owner-dead", key="model", value={"message": {}})
    clock.advance(31)  # nothing renewed the dead worker's lease
    assert app.storage.acquire_lease("held", "owner-held", 30) is not None


def rows(page: str, section: str) -> list[str]:
    body = page.split(f'<section id="{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r'<tr data-job="([^"]+)"', body)


def test_the_workers_page_shows_queues_and_running_jobs_by_place(app: App, clock: VirtualClock,
                                                                client: TestClient) -> None:
    lost_and_held(app, clock)
    page = client.get("/workers").text
    assert sorted(rows(page, "held")) == ["held"]
    assert sorted(rows(page, "lost")) == ["dead"]
    assert sorted(rows(page, "due")) == ["fresh", "orphan"]
    assert sorted(rows(page, "scheduled")) == ["later"]
    assert re.search(r'data-job="orphan" class="not-queued">.*?<td class="in-queue">no</td>', page, re.S)
    assert re.search(r'data-job="fresh" class="">.*?<td class="in-queue">yes</td>', page, re.S)
    assert '<b id="not-queued">1</b>' in page
    queue = re.search(r'<tr data-queue="in-process"><td>in-process</td><td>interactive</td>'
                      r'<td class="num">(\d+)</td><td class="num">(\d+)</td>', page)
    assert queue is not None and queue.groups() == ("1", "0")  # fresh's advance
    assert "not reported by MemoryScheduler" in page  # no worker processes in-process
    jobs = client.get("/").text
    assert 'href="/workers"' in jobs and re.search(r'data-place="worker lost">worker lost <b>1</b>', jobs)


def test_a_job_whose_worker_died_says_worker_lost_until_a_worker_takes_it_again(
        app: App, clock: VirtualClock, client: TestClient) -> None:
    lost_and_held(app, clock)
    page = client.get("/jobs/dead").text
    assert 'data-place="worker lost"' in page and 'id="place"' in page and ">worker lost</span>" in page
    assert ">in flight</span>" in client.get("/jobs/held").text and 'id="interrupted"' not in page
    assert app.storage.acquire_lease("dead", "owner-new", 30) is not None  # the next worker takes the turn
    page = client.get("/jobs/dead/live").text
    assert ">in flight</span>" in page and ">interrupted 1&times;</span>" in page  # a poison turn in the making


def test_a_worker_that_died_before_journaling_anything_is_lost_too_and_one_let_go_is_not(
        app: App, clock: VirtualClock, client: TestClient) -> None:
    """A worker killed inside its model call leaves no step: its lease that ran out (not let go) tells it."""
    now = clock()
    for job_id in ("silent", "let-go"):
        put(app, job_id, at=now - 40, status=JobStatus.RUNNING, due=now)
    assert app.storage.acquire_lease("silent", "owner-silent", 30) is not None
    assert app.storage.acquire_lease("let-go", "owner-deferred", 30) is not None
    app.storage.release_lease("let-go", "owner-deferred")  # e.g. a turn deferred by a concurrency limit
    clock.advance(31)  # nothing renewed the silent worker's lease
    page = client.get("/workers").text
    assert rows(page, "lost") == ["silent"] and rows(page, "due") == ["let-go"]
    assert ">worker lost</span>" in client.get("/jobs/silent").text
    assert ">queued</span>" in client.get("/jobs/let-go").text
    assert app.storage.acquire_lease("silent", "owner-new", 30) is not None  # the next worker takes the turn
    assert ">in flight</span>" in client.get("/jobs/silent").text


def test_the_timeline_says_what_attempts_fenced_off_paid(app: App, clock: VirtualClock, client: TestClient) -> None:
    from pipelines.engine.models import Usage

    lost_and_held(app, clock)
    assert 'id="fenced"' not in client.get("/jobs/held").text
    app.storage.add_dropped_usage("held", Usage(prompt_tokens=90, completion_tokens=10, cost_usd=0.0125,
                                                model_calls=1), token="attempt-1")
    page = client.get("/jobs/held").text
    assert re.search(r'id="fenced">1 model call of attempts <b>fenced off</b>.*?cost \$0\.012500 and 100 tokens',
                     page)


def test_pipelines_devs_local_scheduler_shows_its_threads_and_the_job_each_runs(tmp_path: Path) -> None:
    inside, release = threading.Event(), threading.Event()

    def slow(ctx: object) -> Done:
        inside.set()
        release.wait(30)
        return Done(result=None)

    # The poller takes due work only after a long grace: with none it could claim busy-1 in the instant
    # before its worker leased it, and the page, read then, showed both threads busy (seen under heavy load).
    # Its first look, as the threads start, takes what is due at once (grace 0: what a stopped process left);
    # when that look comes after busy-1 is created, the other thread runs a duplicate advance of it (a no-op:
    # the lease is taken) and is busy for that moment, so the page is read again until it has passed.
    local = LocalScheduler(workers=2, poll=0.05, grace=30.0, sweep_interval=0)
    storage = SQLiteStorage(str(tmp_path / "dev.db"))
    app = App(storage=storage, scheduler=local, provenance=False,
              pipelines={"slow": [Phase("only", slow)], "etl": [Phase("only", _noop)]})
    row = r'<tr class="alive" data-worker="(pipelines-local-\d)">.*?<td>(busy|idle)</td>\s*<td>(.*?)</td>'
    with TestClient(ui_app(app), base_url=LOCAL) as client:
        idle = client.get("/workers").text
        assert "no worker thread runs in this process" in idle  # start() not called yet
        local.schedule_advance("waits", 600)  # a request due in ten minutes
        with local:
            app.run_pipeline("slow", job_id="busy-1")
            assert inside.wait(10)
            deadline = time.monotonic() + 10
            while True:
                page = client.get("/workers").text
                rows = re.findall(row, page, flags=re.S)
                if sorted(r[1] for r in rows) == ["busy", "idle"] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            release.set()
        assert sorted(r[1] for r in rows) == ["busy", "idle"]  # two threads, the poller not among them
        busy = next(r for r in rows if r[1] == "busy")
        assert 'href="/jobs/busy-1"' in busy[2]
        assert re.search(r'data-queue="this process"><td>this process</td><td>interactive</td><td class="num">0</td>'
                         r'<td class="num">1</td>', page)  # the delayed request of "waits"
        assert "worker threads of this process" in page and "not reported by" not in page
    storage.close()
