"""Finding runs on the jobs page (issue 35): id substring, tag, pipeline, status and time range; pages by
cursor whose cost follows the page; rows refreshed in place; running split into in flight, queued, scheduled
and worker lost."""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

with warnings.catch_warnings():  # starlette 0.52's testclient names an alias anyio deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient

from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from pipelines import App, Phase
from pipelines.engine.models import Checkpoint, JobRecord, JobStatus
from pipelines.engine.phase import Done
from pipelines.web import find, work
from pipelines.web.jobs import PAGE_SIZE
from pipelines.web.ui import ui_app

LOCAL = "http://127.0.0.1"
T0 = 1_800_000_000.0


def _noop(ctx: object) -> Done:
    return Done(result=None)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(T0 + 10_000)


@pytest.fixture
def app(clock: VirtualClock) -> App:
    return App(storage=MemoryStorage(clock=clock), scheduler=MemoryScheduler(clock=clock), provenance=False,
               pipelines={"etl": [Phase("only", _noop)], "mail": [Phase("only", _noop)]})


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(ui_app(app), base_url=LOCAL) as c:
        yield c


def put(app: App, job_id: str, *, at: float, pipeline: str = "etl", status: JobStatus = JobStatus.COMPLETE,
        tags: list[str] | None = None, due: float | None = None) -> None:
    checkpoint = None if due is None else Checkpoint(next_phase="only", state=None, due_at=due)
    app.storage.create_job(JobRecord(job_id=job_id, pipeline=pipeline, status=status, created_at=at, updated_at=at,
                                     checkpoint=checkpoint, options={"tags": tags or []}))


def ids_of(page: str) -> list[str]:
    return re.findall(r'<tr class="st-[a-z]+" data-job="([^"]+)"', page)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_search_by_id_substring_tag_pipeline_status_and_time_range(app: App, client: TestClient) -> None:
    for n in range(30):
        put(app, f"order-{n:02d}", at=T0 + n, pipeline="etl" if n % 2 else "mail",
            status=JobStatus.ERROR if n % 3 == 0 else JobStatus.COMPLETE, tags=["vip"] if n % 5 == 0 else [])
    put(app, "refund-07", at=T0 + 100, tags=["vip"])
    assert ids_of(client.get("/", params={"q": "der-1"}).text) == [f"order-{n}" for n in range(19, 9, -1)]
    assert ids_of(client.get("/", params={"tag": "vip"}).text) == ["refund-07", "order-25", "order-20", "order-15",
                                                                    "order-10", "order-05", "order-00"]
    both = client.get("/", params={"tag": "vip", "name": "mail", "status": "error"}).text
    assert ids_of(both) == ["order-00"]  # vip and mail: 0, 10, 20; of those only 0 failed
    ranged = client.get("/", params={"since": iso(T0 + 10), "until": iso(T0 + 13), "q": "order"}).text
    assert ids_of(ranged) == ["order-13", "order-12", "order-11", "order-10"]
    assert ids_of(client.get("/", params={"q": "refund-07"}).text) == ["refund-07"]  # a whole id: read at once
    assert "no jobs match" in client.get("/", params={"q": "nobody"}).text
    # The form keeps what was asked, every value escaped.
    page = client.get("/", params={"q": '"><b>x', "tag": "vip"}).text
    assert 'value="&#34;&gt;&lt;b&gt;x"' in page and "<b>x" not in page



def test_a_whole_id_typed_comes_first_and_the_ids_holding_it_follow(app: App) -> None:
    # "A substring of the job id": order-1 is read at once, and order-10..12 are not hidden behind it.
    for n in range(1, 13):
        put(app, f"order-{n}", at=T0 + n)
    first = find.find(app, find.Query(q="order-1"), size=10)
    assert [r.job_id for r in first.rows] == ["order-1"] and first.next is not None
    rest = find.find(app, find.Query(q="order-1"), size=10, before=first.next)
    assert [r.job_id for r in rest.rows] == ["order-12", "order-11", "order-10"]  # not order-1 a second time

def test_a_search_reads_a_bounded_number_of_records_and_goes_on_from_where_it_stopped(app: App) -> None:
    for n in range(100):
        put(app, f"job-{n:03d}", at=T0 + n, tags=["rare"] if n in (3, 90) else [])
    query = find.Query(tag="rare")
    first = find.find(app, query, size=10, scan_limit=40)
    assert [r.job_id for r in first.rows] == ["job-090"] and first.scanned == 40 and first.next is not None
    assert first.searched_to == T0 + 60
    second = find.find(app, query, size=10, before=first.next, scan_limit=40)
    assert second.rows == [] and second.scanned == 40
    third = find.find(app, query, size=10, before=second.next, scan_limit=40)
    assert [r.job_id for r in third.rows] == ["job-003"] and third.next is None  # the listing ended
    # The time range bounds the read itself: it starts at `until` and stops at `since`.
    ranged = find.find(app, find.Query(since=T0 + 50, until=T0 + 59), size=50)
    assert len(ranged.rows) == 10 and ranged.scanned == 11 and ranged.next is None


def test_pages_go_by_cursor_forwards_and_back(app: App, client: TestClient) -> None:
    for n in range(PAGE_SIZE * 3):
        put(app, f"job-{n:03d}", at=T0 + n)
    pages = [client.get("/").text]
    for _ in range(2):
        link = re.search(r'href="\?([^"]*)" id="next"', pages[-1])
        assert link is not None and "before=" in link.group(1)
        pages.append(client.get("/?" + html.unescape(link.group(1))).text)
    assert [ids_of(p)[0] for p in pages] == ["job-149", "job-099", "job-049"]
    assert 'id="next"' not in pages[2]
    back = re.search(r'href="\?([^"]*)" id="prev"', pages[2])
    assert back is not None and "before=" in back.group(1)  # the previous page by its cursor, not by counting
    assert ids_of(client.get("/?" + html.unescape(back.group(1))).text)[0] == "job-099"



def test_previous_goes_back_one_page_past_the_cursors_a_link_keeps(app: App, client: TestClient) -> None:
    from pipelines.web.jobs import BACK_LIMIT

    pages = BACK_LIMIT + 4
    for n in range(PAGE_SIZE * pages):
        put(app, f"job-{n:04d}", at=T0 + n)
    page, text, seen = 1, client.get("/").text, []
    while (link := re.search(r'href="\?([^"]*)" id="next"', text)) is not None:
        text, page = client.get("/?" + html.unescape(link.group(1))).text, page + 1
    seen.append(ids_of(text)[0])
    while (back := re.search(r'href="\?([^"]*)" id="prev"', text)) is not None:  # all the way back, one by one
        text = client.get("/?" + html.unescape(back.group(1))).text
        seen.append(ids_of(text)[0])
    top = PAGE_SIZE * pages - 1
    assert seen == [f"job-{top - PAGE_SIZE * k:04d}" for k in range(pages - 1, -1, -1)]

def test_the_live_refresh_keeps_the_rows_in_place_and_counts_what_changed(app: App, client: TestClient,
                                                                         clock: VirtualClock) -> None:
    for n in range(5):
        put(app, f"job-{n}", at=T0 + n)
    page = client.get("/").text
    shown = ids_of(page)
    loaded = re.search(r'data-loaded="([^"]+)"', page)
    assert shown == ["job-4", "job-3", "job-2", "job-1", "job-0"] and loaded is not None
    clock.advance(5)
    app.storage.delete_job("job-2")
    put(app, "job-9", at=clock())  # a new job: counted, not inserted among the rows
    params = {"partial": 1, "ids": ",".join(shown), "loaded": loaded.group(1)}
    rows = client.get("/", params=params).text
    assert ids_of(rows) == ["job-4", "job-3", "job-1", "job-0"] and 'data-newer="1"' in rows
    assert client.get("/", params={"partial": 1, "ids": ",".join(["x"] * 201)}).status_code == 400


def test_running_jobs_are_split_into_in_flight_queued_scheduled_and_worker_lost(app: App, client: TestClient,
                                                                               clock: VirtualClock) -> None:
    now = clock()
    for job_id, due in (("held", now), ("waits", now), ("later", now + 60), ("dead", now)):
        put(app, job_id, at=now - 1, status=JobStatus.RUNNING, due=due)
    assert app.storage.acquire_lease("held", "w-1", 30) is not None
    assert app.storage.acquire_lease("dead", "w-2", 30) is not None
    app.storage.record_step("dead", version=0, owner="w-2", key="model", value={"message": {"role": "assistant"}})
    clock.advance(31)  # w-2 died: its lease ran out, nothing renewed it (w-1's too, so take it again)
    assert app.storage.acquire_lease("held", "w-1", 30) is not None
    split = work.split_running(app)
    assert split.counts == {work.IN_FLIGHT: 1, work.QUEUED: 1, work.SCHEDULED: 1, work.LOST: 1}
    page = client.get("/").text
    assert re.search(r'data-place="worker lost">worker lost <b>1</b>', page)
    assert re.search(r'data-place="in flight">in flight <b>1</b>', page)
    assert re.search(r'data-job="dead".*?worker lost', page, re.S)
