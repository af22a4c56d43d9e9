"""What a run carries besides its messages: context, per-tool context and tags, checked before anything is written.

``context`` is JSON data for tools (``ToolContext.context``), hooks and
callbacks. It is stored with the job, so any worker can run the next turn,
and it is never put in the transcript nor sent to the model. It is stored in
plain text: **not for secrets** (pass a reference, and let the tool fetch the
secret). ``tools_context`` gives each tool an entry of its own, validated by
the tool's ``context_model`` when it declares one. ``tags`` label a run for
listings (``pipelines jobs --tag``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from phases.tools import Tool
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JSONValue, owned_json_value

__all__ = ["MAX_CONTEXT_BYTES", "MAX_TAGS", "check_context", "check_tags", "check_tools_context",
           "tool_context_of"]

MAX_CONTEXT_BYTES = 64 * 1024
"""The largest ``context`` (and ``tools_context``) a run may carry, as JSON text."""

MAX_TAGS = 32
_TAG = re.compile(r"[^\s\ud800-\udfff]{1,128}")  # a lone surrogate: no storage can keep it (not UTF-8)


def _size(value: JSONValue, what: str) -> None:
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_CONTEXT_BYTES:
        raise InvalidInputError(f"{what} is {size} bytes of JSON, above the {MAX_CONTEXT_BYTES} byte limit "
                                "(phases.run_input.MAX_CONTEXT_BYTES); store large data elsewhere and pass a "
                                "reference")


def check_context(context: Any) -> JSONValue:
    """``context`` in stored form (JSON, within :data:`MAX_CONTEXT_BYTES`), else :class:`InvalidInputError`."""
    # StateNotSerializableError (an InvalidInputError) names it. The engine's own copy: a record a storage
    # keeps as it is must not change when the caller changes the dict it passed (a tool reads it).
    value = owned_json_value(context, what="context")
    _size(value, "context")
    return value


def check_tools_context(entries: Any, tmap: Mapping[str, Tool]) -> dict[str, JSONValue]:
    """``tools_context`` in stored form: one entry per known tool, each valid for its ``context_model``."""
    if not isinstance(entries, Mapping):
        raise InvalidInputError(f"tools_context must be a dict of tool name -> value, got {type(entries).__name__}")
    out: dict[str, JSONValue] = {}
    for name, entry in entries.items():
        t = tmap.get(name) if isinstance(name, str) else None
        if t is None:
            known = ", ".join(sorted(tmap)) or "none"
            raise InvalidInputError(f"tools_context names {name!r}, which is not a tool of this agent; tools: {known}")
        if t.context_model is not None:
            try:
                entry = t.context_model.model_validate(entry).model_dump(mode="json")
            except ValidationError as exc:
                first = exc.errors()[0]
                raise InvalidInputError(f"tools_context[{name!r}] is not a valid {t.context_model.__name__}: "
                                        f"{'.'.join(map(str, first['loc'])) or '(root)'}: {first['msg']}") from None
        out[name] = check_context(entry)
    _size(out, "tools_context")
    return out


def tool_context_of(t: Tool, entries: Mapping[str, JSONValue] | None) -> Any:
    """The tool's own entry: a ``context_model`` instance when it declares one, else the JSON value (or None)."""
    entry = (entries or {}).get(t.name)
    if entry is None or t.context_model is None:
        return entry
    return t.context_model.model_validate(entry)


def check_tags(tags: Any) -> list[str]:
    """``tags`` as a list of distinct strings (1-128 characters, no whitespace), at most :data:`MAX_TAGS`."""
    if isinstance(tags, str) or not isinstance(tags, list | tuple):
        raise InvalidInputError(f"tags must be a list of strings, got {type(tags).__name__}")
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise InvalidInputError(f"tag {tag!r:.60} must be a string of 1-128 characters without whitespace "
                                    "(or a lone surrogate)")
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise InvalidInputError(f"a run takes at most {MAX_TAGS} tags, got {len(out)}")
    return out
