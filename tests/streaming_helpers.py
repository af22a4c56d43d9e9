"""Helpers the streaming tests share: drive a job to its end, and read each turn's committed text."""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.app import App
from pipelines.engine.models import Event
from pipelines.streams import turn_texts


def run_to_the_end(app: App, job_id: str) -> None:
    """Advance ``job_id`` in this thread until it stops running (for tests whose queue nothing consumes)."""
    while app.get(job_id).status.value == "running":
        app.advance(job_id)


def committed_texts(app: App, job_id: str) -> dict[int, str]:
    """Each turn's assistant text as the transcript holds it, by turn number from 1: what a stream must match."""
    msgs = [m for m in app.messages(job_id) if m["role"] == "assistant"]
    return {i + 1: m.get("content") or "" for i, m in enumerate(msgs)}


def followed_texts_match(app: App, job_id: str, parts: Sequence[Event]) -> bool:
    """A follower's texts agree with the transcript: every turn it has text for, and the last turn at least.

    On Redis and SQLite the live stream keeps the run in flight and the one before, so a follower that fell
    behind into an older run gets that run's events but not its text (the transcript holds it); on memory it
    gets every turn.
    """
    texts, committed = turn_texts(list(parts)), committed_texts(app, job_id)
    return bool(texts) and max(texts) == max(committed) and all(committed.get(t) == text for t, text in texts.items())
