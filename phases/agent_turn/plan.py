"""What an agent turn is set up with: its phase name and state, the model it calls, and the plan a hook may change."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from phases.model import Model
from phases.tools import Tool
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message

__all__ = ["TURN_PHASE", "AgentState", "PrepareTurn", "TurnPlan", "resolve_model"]

TURN_PHASE = "turn"


class AgentState(BaseModel):
    """The small per-job state of an agent run (the transcript lives apart from it)."""

    turn: int = 0  # turns completed in this run


def resolve_model(model: str | Model, params: Mapping[str, Any] | None) -> Model:
    """A litellm model string becomes a ``LiteLLMModel``; a ``Model`` object is used as it is."""
    if isinstance(model, str):
        if not model:
            raise InvalidInputError("model must be a litellm model string like 'openai/gpt-4o-mini' or a Model")
        # Imported here, not at module top: `import phases` must stay light.
        # (LiteLLMModel itself imports litellm only at its first call.)
        module = importlib.import_module("phases.litellm_model")
        built: Model = module.LiteLLMModel(model, params=dict(params or {}))
        return built
    if not callable(getattr(model, "complete", None)):
        raise InvalidInputError(f"model must be a litellm model string or have complete(), got {type(model).__name__}")
    return model


@dataclass
class TurnPlan:
    """What one turn will send; a ``prepare_turn`` hook may change it for this turn only.

    ``tools`` may be narrowed to a subset of the agent's tools (the agent's
    tools are the universe: a replay after a crash must find them by name).
    """

    job_id: str
    turn: int
    model: str | Model
    params: dict[str, Any]
    tools: list[Tool]
    messages: list[Message]


PrepareTurn = Callable[[TurnPlan], "TurnPlan | None"]
