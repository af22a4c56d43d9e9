"""``pipelines jobs --before/--count`` and ``pipelines reindex``: the CLI on the listing indexes."""

from __future__ import annotations

import io

import pytest

from adapters.memory import MemoryStorage
from pipelines.cli import main
from pipelines.engine.models import JobRecord, JobStatus
from tests.apps import memory_app

APP = "tests.apps.memory_app:app"


def fill(storage: MemoryStorage, n: int) -> None:
    for i in range(n):
        status = JobStatus.ERROR if i % 3 == 0 else JobStatus.COMPLETE
        storage.create_job(JobRecord(job_id=f"j{i}", status=status, created_at=float(i), updated_at=float(i)))


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> MemoryStorage:
    monkeypatch.delenv("PIPELINES_APP", raising=False)
    app = memory_app.reset()
    assert isinstance(app.storage, MemoryStorage)
    return app.storage


def test_a_full_page_names_the_cursor_of_the_next_and_the_pages_cover_every_job(storage: MemoryStorage) -> None:
    fill(storage, 7)
    code, out, err = run("jobs", "--app", APP, "--limit", "3")
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["j4", "j5", "j6"]
    seen = [line.split("\t")[0] for line in out.splitlines()]
    while err.startswith("more: pipelines jobs --before "):
        cursor = err.split()[-1]
        code, out, err = run("jobs", "--app", APP, "--limit", "3", "--before", cursor)
        assert code == 0
        seen += [line.split("\t")[0] for line in out.splitlines()]
    assert sorted(seen) == sorted(f"j{i}" for i in range(7)) and len(seen) == 7
    assert seen[3:6] == ["j1", "j2", "j3"]  # each page oldest first, pages going back in time


def test_count_prints_jobs_per_status_from_the_index(storage: MemoryStorage) -> None:
    fill(storage, 7)
    code, out, _ = run("jobs", "--app", APP, "--count")
    counts = dict(line.split("\t") for line in out.splitlines())
    assert code == 0 and counts["error"] == "3" and counts["complete"] == "4" and counts["all"] == "7"
    assert counts["running"] == "0" and set(counts) == {s.value for s in JobStatus} | {"all"}
    code, out, _ = run("jobs", "--app", APP, "--count", "--status", "error")
    assert code == 0 and out == "error\t3\n"


def test_a_bad_cursor_is_an_error_naming_it(storage: MemoryStorage) -> None:
    fill(storage, 2)
    code, out, err = run("jobs", "--app", APP, "--before", "last-week")
    assert code == 1 and out == "" and "cursor" in err and "last-week" in err


def test_reindex_rebuilds_the_listing_and_says_how_many(storage: MemoryStorage) -> None:
    fill(storage, 4)
    storage._updated.clear()  # an index that lost its entries (as jobs stored before it existed)
    for index in storage._by_status.values():
        index.clear()
    assert storage.count_jobs() == 0
    code, out, _ = run("reindex", "--app", APP)
    assert code == 0 and out == "indexed 4 jobs\n"
    assert storage.count_jobs() == 4 and storage.count_jobs(status=JobStatus.ERROR) == 2
    assert [r.job_id for r in storage.list_jobs()] == ["j3", "j2", "j1", "j0"]
