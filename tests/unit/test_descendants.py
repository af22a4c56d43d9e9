"""``children.descendants``: the child runs a delete takes with a job, each found under the parent it names."""

from __future__ import annotations

from adapters.memory import MemoryStorage
from pipelines.engine import children
from pipelines.engine.models import JobRecord, JobStatus


def test_a_child_listed_first_by_a_job_it_does_not_name_is_still_found_under_its_own_parent() -> None:
    # It was marked seen at the first listing, not its parent's: left out, it outlived the family's delete.
    storage = MemoryStorage()

    def job(job_id: str, *, parent: str | None = None, kids: tuple[str, ...] = ()) -> JobRecord:
        rec = JobRecord(job_id=job_id, status=JobStatus.COMPLETE, parent_job=parent, children=list(kids))
        storage.create_job(rec)
        return rec

    root = job("p", kids=("p:a", "p:b"))
    job("p:a", parent="p", kids=("p:b:c",))  # lists a child that names another parent
    job("p:b", parent="p", kids=("p:b:c",))
    job("p:b:c", parent="p:b")
    assert sorted(r.job_id for r in children.descendants(root, storage)) == ["p:a", "p:b", "p:b:c"]
