"""One tool call as the model wrote it: its tool, its arguments' digest, its answer, and what its tool is handed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from phases.tools import Tool, ToolContext
from pipelines.engine.models import Message
from pipelines.engine.phase import PhaseContext

__all__ = ["arguments_digest", "tool_context", "tool_message"]


def tool_message(call: Mapping[str, Any], content: str) -> Message:
    """The tool message answering ``call``."""
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def arguments_digest(call: Mapping[str, Any]) -> str:
    """What an approval is bound to: the call's tool name and exact arguments text."""
    fn = _function(call)
    text = json.dumps([fn.get("name"), fn.get("arguments")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def tool_context(ctx: PhaseContext[Any], call_id: str, name: str, turn: int) -> ToolContext:
    """What the tool ``name`` is handed for call ``call_id``: its run's context and the App's environment."""
    scope, run = ctx.tool_scope, ctx.checkpoint.transcript_epoch
    if scope is None:
        return ToolContext(job_id=ctx.job_id, call_id=call_id, tool_name=name, turn=turn, env=ctx.env, run=run)
    return ToolContext(job_id=ctx.job_id, call_id=call_id, tool_name=name, turn=turn, context=scope.context,
                       tool_context=scope.tool_contexts.get(name), env=ctx.env, run=run)


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = call.get("function")
    return fn if isinstance(fn, Mapping) else {}


def _tool_of(tmap: dict[str, Tool], call: Mapping[str, Any]) -> Tool | None:
    name = _function(call).get("name")
    return tmap.get(name) if isinstance(name, str) else None


def _is_async(tmap: dict[str, Tool], call: Mapping[str, Any]) -> bool:
    t = _tool_of(tmap, call)
    return t is not None and t.is_async


def _policy(tmap: dict[str, Tool], call: Mapping[str, Any]) -> str:
    t = _tool_of(tmap, call)
    return "retry" if t is None else t.on_interrupted
