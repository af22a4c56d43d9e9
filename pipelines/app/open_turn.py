"""What a job's open turn holds, read from its journal: the model's answer waiting on approvals, and each
tool call's state (intended, started, done, interrupted). Read only; the web page shows both.
"""

from __future__ import annotations

from typing import Any

from phases import journal
from pipelines.engine.models import JobRecord, JobStatus

__all__ = ["pending_reply", "tool_ledger"]


def pending_reply(rec: JobRecord) -> dict[str, Any] | None:
    """The model's message of the open turn, journaled but not committed (its calls wait for approval)."""
    if rec.status is not JobStatus.WAITING or rec.checkpoint is None:
        return None
    answer = rec.checkpoint.journal.get(journal.MODEL)
    message = answer.get("message") if isinstance(answer, dict) else None
    return message if isinstance(message, dict) else None


def tool_ledger(rec: JobRecord) -> list[dict[str, str]]:
    """Each tool call of the open turn: intended (answered by the model), started, done, interrupted."""
    entries = {} if rec.checkpoint is None else rec.checkpoint.journal
    started = entries.get(journal.TOOLS_STARTED)
    started_ids = {str(i) for i in started} if isinstance(started, list) else set()
    stuck = rec.status is JobStatus.WAITING and (rec.waiting or {}).get("kind") != "approval"
    rows = []
    for call in journal.model_calls(entries):
        call_id = str(call.get("id", ""))
        if journal.tool_key(call_id) in entries:
            state = "done"
        elif call_id in started_ids:
            state = "interrupted" if stuck or rec.status is JobStatus.ERROR else "started"
        else:
            state = "intended"
        rows.append({"id": call_id, "name": str((call.get("function") or {}).get("name", "?")), "state": state})
    return rows
