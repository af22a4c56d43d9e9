"""Workload W1 (DESIGN.md "Benchmark workload W1"), shared by every benchmark.

One job = ``T`` turns. Turn ``k < T - 1`` (0-based): the model answers ~200
bytes of text and one tool call ``add(a=k, b=1)``; the tool returns
``{"sum": k + 1}``. The last turn answers plain text ``"done"``. The model is
stateless: it finds ``k`` by counting the assistant messages it is shown.

Here live the pieces every variant shares: the answer (:func:`answer`), the
tool (:func:`add_impl` and the ``@tool`` :data:`add`), the plain-Python floor
(:func:`floor_job`) and the ``litellm`` mock response (:func:`mock_response`).
"""

from __future__ import annotations

import json
from typing import Any

from pipelines import tool

TEXT = ("Thinking it over: the running total has to go up by exactly one, so I will ask the adder tool "
        "for the next value instead of doing the arithmetic in my head. Calling add with a and b right now, please.")
assert 190 <= len(TEXT) <= 210, len(TEXT)
USER = "Count up with the add tool, one step per turn, then say done."
SYSTEM = "You are a careful counter."


def add_impl(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


@tool
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return add_impl(a, b)


def turn_of(messages: list[dict[str, Any]]) -> int:
    """``k``: how many assistant turns came before (the model is stateless)."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def answer(k: int, turns: int) -> dict[str, Any]:
    """The assistant message of turn ``k`` (0-based) of a ``turns``-turn job."""
    if k >= turns - 1:
        return {"role": "assistant", "content": "done"}
    args = json.dumps({"a": k, "b": 1})
    return {"role": "assistant", "content": TEXT,
            "tool_calls": [{"id": f"call_{k}", "type": "function", "function": {"name": "add", "arguments": args}}]}


def reply_fn(turns: int) -> Any:
    """``fn(messages) -> message`` for :class:`pipelines.testing.ScriptedModel`."""

    def fn(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return answer(turn_of(messages), turns)

    return fn


def floor_job(turns: int, model: Any = None) -> list[dict[str, Any]]:
    """The same W1 loop in plain Python, no persistence: the floor.

    Builds the same messages, calls the same answer function (or ``model(messages)``)
    and the same tool, appends to a list.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": USER}]
    fn = model or reply_fn(turns)
    for _ in range(turns):
        msg = fn([{"role": "system", "content": SYSTEM}, *messages])
        messages.append(msg)
        calls = msg.get("tool_calls") or []
        if not calls:
            break
        for c in calls:
            args = json.loads(c["function"]["arguments"])
            out = add_impl(**args)
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(out)})
    return messages


def mock_response(k: int, turns: int) -> dict[str, Any]:
    """A ModelResponse-like dict for ``litellm.completion(mock_response=...)`` answering turn ``k``."""
    msg = answer(k, turns)
    return {
        "id": f"chatcmpl-w1-{k}",
        "object": "chat.completion",
        "created": 0,
        "model": "x",
        "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if msg.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": 10 * (k + 1), "completion_tokens": 50, "total_tokens": 10 * (k + 1) + 50},
    }
