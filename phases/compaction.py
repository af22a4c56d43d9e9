"""Compaction: a long conversation's older turns are summarised for the model; the transcript keeps them all.

``Agent(compaction=Compaction(max_tokens=8000, keep_recent=8))``: before a
turn whose model view would pass ``max_tokens`` (estimated: litellm's counter
is not needed for a threshold; ~4 characters a token), a journaled step asks
the model to summarise everything but the ``keep_recent`` latest messages, and
a *marker* message recording that summary and the range it covers is appended
to the transcript. The model then sees the pinned system prompt, the summary,
and the messages after the range. The stored transcript stays append-only and
complete: the view is rebuilt from it exactly (the latest marker wins), so
fork and replay stay deterministic, and a crash during compaction reuses the
journaled summary instead of asking twice. A cut never separates a tool call
from its result.

The same marker records a *view migration* (:mod:`phases.view_migration`):
``{"upto": n, "view": [...], "version": v}`` replaces the whole view of the
messages before it with ``view``. One mechanism, one rule: the latest marker
wins, and what follows it is kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message

__all__ = ["MARKER_KEY", "Compaction", "compacted_view", "estimate_tokens", "find_cut", "marker", "view_marker"]

MARKER_KEY = "phaserunner_compaction"
"""The key a marker message carries: ``{"upto": <index>}`` for a compaction (its content is the summary), or
``{"upto": <index>, "view": [...], "version": v}`` for a view migration."""

DEFAULT_PROMPT = ("Summarise the conversation so far for your own later use: the user's goals, facts learned, "
                  "tool results that matter, decisions made and anything still open. Be complete but brief.")


@dataclass(frozen=True)
class Compaction:
    """When and how to compact: past ``max_tokens`` in the model view, keeping ``keep_recent`` messages."""

    max_tokens: int
    keep_recent: int = 8
    prompt: str = DEFAULT_PROMPT

    def __post_init__(self) -> None:
        for name, value in (("max_tokens", self.max_tokens), ("keep_recent", self.keep_recent)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidInputError(f"Compaction.{name} must be a positive int, got {value!r}")
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise InvalidInputError("Compaction.prompt must be a non-empty string")


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A cheap estimate of a model view's size (about 4 characters a token)."""
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) // 4 + 1


def marker(summary: str, upto: int) -> Message:
    """The transcript message that records a compaction: the summary of messages ``[..upto)``."""
    return {"role": "user", "content": f"(Summary of the earlier conversation)\n{summary}", MARKER_KEY: {"upto": upto}}


def view_marker(view: Sequence[Message], upto: int, version: str) -> Message:
    """The transcript message that records a view migration to ``version``: ``view`` replaces ``[..upto)``."""
    return {"role": "user", "content": f"(The model's view of the conversation was migrated to version {version})",
            MARKER_KEY: {"upto": upto, "view": list(view), "version": version}}


def compacted_view(past: Sequence[Message]) -> list[Message]:
    """The conversation as the model sees it: the latest marker's replacement in place of what it covers.

    A compaction's summary stands for the messages it covers; a view
    migration's recorded view stands for all of them. The pinned system prompt
    (a leading ``system`` message, or the one the latest view migration put
    there) always stays; markers themselves are never sent with their
    bookkeeping key.
    """
    last = _latest_marker(past, len(past))
    if last is None:
        return list(past)
    info = past[last][MARKER_KEY]
    kept = [m for m in past[int(info["upto"]):] if MARKER_KEY not in m]
    if "view" in info:
        return [*info["view"], *kept]
    summary = {k: v for k, v in past[last].items() if k != MARKER_KEY}
    return [*_head(past, last), summary, *kept]


def _latest_marker(past: Sequence[Message], before: int) -> int | None:
    return next((i for i in range(before - 1, -1, -1) if MARKER_KEY in past[i]), None)


def _head(past: Sequence[Message], before: int) -> list[Message]:
    """The pinned system prompt as the view saw it before index ``before`` (a view migration may re-pin it)."""
    for i in range(before - 1, -1, -1):
        info = past[i].get(MARKER_KEY)
        if isinstance(info, dict) and "view" in info:
            view = info["view"]
            return [view[0]] if view and view[0].get("role") == "system" else []
    return [past[0]] if past and past[0].get("role") == "system" else []


def find_cut(past: Sequence[Message], keep_recent: int) -> int | None:
    """Where a new compaction ends: keep ``keep_recent`` messages, never split a call from its results.

    ``None`` when there is nothing worth summarising beyond the last compaction.
    """
    cut = len(past) - keep_recent
    while 0 < cut < len(past) and past[cut].get("role") == "tool":
        cut -= 1  # the assistant message with the calls stays with its results
    start = next((i + 1 for i in range(len(past) - 1, -1, -1) if MARKER_KEY in past[i]), 0)
    floor = max(start, 1 if past and past[0].get("role") == "system" else 0)
    return cut if cut > floor else None


def summary_request(view_before: Sequence[Message], prompt: str) -> list[Message]:
    """What the summarising call sends: the view of what is being compacted, then the instruction."""
    return [*view_before, {"role": "user", "content": prompt}]


Summarise = Callable[[list[Message]], Any]
