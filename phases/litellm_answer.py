"""What LiteLLMModel keeps of a provider's answer: the message as plain JSON, the usage and cost, the response.

Kept apart from :mod:`phases.litellm_model` (the call and its retries). Token counts are the provider's,
made whole numbers >= 0: a negative one would undo a job's budgets.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from pipelines.engine.models import Message, Usage

__all__ = ["RAW_LIMIT", "mark_unnamed_calls", "mended", "plain_message", "raw_response", "unmarked", "usage_of"]


def _litellm() -> Any:
    from phases.litellm_model import _litellm as configured  # the one configured import of litellm

    return configured()


def usage_of(response: Any) -> Usage:
    """One paid call's :class:`Usage` from a whole response, priced by litellm (unknown price: counted as such)."""
    usage = getattr(response, "usage", None)
    try:
        cost = float(_litellm().completion_cost(completion_response=response) or 0.0)
        known = math.isfinite(cost)
    except Exception:  # noqa: BLE001 - completion_cost raises for any model missing from its price list
        cost, known = 0.0, False
    return Usage(
        prompt_tokens=_count(getattr(usage, "prompt_tokens", 0)),
        completion_tokens=_count(getattr(usage, "completion_tokens", 0)),
        cost_usd=max(cost, 0.0) if known else 0.0,
        model_calls=1,
        unknown_cost_calls=0 if known else 1,
    )


def _count(value: Any) -> int:
    """A token count as a provider reported it: a whole number >= 0 (a negative or odd one would undo budgets)."""
    try:
        return max(int(value or 0), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


RAW_LIMIT = 4096
"""Characters of a provider's response (without the message) kept for the model-call view; past it, its keys."""


def raw_response(response: Any, redact: Callable[[str], str] = str) -> dict[str, Any] | None:
    """The provider's response without the message (kept apart as the answer): JSON, at most :data:`RAW_LIMIT`.

    litellm's ``model_dump`` holds what the provider sent back (private fields such as the request's
    address are not in it); ``None`` and empty values are dropped, and a response too large to keep (a provider's
    own fields can be anything) is kept as the list of its keys.
    """
    if not hasattr(response, "model_dump"):
        return None
    try:
        data = response.model_dump(mode="json", exclude_none=True, warnings=False)
    except Exception:  # noqa: BLE001 - the view's extra: never fail a turn over it
        return None
    if not isinstance(data, dict):
        return None
    data = {k: v for k, v in data.items() if v not in ({}, [])}  # litellm's empty placeholders say nothing
    data["choices"] = [{k: v for k, v in c.items() if k != "message" and v not in ({}, [])}
                       for c in data.get("choices") or [] if isinstance(c, dict)]
    # A provider may echo what it was sent (a key, a header) in a field of its own: masked as in error messages.
    text = redact(json.dumps(data, default=str))
    if len(text) > RAW_LIMIT:
        return {"truncated": f"{len(text)} characters, more than the {RAW_LIMIT} kept", "keys": sorted(map(str, data))}
    try:
        plain: dict[str, Any] = json.loads(text)
    except ValueError:  # a mask cut through an escape in a value: kept as its keys, as a response too large
        return {"truncated": "not kept: masking a secret in it left no JSON", "keys": sorted(map(str, data))}
    return plain


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def mended(value: Any) -> Any:
    """``value`` (plain JSON) with every lone surrogate in its strings made U+FFFD: a provider's ``"\\ud83d"`` is
    no text UTF-8 (or storage) can hold, and the answer around it is worth keeping."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value) if not value.isascii() else value
    if isinstance(value, dict):
        return {mended(k): mended(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mended(v) for v in value]
    return value


def plain_message(message: Any) -> Message:
    """The assistant message as plain JSON, provider fields kept, ``None`` values dropped."""
    if hasattr(message, "model_dump"):
        # warnings=False: litellm's models trip pydantic serializer warnings on
        # some provider shapes, and the suite turns warnings into errors.
        data = message.model_dump(mode="json", exclude_none=True, warnings=False)
    else:
        data = {k: v for k, v in dict(message).items() if v is not None}
    data.setdefault("role", "assistant")
    plain: Message = mended(json.loads(json.dumps(data, default=str)))
    return plain


# A tool call's id and name as placeholders while litellm builds the answer: a NUL no provider's id or name holds.
_NO_ID = "\x00phaserunner:no-id"
_NO_NAME = "\x00phaserunner:no-name"


def mark_unnamed_calls(chunks: list[Any]) -> None:
    """Give each streamed tool call that came without an id (or a name) a placeholder one, in place.

    ``stream_chunk_builder`` leaves out any call none of whose chunks carried an id and a name: an
    answer that asked for a tool (``finish_reason="tool_calls"``) became one with no call, the tool
    never ran and the job ended with no result. The placeholders make it keep the call; :func:`unmarked`
    takes them off again, so the call is the one a plain (unstreamed) answer gives: the agent turn then
    gives it a fresh id (``phases.tool_calls``) and, nameless, answers it with a "names no tool" error.
    """
    first: dict[tuple[Any, Any], Any] = {}  # (choice, call index) -> the call's first chunk piece
    named: set[tuple[Any, Any]] = set()
    with_id: set[tuple[Any, Any]] = set()
    for chunk in chunks:
        for choice in getattr(chunk, "choices", None) or ():
            for call in getattr(getattr(choice, "delta", None), "tool_calls", None) or ():
                function = _field(call, "function")
                if not call or function is None:
                    continue  # litellm's builder skips it too
                key = (getattr(choice, "index", 0), _field(call, "index", 0))  # litellm's key of a call
                first.setdefault(key, call)
                if _field(call, "id"):
                    with_id.add(key)
                if _field(function, "name"):
                    named.add(key)
    for key, call in first.items():
        if key not in with_id:
            _set_field(call, "id", _NO_ID)
        if key not in named:
            _set_field(_field(call, "function"), "name", _NO_NAME)


def _field(item: Any, name: str, default: Any = None) -> Any:
    """A field of a chunk's piece, which litellm gives as a dict or as an object."""
    return item.get(name, default) if isinstance(item, dict) else getattr(item, name, default)


def _set_field(item: Any, name: str, value: str) -> None:
    if isinstance(item, dict):
        item[name] = value
    else:
        setattr(item, name, value)


def unmarked(message: Message) -> Message:
    """The built message without the placeholders of :func:`mark_unnamed_calls` (an empty ``tool_calls`` is
    taken out of every answer, streamed or not, by :func:`phases.tool_calls.normalise_tool_calls`)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return message
    fixed = []
    for call in calls:
        if isinstance(call, dict) and call.get("id") == _NO_ID:
            call = {k: v for k, v in call.items() if k != "id"}  # as a plain answer's call without one
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name") == _NO_NAME:
            call = {**call, "function": {**function, "name": ""}}
        fixed.append(call)
    return {**message, "tool_calls": fixed}
