"""Conversation titles: after a new conversation's first successful run, a title agent names it (best effort).

``Agent(title_agent=namer)``: when a run of a conversation completes and no
title job exists yet, a child job (``<job>:c:title``) asks ``namer`` for a
short title from the first user message and the answer. It never fails or
delays the conversation (an error is a ``warn`` log line), it is started once
(the child's id is fixed, so a follow-up run or a crash re-run finds it), and
the title is read from it: ``app.get(job).title``, ``pipelines status``.
"""

from __future__ import annotations

from typing import Any

from pipelines.engine.children import child_job_id
from pipelines.engine.models import JobRecord, JobStatus, Message
from pipelines.engine.phase import PhaseContext

__all__ = ["TITLE_CALL", "start_title", "title_job_id", "title_of"]

TITLE_CALL = "title"
"""The call id the title job hangs off its conversation under."""

_PROMPT = "Give this conversation a title of at most eight words. Reply with the title only."


def start_title(ctx: PhaseContext[Any], namer: Any, messages: list[Message]) -> None:
    """Start the title job of ``ctx``'s conversation once; never raises."""
    from phases.children import start_child

    try:
        first = next((m.get("content") for m in messages if m.get("role") == "user"), "")
        answer = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), "")
        start_child(ctx.env.child_runs(), parent_job=ctx.job_id, call_id=TITLE_CALL, target=namer,
                    run={"user": f"{_PROMPT}\n\nUser: {first}\nAssistant: {answer}"}, per_run=False)
    except Exception as exc:  # noqa: BLE001 - best effort: a title never costs the conversation anything
        ctx.log(f"could not start the title job: {type(exc).__name__}: {exc}", "warn")


def title_of(record: JobRecord, child: JobRecord | None) -> str | None:
    """The conversation's title: stored on it, else the finished title job's answer."""
    if record.title:
        return record.title
    if child is None or child.status is not JobStatus.COMPLETE or child.result is None:
        return None
    result = child.result
    text = result.get("title") if isinstance(result, dict) else result
    return str(text).strip().strip('"')[:200] or None if text is not None else None


def title_job_id(job_id: str) -> str:
    """The id of ``job_id``'s title job."""
    return child_job_id(job_id, TITLE_CALL)
