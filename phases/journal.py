"""The agent turn's journal schema: every key it writes, and typed readers of what is stored under them.

The journal of an open turn (``checkpoint.journal``, plus what a person
supplied in ``checkpoint.inputs``) holds::

    "model"                   the model's answer (a ModelResponse dump)
    "model:structured:<n>"    the structured-output follow-up of attempt n
    "tools:started"           ids of the calls about to run (the ledger's "started")
    "tools:names"             the tools a provider function offered this turn (phases.agent_run)
    "tool:<call id>"          a call's result, as the tool message's content ("done")
    "approval:<call id>"      a person's decision: {"decision", "reason"?, "digest"}
    "view:migration"          a view migration this turn owes: {"from", "to"} (phases.view_migration)

Nothing else in the library spells these keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines.engine.models import JSONValue

__all__ = [
    "MODEL",
    "COMPACTION",
    "TOOLS_NAMES",
    "TOOLS_STARTED",
    "VIEW_MIGRATION",
    "approval_key",
    "model_calls",
    "structured_key",
    "tool_key",
]

MODEL = "model"
TOOLS_STARTED = "tools:started"
TOOLS_NAMES = "tools:names"
COMPACTION = "compaction"  # the summary a compaction asked for before this turn's answer
VIEW_MIGRATION = "view:migration"  # kept by a retry or a wait until the turn's commit lands the new view


def tool_key(call_id: str) -> str:
    return f"tool:{call_id}"


def approval_key(call_id: str) -> str:
    return f"approval:{call_id}"


def structured_key(attempt: int) -> str:
    # Per attempt: a resume after a failed validation asks the model again
    # instead of replaying the answer that failed.
    return f"model:structured:{attempt}"


def model_calls(journal: Mapping[str, JSONValue]) -> list[dict[str, Any]]:
    """The tool calls of the turn's journaled model answer (empty when there is none)."""
    answer = journal.get(MODEL)
    message = answer.get("message") if isinstance(answer, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [dict(c) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
