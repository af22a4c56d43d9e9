"""Bulk actions on the jobs page: cancel or retry the jobs ticked in the table, with a confirm step.

The first POST (CSRF-checked like every POST) changes nothing: it lists the
jobs chosen with their status and says what the action does. The second,
carrying ``confirmed=yes``, acts on each through the App (``app.cancel`` /
``app.retry``) and lists what happened to each: a job the action does not
apply to (a finished job cancelled, a running one retried) says why, and the
others are still acted on.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from pipelines.engine.models import JobStatus, validate_job_id
from pipelines.errors import InvalidInputError, PipelineError
from pipelines.web.core import UI

__all__ = ["BULK_ACTIONS", "MAX_BULK_JOBS", "bulk"]

BULK_ACTIONS = frozenset({"cancel", "retry"})
MAX_BULK_JOBS = 50
"""Jobs one bulk action takes: one page of the jobs table."""


def bulk(ui: UI, request: Request) -> Response:
    """Confirm (``confirmed`` missing) or do the posted bulk action on the posted job ids."""
    form: dict[str, str] = request.state.form
    action = form.get("action", "")
    if action not in BULK_ACTIONS:
        raise InvalidInputError(f"unknown bulk action {action[:40]!r}; one of {', '.join(sorted(BULK_ACTIONS))}")
    mode = form.get("mode", "resume")
    if action == "retry" and mode not in ("resume", "full"):
        raise InvalidInputError(f"mode must be 'resume' or 'full', got {mode[:40]!r}")
    ids = _ids(request.state.form_pairs)
    if form.get("confirmed") != "yes":
        jobs = [{"id": job_id, "status": _status(ui, job_id)} for job_id in ids]
        return ui.render(request, "bulk_confirm.html", action=action, mode=mode, jobs=jobs)
    outcomes = [_do(ui, action, mode, job_id) for job_id in ids]
    return ui.render(request, "bulk_done.html", action=action, mode=mode, outcomes=outcomes,
                     done=sum(1 for o in outcomes if o["ok"]))


def _ids(pairs: list[tuple[str, str]]) -> list[str]:
    ids = list(dict.fromkeys(v for k, v in pairs if k == "id"))  # in the order ticked, each once
    if not ids:
        raise InvalidInputError("tick at least one job")
    if len(ids) > MAX_BULK_JOBS:
        raise InvalidInputError(f"a bulk action takes at most {MAX_BULK_JOBS} jobs, got {len(ids)}")
    for job_id in ids:
        validate_job_id(job_id)
    return ids


def _status(ui: UI, job_id: str) -> str:
    view = ui.app.get(job_id)
    return "not found" if view is None else view.status.value


def _do(ui: UI, action: str, mode: str, job_id: str) -> dict[str, Any]:
    try:
        if action == "cancel":
            # No wait: a turn in flight applies the stored request at its boundary.
            view = ui.app.cancel(job_id, wait=0.0)
            said = ("cancelled" if view.status is JobStatus.CANCELLED
                    else "cancel asked: it stops at the end of the turn in flight")
        else:
            ui.app.retry(job_id, mode=mode)  # type: ignore[arg-type]
            said = f"running again ({'from its checkpoint' if mode == 'resume' else 'from the start'})"
        return {"id": job_id, "ok": True, "said": said}
    except PipelineError as exc:
        return {"id": job_id, "ok": False, "said": str(exc)}
