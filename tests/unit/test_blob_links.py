"""Issue 30 (9): the directory blob store never follows a link out of its root; the orphan sweep goes on.

A symbolic link planted at a job's blob folder (or at one blob) must not make
``app.delete`` remove the link target's files, nor a later put write there:
the store refuses with :class:`CorruptRecordError` naming the link, and
nothing outside the root is read, written, touched or deleted. One folder the
orphan sweep cannot delete is logged and reported; the sweep goes on.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from adapters.blobs import DirectoryBlobStore
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.offload import OffloadingStorage
from pipelines import Agent, App, JobStatus
from pipelines.engine.blobs import blob_name
from pipelines.engine.errors import CorruptRecordError
from pipelines.testing import ScriptedModel

BIG = "x" * (100 * 1024)  # over the 64 KiB threshold: the first message goes to the blob store
DATA = b'"a blob"'
NAME = blob_name(DATA)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder outside the blob root, with files nobody may touch through the store."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    (folder / NAME).write_bytes(DATA)  # even a file named like a blob stays
    return folder


def outside(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def finished_app(root: Path) -> tuple[App, DirectoryBlobStore]:
    blobs = DirectoryBlobStore(root)
    app = App(storage=OffloadingStorage(MemoryStorage(), blobs), provenance=False,
              scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)),
              agents=[Agent(name="bot", model=ScriptedModel(["done"]))])
    app.run_agent("bot", job_id="j", messages=[BIG])
    app.drain()
    view = app.get("j")
    assert view is not None and view.status is JobStatus.COMPLETE
    assert list(blobs.job_ids()) == ["j"]
    return app, blobs


def plant_folder_link(root: Path, job_id: str, target: Path) -> Path:
    """Replace the job's blob folder by a link to ``target`` (what another program, or a restore, could do)."""
    folder = root / f"job-{job_id}"
    if folder.exists():
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()
    folder.symlink_to(target, target_is_directory=True)
    return folder


def test_delete_refuses_a_linked_job_folder_and_removes_nothing_outside_the_root(tmp_path: Path,
                                                                                  victim: Path) -> None:
    app, blobs = finished_app(tmp_path / "blobs")
    before = outside(victim)
    link = plant_folder_link(blobs.root, "j", victim)
    with pytest.raises(CorruptRecordError, match=r"job-j.*symbolic link.*nothing outside .* is read, written or del"):
        app.delete("j")
    assert outside(victim) == before  # the link's target kept every file
    assert link.is_symlink()  # refused: left for a person to look at
    # A later write to that job goes nowhere either.
    other = b'"another blob"'
    with pytest.raises(CorruptRecordError, match="symbolic link"):
        blobs.put("j", blob_name(other), other)
    with pytest.raises(CorruptRecordError, match="symbolic link"):
        blobs.get("j", NAME)
    assert outside(victim) == before


def test_a_link_planted_at_a_blob_is_refused_and_its_target_is_not_touched(tmp_path: Path, victim: Path) -> None:
    blobs = DirectoryBlobStore(tmp_path / "blobs")
    blobs.put("j", blob_name(b'"kept"'), b'"kept"')
    target = victim / NAME
    os.utime(target, (1_000_000, 1_000_000))
    (blobs.root / "job-j" / NAME).symlink_to(target)
    with pytest.raises(CorruptRecordError, match=f"job-j/{NAME}.*symbolic link"):
        blobs.get("j", NAME)
    with pytest.raises(CorruptRecordError, match=f"job-j/{NAME}.*symbolic link"):
        blobs.put("j", NAME, DATA)  # "already there" must not touch (utime) what the link points to
    assert target.stat().st_mtime == 1_000_000
    assert blobs.delete_job("j") == 2  # the link itself goes, its target stays
    assert outside(victim)[NAME] == DATA and not (blobs.root / "job-j").exists()


def test_a_fifo_planted_at_a_blob_is_refused_without_hanging_the_reader(tmp_path: Path) -> None:
    blobs = DirectoryBlobStore(tmp_path / "blobs")
    blobs.put("j", blob_name(b'"kept"'), b'"kept"')
    os.mkfifo(blobs.root / "job-j" / NAME)
    got: list[Any] = []

    def read() -> None:
        try:
            got.append(blobs.get("j", NAME))
        except CorruptRecordError as exc:
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert len(got) == 1 and isinstance(got[0], CorruptRecordError), "a FIFO made get() block"


def test_a_root_given_as_a_link_is_resolved_once(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    blobs = DirectoryBlobStore(tmp_path / "alias")
    assert blobs.root == real.resolve()
    blobs.put("j", NAME, DATA)
    assert blobs.get("j", NAME) == DATA and (real / "job-j" / NAME).read_bytes() == DATA


def test_one_undeletable_folder_does_not_stop_the_orphan_sweep(tmp_path: Path, victim: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    blobs = DirectoryBlobStore(tmp_path / "blobs")
    wrapped = OffloadingStorage(MemoryStorage(), blobs)
    for job in ("a-stuck", "b-linked", "c-orphan"):
        blobs.put(job, NAME, DATA)
    (blobs.root / "job-a-stuck" / "not-mine").mkdir()  # a folder this store never writes: not deleted
    plant_folder_link(blobs.root, "b-linked", victim)
    before = outside(victim)
    with caplog.at_level(logging.ERROR, logger="pipelines"):
        sweep = wrapped.collect_orphans(older_than=0)
    assert sweep.removed == ["c-orphan"]  # after the two it could not delete
    assert sorted(sweep.failed) == ["a-stuck", "b-linked"]
    assert "not-mine" in sweep.failed["a-stuck"] and "symbolic link" in sweep.failed["b-linked"]
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == [
        "cannot delete the blobs of job a-stuck", "cannot delete the blobs of job b-linked"]
    assert outside(victim) == before
    assert (blobs.root / "job-a-stuck" / NAME).exists()  # refused means nothing deleted, not half
    assert sorted(blobs.job_ids()) == ["a-stuck", "b-linked"]


def test_a_tool_result_over_the_value_limit_is_kept_by_a_storage_that_offloads_it(tmp_path: Path) -> None:
    from pipelines import tool
    from pipelines.engine import models
    from pipelines.testing import call, reply

    big = "x" * (models.MAX_VALUE_BYTES + 1024)

    @tool
    def dump() -> str:
        """Return a big report."""
        return big

    def model(messages: list[dict[str, Any]]) -> Any:
        return reply(None, {**call("dump"), "id": "d0"}) if messages[-1]["role"] == "user" else "got it"

    for storage, kept in ((OffloadingStorage(MemoryStorage(), DirectoryBlobStore(tmp_path)), True),
                          (MemoryStorage(), False)):
        app = App(storage=storage, scheduler=MemoryScheduler(), provenance=False,
                  agents=[Agent(name="a", model=ScriptedModel(model), tools=[dump], stream=False)])
        app.run_agent("a", job_id="j", user="go")
        app.drain()
        result = next(m["content"] for m in app.messages("j") if m["role"] == "tool")
        assert app.get("j").status is JobStatus.COMPLETE  # type: ignore[union-attr]
        # Offloaded, the whole result; else the error the model reads in its place.
        assert (result == big) if kept else result.startswith("Error: tool 'dump' ran, but its result could not")
