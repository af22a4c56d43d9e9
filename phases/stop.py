"""Stop conditions for the agent loop, combinable in a list (any one stops the agent).

The default stop — the model answered without tool calls — always applies;
``max_turns`` and an answer cut short (``finish_reason`` ``"length"`` or ``"content_filter"``,
see :func:`cut_short`) stop too.
A stop condition is any callable ``fn(turn: TurnInfo) -> bool``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message, Usage

__all__ = ["CUT_REASON", "CUT_WHY", "StopCondition", "TurnInfo", "cut_short", "has_tool_call", "max_turns",
           "should_stop"]

CUT_REASON: Final[Mapping[str, str]] = {"length": "truncated", "content_filter": "content_filter"}
"""A ``finish_reason`` that cut the model's answer short, and the run's ``stop_reason`` when it does."""

CUT_WHY: Final[Mapping[str, str]] = {"length": "truncated",
                                     "content_filter": "stopped by the provider's content filter"}
"""The same, as the run's log and the calls' tool messages say it."""


def cut_short(finish_reason: str | None) -> str | None:
    """``finish_reason`` if it cut the answer short (its tool calls are not run, the run stops), else ``None``.

    ``length``: the answer hit the token limit; ``content_filter``: the provider's filter stopped it. Either way
    the text may end mid-sentence and the calls' arguments mid-value, so nothing of it is acted on.
    """
    return finish_reason if finish_reason in CUT_REASON else None


@dataclass(frozen=True)
class TurnInfo:
    """What a stop condition sees after a turn."""

    turn: int  # turns completed in this run, this one included (1-based)
    message: Message  # the assistant message of this turn
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[Message] = field(default_factory=list)
    state: Any = None
    usage: Usage = field(default_factory=Usage)  # this turn's usage

    def called(self, name: str) -> bool:
        return any((c.get("function") or {}).get("name") == name for c in self.tool_calls)


StopCondition = Callable[[TurnInfo], bool]


def has_tool_call(name: str) -> StopCondition:
    """Stop after a turn in which the model called tool ``name`` (its result is still recorded)."""

    def cond(turn: TurnInfo) -> bool:
        return turn.called(name)

    cond.__name__ = f"has_tool_call({name!r})"
    return cond


def max_turns(n: int) -> StopCondition:
    """Stop once ``n`` turns have run."""
    if not isinstance(n, int) or n <= 0:
        raise InvalidInputError(f"max_turns needs a positive int, got {n!r}")

    def cond(turn: TurnInfo) -> bool:
        return turn.turn >= n

    cond.__name__ = f"max_turns({n})"
    return cond


def should_stop(conditions: StopCondition | Sequence[StopCondition] | None, turn: TurnInfo) -> str | None:
    """The name of the first condition that holds, or ``None``."""
    if conditions is None:
        return None
    conds = [conditions] if callable(conditions) else list(conditions)
    for cond in conds:
        if cond(turn):
            return getattr(cond, "__name__", repr(cond))
    return None
