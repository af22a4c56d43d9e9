"""One tool call as the model wrote it: its tool, its arguments' digest, its answer, and what its tool is handed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from phases import journal
from phases.tools import Tool, ToolContext
from pipelines.engine import models
from pipelines.engine.errors import ValueTooLargeError
from pipelines.engine.models import Message
from pipelines.engine.phase import PhaseContext

__all__ = ["arguments_digest", "check_message_size", "journal_result", "storable_result", "tool_context",
           "tool_message"]


def tool_message(call: Mapping[str, Any], content: str) -> Message:
    """The tool message answering ``call``."""
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def journal_result(ctx: PhaseContext[Any], call: Mapping[str, Any], content: str, before_commit: bool = False) -> None:
    """Journal a call's result; one storage cannot keep (too large) becomes an error the model reads instead.

    The tool ran: failing the job here would leave a retry to run it again. Its result is lost, the
    model is told so, and the turn goes on.
    """
    key = journal.tool_key(call["id"])
    content = storable_result(call, content)
    try:
        ctx.record(key, content, before_commit=before_commit)
    except ValueTooLargeError as exc:
        ctx.record(key, _unkept(call, exc), before_commit=before_commit)


def storable_result(call: Mapping[str, Any], content: str) -> str:
    """``content``, or the error the model reads instead when its tool message is too large to store.

    Also applied to a result read back from the journal: one an earlier version journaled (it checked only the
    step) would otherwise fail the turn's commit on every resume.
    """
    if not isinstance(content, str):  # not a result this runner journals (the journal's values are any JSON)
        return content
    try:
        check_message_size(call, content)
    except ValueTooLargeError as exc:
        return _unkept(call, exc)
    return content


def _unkept(call: Mapping[str, Any], exc: ValueTooLargeError) -> str:
    return f"Error: tool {_function(call).get('name')!r} ran, but its result could not be kept: {exc}. Ask for less."


def check_message_size(call: Mapping[str, Any], content: str) -> None:
    """Raise :class:`ValueTooLargeError` if the result fits a value and its tool message does not.

    The journal step holds the bare result, the transcript its tool message (role, call id and all): a result
    just under the limit fitted the step and not the message, so the turn's commit failed, and a resumed job
    replayed the journaled result into the same failure, every time. A result over the limit on its own is
    left to the storage: one that keeps large values elsewhere (``OffloadingStorage``) keeps its step and its
    message alike, and any other refuses the step (the model is then told, see :func:`journal_result`).
    """
    # JSON takes at most 6 bytes a character (a \u escape): a result far enough below the limit is not encoded.
    limit = models.MAX_VALUE_BYTES
    if (len(content) + len(str(call["id"]))) * 6 + 256 <= limit:
        return
    message = models.encode_plain(tool_message(call, content))
    if len(message.encode()) > limit and len(models.encode_plain(content).encode()) <= limit:
        # The step would take it, the commit would not.
        models.check_size(message, f"the tool message answering call {str(call['id'])[:80]!r}")


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
