"""Helpers the streaming tests share: drive a job to its end, and read each turn's committed text."""

from __future__ import annotations

from pipelines.app import App


def run_to_the_end(app: App, job_id: str) -> None:
    """Advance ``job_id`` in this thread until it stops running (for tests whose queue nothing consumes)."""
    while app.get(job_id).status.value == "running":
        app.advance(job_id)


def committed_texts(app: App, job_id: str) -> dict[int, str]:
    """Each turn's assistant text as the transcript holds it, by turn number from 1: what a stream must match."""
    msgs = [m for m in app.messages(job_id) if m["role"] == "assistant"]
    return {i + 1: m.get("content") or "" for i, m in enumerate(msgs)}
