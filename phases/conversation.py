"""The conversation an agent run continues: the pinned system prompt and the messages the model sees.

A new conversation stores the agent's resolved system prompt as its first
transcript message (the *pin*). Later runs on the same job id reuse it, so a
deploy that changes the prompt in code does not change a conversation in
flight. The caller's own system messages never enter the transcript (they are
dropped at the start of the run, with a warning), so exactly one system
message reaches the model: never stacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message

__all__ = ["DROPPED_KEY", "SystemPromptConflict", "check_conflict_mode", "model_messages", "pinned_prompt",
           "start_messages", "system_warnings"]

SystemPromptConflict = Literal["keep", "use-current"]
"""``keep`` (default): a pinned prompt wins over the agent's current one; ``use-current``: this run uses the
current prompt (the pin itself is never rewritten)."""

DROPPED_KEY = "_dropped_system"
"""Internal per-run option: how many system messages the caller gave (dropped at start, warned at turn 1)."""


def check_conflict_mode(value: Any) -> SystemPromptConflict:
    """``value`` as a :data:`SystemPromptConflict`, else :class:`InvalidInputError`."""
    if value not in ("keep", "use-current"):
        raise InvalidInputError(f"system_prompt_conflict must be 'keep' or 'use-current', got {value!r}")
    return value  # type: ignore[no-any-return]


def start_messages(messages: Sequence[Message], *, system: str | None,
                   new_conversation: bool) -> tuple[list[Message], int]:
    """The messages a run appends, and how many caller system messages were dropped from them.

    On a new conversation with a system prompt, the prompt comes first: the pin.
    """
    kept = [m for m in messages if m.get("role") != "system"]
    dropped = len(messages) - len(kept)
    if new_conversation and system:
        kept.insert(0, {"role": "system", "content": system})
    return kept, dropped


def pinned_prompt(past: Sequence[Message]) -> str | None:
    """The conversation's pinned system prompt, or ``None`` (a conversation older than pins, or none set)."""
    if past and past[0].get("role") == "system" and isinstance(past[0].get("content"), str):
        return str(past[0]["content"])
    return None


def model_messages(past: Sequence[Message], *, system: str | None, conflict: SystemPromptConflict) -> list[Message]:
    """What the model is sent: one system message (pinned, or the current one), then the rest without system."""
    pin = pinned_prompt(past)
    rest = [m for m in (past[1:] if pin is not None else past) if m.get("role") != "system"]
    prompt = pin if pin is not None and conflict == "keep" else system
    if pin is not None and conflict == "use-current" and system is None:
        prompt = None
    return ([{"role": "system", "content": prompt}] if prompt else []) + rest


def system_warnings(past: Sequence[Message], *, system: str | None, conflict: SystemPromptConflict,
                    suppress: bool, dropped: int) -> list[str]:
    """The warnings a run's first turn logs (``warn``) and emits (``agent_warning``)."""
    out = []
    if dropped:
        out.append(f"dropped {dropped} system message(s) given with the run: the agent's system prompt is the "
                   "only one the model sees")
    pin = pinned_prompt(past)
    if pin is not None and pin != (system or "") and not suppress and conflict == "keep":
        out.append("this conversation's pinned system prompt differs from the agent's current one; the pinned "
                   "prompt is kept (system_prompt_conflict='use-current' uses the current one for a run; "
                   "suppress_system_prompt_conflict_warning=True silences this)")
    return out
