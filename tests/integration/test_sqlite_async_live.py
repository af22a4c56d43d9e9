"""``aread_live`` on an SQLite file: a follower's wait is a future, woken by this process's writes, by another
process's, and by the job's deletion; a thousand idle followers cost one heads query per poll, not one each.

Each wait below blocks for a minute (``block=60``) while the test gives it far less (``wait_for``): only a
wake-up, never the end of the block, can make it return in time.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from adapters.base import AsyncLiveStore
from adapters.sqlite import SQLiteStorage
from adapters.sqlite.reads import SQLiteReads
from pipelines.engine.models import Checkpoint, Event, JobRecord, JobStatus

ROOT = Path(__file__).resolve().parents[2]


def record(job_id: str) -> JobRecord:
    cp = Checkpoint[Any](next_phase="a", state={}, version=1, due_at=1.0)
    return JobRecord(job_id=job_id, status=JobStatus.RUNNING, checkpoint=cp, version=1)


def part(text: str) -> Event:
    return Event(timestamp=1.0, type="text_delta", turn=1, data={"text": text})


def storage_with(tmp_path: Path, *job_ids: str) -> SQLiteStorage:
    storage = SQLiteStorage(str(tmp_path / "alive.db"))
    for job_id in job_ids:
        storage.create_job(record(job_id), events=[Event(timestamp=1.0, type="job_started")])
    return storage


def test_sqlite_storage_is_an_async_live_store(tmp_path: Path) -> None:
    assert isinstance(storage_with(tmp_path), AsyncLiveStore)


def test_a_publish_from_a_worker_thread_wakes_the_async_follower_and_no_other(tmp_path: Path) -> None:
    storage = storage_with(tmp_path, "a", "b")

    async def main() -> tuple[list[Event], bool, int]:
        start_a = (await storage.aread_live("a"))[-1].id
        start_b = (await storage.aread_live("b"))[-1].id
        a = asyncio.create_task(storage.aread_live("a", after=start_a, block=60))
        b = asyncio.create_task(storage.aread_live("b", after=start_b, block=60))
        await asyncio.sleep(0.2)
        threading.Thread(target=storage.publish, args=("a", [part("hé")])).start()
        got = await asyncio.wait_for(a, 10)
        await asyncio.sleep(0.2)  # several polls: b's job has no new part, so b sleeps on
        waiting = storage._wakeup.followers(storage._heads).waiting()
        b_pending = not b.done()
        b.cancel()
        return got, b_pending, waiting

    got, b_waited, waiting = asyncio.run(main())
    assert [p.data["text"] for p in got] == ["hé"]
    assert b_waited and waiting == 1


_PUBLISH_LATER = """
import sys, time
from adapters.sqlite import SQLiteStorage
from pipelines.engine.models import Event
time.sleep(0.5)
SQLiteStorage(sys.argv[1]).publish("j", [Event(timestamp=1.0, type="text_delta", turn=1, data={"text": "far"})])
"""


def test_a_publish_by_another_process_wakes_the_async_follower(tmp_path: Path) -> None:
    storage = storage_with(tmp_path, "j")

    async def main() -> list[Event]:
        start = (await storage.aread_live("j"))[-1].id
        follower = asyncio.create_task(storage.aread_live("j", after=start, block=60))
        other = await asyncio.create_subprocess_exec(sys.executable, "-c", _PUBLISH_LATER, storage.path, cwd=ROOT)
        try:
            return await asyncio.wait_for(follower, 20)
        finally:
            await other.wait()

    assert [p.data["text"] for p in asyncio.run(main())] == ["far"]


def test_deleting_the_job_ends_the_wait_with_nothing(tmp_path: Path) -> None:
    storage = storage_with(tmp_path, "gone")
    start = storage.read_live("gone")[-1].id

    async def main() -> list[Event]:
        follower = asyncio.create_task(storage.aread_live("gone", after=start, block=60))
        await asyncio.sleep(0.2)
        # Another process deletes the row (no wake-up from this one): only the watcher's poll can notice.
        subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                        "c.execute('DELETE FROM jobs WHERE job_id = ?', ('gone',)); c.commit()", storage.path],
                       check=True, timeout=30)
        return await asyncio.wait_for(follower, 10)

    assert asyncio.run(main()) == []


def test_a_cancelled_follower_leaves_no_waiter_and_the_watcher_stops(tmp_path: Path) -> None:
    storage = storage_with(tmp_path, "j")

    async def main() -> tuple[int, int, bool]:
        start = (await storage.aread_live("j"))[-1].id
        followers = storage._wakeup.followers(storage._heads)
        tasks = [asyncio.create_task(storage.aread_live("j", after=start, block=60)) for _ in range(5)]
        await asyncio.sleep(0.2)
        before = followers.waiting()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.3)  # the watcher's next poll finds nobody and returns
        return before, followers.waiting(), followers._task is not None and followers._task.done()

    before, after, stopped = asyncio.run(main())
    assert (before, after, stopped) == (5, 0, True)


def test_a_thousand_idle_followers_share_one_heads_query_per_poll(tmp_path: Path, monkeypatch: Any) -> None:
    ids = [f"idle-{n}" for n in range(1000)]
    storage = storage_with(tmp_path, *ids)
    queries: list[int] = []
    heads = SQLiteReads._heads

    def counted(self: SQLiteReads, job_ids: list[str]) -> dict[str, int]:
        queries.append(len(job_ids))
        return heads(self, job_ids)

    monkeypatch.setattr(SQLiteReads, "_heads", counted)
    starts = {job_id: storage.read_live(job_id)[-1].id for job_id in ids}

    async def main() -> list[list[Event]]:
        tasks = [asyncio.create_task(storage.aread_live(j, after=s, block=60)) for j, s in starts.items()]
        await asyncio.sleep(1.0)
        threading.Thread(target=storage.publish, args=("idle-7", [part("one")])).start()
        got = await asyncio.wait_for(tasks[7], 10)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return [got]

    [got] = asyncio.run(main())
    assert [p.data["text"] for p in got] == ["one"]
    # About one query per 50 ms poll, each naming every waiting job: never one per follower.
    assert 0 < len(queries) < 200, len(queries)
    assert max(queries) == 1000
