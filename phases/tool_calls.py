"""Tool calls as the model sent them, made safe to journal: well-formed, with ids unique in the transcript.

The agent turn passes every model answer through :func:`normalise_tool_calls`
before the answer is journaled (step ``model``). The ids it settles on key the
journal (``tool:<id>``), the idempotency key and the tool messages, and the
assistant message carries the same ids, so the model always sees each call
answered under its own id; a re-run after a crash replays the journaled,
already fixed answer.

* ``tool_calls`` that is not a list (one dict, a string, ...) is refused with
  :class:`~pipelines.errors.PermanentModelError` naming it: a model adapter
  that answers so is broken, and guessing what it meant would hide that.
* A call that is not a dict, or whose ``function`` is not one, becomes a call
  naming no tool; its tool message is an error the model reads.
* ``arguments`` that are not a string become their JSON text (a dict is
  what the model meant and runs; ``123`` or a list gets an argument error),
  so the transcript stays valid for the provider on the next call.
* An empty (or null) ``tool_calls`` is taken out of the message: providers
  refuse ``"tool_calls": []`` in the transcript they are sent back.
* A missing, non-string or repeated id (within the answer or anywhere earlier
  in the transcript) gets a new one, chosen deterministically and never equal
  to any id the answer or the transcript already holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Set
from typing import Any

from pipelines.engine.errors import PermanentModelError
from pipelines.engine.models import Message

__all__ = ["call_ids", "check_tool_calls", "normalise_tool_calls"]


def check_tool_calls(raw: Any) -> list[Any]:
    """The calls of an answer's ``tool_calls`` (``None``: none); anything but a list raises, naming the field.

    A dict or a string is not coerced: ``list()`` would make a dict its keys and a string its
    characters, and wrapping one bare call hides the adapter bug that produced it.
    """
    if raw is None:
        return []
    if not isinstance(raw, list | tuple):
        raise PermanentModelError(f"the model answered tool_calls as a {type(raw).__name__} ({raw!r:.80}); "
                                  "expected a list of calls (OpenAI chat format), even for one call")
    return list(raw)


def normalise_tool_calls(message: Message, turn: int, history: Iterable[Message] = (), *,
                         taken: Set[str] | None = None) -> Message:
    """``message`` with its ``tool_calls`` well-formed and their ids unique in ``history`` + this answer.

    ``taken``: the ids ``history`` holds (``call_ids(history)``), when the
    caller keeps them; then ``history`` is not read. Deterministic: the same
    answer after the same history gives the same ids. A message without tool
    calls is returned as it is (an empty or null ``tool_calls`` taken out); ``tool_calls`` that is not a list raises
    :class:`~pipelines.errors.PermanentModelError` (see :func:`check_tool_calls`).
    """
    items = check_tool_calls(message.get("tool_calls"))
    if not items:
        # ``"tool_calls": []`` (or null) is dropped: OpenAI refuses an assistant message with an empty list when
        # the transcript is sent back on the next call.
        return {k: v for k, v in message.items() if k != "tool_calls"} if "tool_calls" in message else message
    calls = [_well_formed(item) for item in items]
    ids = _unique_ids([item.get("id") if isinstance(item, Mapping) else None for item in items],
                      turn, call_ids(history) if taken is None else taken)
    for call, call_id in zip(calls, ids, strict=True):
        call["id"] = call_id
    return {**message, "tool_calls": calls}


def _well_formed(item: Any) -> dict[str, Any]:
    """A call with ``type``, ``function.name`` (str) and ``function.arguments`` (str); other fields kept."""
    if not isinstance(item, Mapping):
        # Nothing to run: a call naming no tool gets the "names no tool" error.
        return {"type": "function", "function": {"name": "", "arguments": _json_text(item)}}
    call = dict(item)
    call.setdefault("type", "function")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        call["function"] = {"name": "", "arguments": _json_text(fn)}
        return call
    fn = dict(fn)
    if not isinstance(fn.get("name"), str):
        fn["name"] = ""
    args = fn.get("arguments")
    if args is None:
        fn["arguments"] = "{}"  # what a call without arguments means, as providers expect it: a string
    elif not isinstance(args, str):
        fn["arguments"] = _json_text(args)
    call["function"] = fn
    return call


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(repr(value), ensure_ascii=False)
    except RecursionError:  # nested deeper than anything can write (repr too): say so, for the model to fix
        return json.dumps("(arguments nested too deeply to write)")


def call_ids(messages: Iterable[Message]) -> set[str]:
    """The tool call ids ``messages`` hold (what a new call's id must not repeat)."""
    # Plain type checks, one comprehension: the agent turn runs it over each turn's new messages.
    return {c["id"] for m in messages if type(m) is dict and type(calls := m.get("tool_calls")) is list
            for c in calls if type(c) is dict and type(c.get("id")) is str}


def _unique_ids(given: list[Any], turn: int, earlier: Set[str]) -> list[str]:
    """Keep each usable id the first time it appears; give every other call a fresh one."""
    kept: list[str | None] = []
    # This answer's ids beside the transcript's: ``earlier`` is the whole transcript's set, not copied per turn.
    taken: set[str] = set()
    for cid in given:
        ok = isinstance(cid, str) and cid != "" and cid not in earlier and cid not in taken
        kept.append(cid if ok else None)
        if ok:
            taken.add(cid)
    # A fresh id must not equal any id in the answer, even one kept further on.
    taken.update(c for c in given if isinstance(c, str))
    out: list[str] = []
    for i, (cid, orig) in enumerate(zip(kept, given, strict=True)):
        if cid is None:
            base = orig if isinstance(orig, str) and orig else f"call_{turn}_{i}"
            cid, n = base, 1
            while cid in earlier or cid in taken:
                n += 1
                cid = f"{base}_{n}"
            taken.add(cid)
        out.append(cid)
    return out
