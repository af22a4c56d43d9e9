"""A run's timeline from its committed events: one row per turn with its queue wait, model time, tools and cost.

Read from ``app.events`` only (the durable log a commit writes): a turn's
events carry the times its steps were journaled, so the spans are the ones of
the attempt that committed. Earlier attempts of a turn (a transient model error
retried later) show as the retries before it. Drawn as SVG rectangles (no
inline style: the page's CSP forbids it), all rows on one time scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.engine.models import Event

__all__ = ["Span", "TimelineTurn", "timeline"]

WIDTH = 1000  # the SVG's user units across
# What explains a turn that reused a model answer journaled by an earlier attempt: it waited (a person, a
# child run, a pause) or was retried. Without one of these, the earlier attempt was abandoned: its worker was
# lost or fenced off before it could commit.
_WAITED = frozenset({"retry_scheduled", "approval_requested", "job_waiting", "call_approved", "call_rejected",
                     "children_finished", "job_paused", "job_resumed", "job_retried", "job_continued"})
_READY = frozenset({"job_started", "turn_committed", "call_approved", "call_rejected", "job_retried", "job_resumed",
                    "job_continued", "children_finished", "job_forked"})


@dataclass
class Span:
    kind: str  # "retry" (a failed attempt's backoff), "wait" (queued while due), "model", "tool"
    label: str
    start: float
    end: float
    error: bool = False
    x: int = 0
    width: int = 0

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class TimelineTurn:
    n: int
    start: float
    end: float | None = None
    attempt: int = 0
    retries: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    cost: float = 0.0
    tokens: int = 0
    first_message: int | None = None
    waited: bool = False  # a wait or a retry came between the turn's first attempt and this one
    reused: bool = False  # the model's answer was journaled by an earlier attempt

    @property
    def abandoned(self) -> bool:
        """An earlier attempt answered and never committed, with no wait or retry to explain it: its worker
        was lost or fenced off."""
        return self.reused and not self.waited

    @property
    def seconds(self) -> float:
        return 0.0 if self.end is None else max(0.0, self.end - self.start)

    def span(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]


def timeline(events: Sequence[Event]) -> list[TimelineTurn]:
    """The turns of ``events`` (oldest first), their spans placed on one scale of :data:`WIDTH` units."""
    turns: dict[int, TimelineTurn] = {}
    ready: float | None = None
    retries: list[str] = []
    backoff: list[Span] = []
    calls: dict[str, str] = {}
    answered = 0.0
    waited = False
    for e in events:
        data: dict[str, Any] = e.data if isinstance(e.data, dict) else {}
        waited = waited or e.type in _WAITED
        if e.type == "retry_scheduled":
            retries.append(str(data.get("reason") or "retried"))
            ready = e.timestamp + float(data.get("delay") or 0)
            backoff.append(Span("retry", f"attempt failed, retried: {retries[-1]}", e.timestamp, ready, error=True))
        elif e.type == "turn_started" and e.turn is not None:
            turn = turns[e.turn] = TimelineTurn(n=e.turn, start=e.timestamp, attempt=int(data.get("attempt") or 0),
                                        retries=retries, waited=waited)
            waited = False
            turn.spans.extend(backoff)
            retries, backoff = [], []
            if ready is not None and ready < e.timestamp:
                turn.spans.append(Span("wait", "queue", ready, e.timestamp))
            answered = e.timestamp
        elif e.turn in turns:
            answered = _within(turns[e.turn], e, data, calls, answered)
        if e.type == "turn_committed":
            waited = False
        if e.type in _READY:
            ready = e.timestamp
    rows = sorted(turns.values(), key=lambda t: t.n)
    _place(rows)
    return rows


def _within(turn: TimelineTurn, e: Event, data: dict[str, Any], calls: dict[str, str], answered: float) -> float:
    """Add one event of a started turn; returns when the model answered (where the tools' spans begin)."""
    if e.type == "model_response" and data.get("reused"):  # no model call in this attempt: nothing to draw
        turn.reused, answered = True, turn.start
        turn.cost += float(data.get("cost_usd") or 0)
        turn.tokens += int(data.get("prompt_tokens") or 0) + int(data.get("completion_tokens") or 0)
    elif e.type == "model_response":
        answered = e.timestamp
        turn.spans.append(Span("model", "model", turn.start, e.timestamp))
        turn.cost += float(data.get("cost_usd") or 0)
        turn.tokens += int(data.get("prompt_tokens") or 0) + int(data.get("completion_tokens") or 0)
    elif e.type == "tool_call":
        calls[str(data.get("call_id"))] = str(data.get("tool") or "?")
    elif e.type == "tool_result":
        call_id = str(data.get("call_id"))
        turn.spans.append(Span("tool", calls.get(call_id, str(data.get("tool") or "?")), answered,
                               e.timestamp, error=bool(data.get("error"))))
    elif e.type == "turn_committed":
        turn.end = e.timestamp
        first = (data.get("messages") or [None])[0]
        turn.first_message = first if isinstance(first, int) else None
    return answered


def _place(rows: list[TimelineTurn]) -> None:
    spans = [s for t in rows for s in t.spans]
    if not spans:
        return
    low = min(s.start for s in spans)
    high = max([s.end for s in spans] + [t.end for t in rows if t.end is not None])
    scale = WIDTH / (high - low) if high > low else 0.0
    for s in spans:
        s.x = round((s.start - low) * scale)
        s.width = max(2, round(s.seconds * scale))  # a span too short to see still shows as a sliver
