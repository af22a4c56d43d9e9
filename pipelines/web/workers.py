"""The workers page: live workers and what each runs, queue depths, and the running jobs by place.

Running jobs come from storage (:func:`pipelines.web.work.split_running`:
held by a worker, queued, scheduled, worker lost); queues and workers from
the scheduler (:mod:`pipelines.app.queues`). A due job that no worker holds
and whose advance is in no queue is listed as "due, not queued": the queue
lost its message, and ``pipelines advance --due`` (the sweep) sends it again.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pipelines.app import queues
from pipelines.engine.models import JobRecord
from pipelines.web import work
from pipelines.web.core import UI

__all__ = ["workers_page"]

LISTED = 100  # jobs listed per section at most (the counts cover every job checked)


def workers_page(ui: UI, request: Request) -> Response:
    app = ui.app
    now = app.scheduler.now()
    split = work.split_running(app, keep=True)
    report = queues.report(app)
    by_place: dict[str, list[tuple[JobRecord, str | None]]] = {p: [] for p in split.counts}
    for record, where, owner in split.jobs:
        by_place[where].append((record, owner))
    due = [r for r, _ in by_place[work.QUEUED]]
    queued = report.queued(due)
    running_on = {w.job_id: w for w in report.workers or [] if w.job_id is not None}
    return ui.render(
        request, "workers.html", report=report, now=now, counts=split.counts, capped=split.capped,
        checked=split.checked, age=queues.age,
        held=[_held(r, owner, running_on, now) for r, owner in by_place[work.IN_FLIGHT][:LISTED]],
        lost=[_job(r, now) for r, _ in by_place[work.LOST][:LISTED]],
        due=[{**_job(r, now), "in_queue": None if queued is None else r.job_id in queued} for r in due[:LISTED]],
        not_queued=None if queued is None else sum(1 for r in due if r.job_id not in queued),
        scheduled=[_job(r, now) for r, _ in by_place[work.SCHEDULED][:LISTED]])


def _job(r: JobRecord, now: float) -> dict[str, Any]:
    due_at = r.checkpoint.due_at if r.checkpoint is not None else None
    return {"id": r.job_id, "pipeline": r.pipeline, "turns": r.phases_done, "updated": r.updated_at,
            "due": due_at, "overdue": None if due_at is None else now - due_at,
            "steps": 0 if r.checkpoint is None else len(r.checkpoint.journal)}


def _held(r: JobRecord, owner: str | None, running_on: dict[str, queues.WorkerRow],
          now: float) -> dict[str, Any]:
    worker = running_on.get(r.job_id)
    return {**_job(r, now), "owner": owner or "", "worker": worker.name if worker else "",
            "since": worker.since if worker else None}
