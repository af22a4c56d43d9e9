"""Helpers for testing agents and pipelines offline: ``ScriptedModel``, reply builders, ``crash_test``.

``ScriptedModel`` implements the model seam without any network: give it a
list of canned turns, or a function of the messages. It records every request
in ``calls``, so a test can count model calls per turn.
"""

from __future__ import annotations

import json
import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from phases.model import ModelRequest, ModelResponse, ReadOnlyMessages
from pipelines.crash_harness import (
    CrashPoint,
    CrashReport,
    CrashResult,
    SimulatedCrash,
    crash_test,
    transcript_problems,
)
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message, Usage

__all__ = [
    "CrashPoint",
    "CrashReport",
    "CrashResult",
    "Reply",
    "ScriptedModel",
    "SimulatedCrash",
    "call",
    "crash_test",
    "reply",
    "transcript_problems",
]

Reply = str | Message | ModelResponse
"""A canned turn: plain text, an assistant message dict, or a full ModelResponse."""


def call(name: str, arguments: dict[str, Any] | str | None = None, /, **kwargs: Any) -> dict[str, Any]:
    """A tool call for :func:`reply`: ``call("add", a=1, b=2)`` or ``call("add", '{"a": 1}')``."""
    args = arguments if isinstance(arguments, str) else json.dumps({**(arguments or {}), **kwargs})
    return {"type": "function", "function": {"name": name, "arguments": args}}


def reply(content: str | None = None, *calls: dict[str, Any], **extra: Any) -> Message:
    """An assistant message: text, tool calls, and any provider fields (``reasoning_content=...``)."""
    msg: Message = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [dict(c) for c in calls]
    msg.update(extra)
    return msg


class ScriptedModel(ReadOnlyMessages):
    """A model that answers from a script: ``ScriptedModel(["hi", reply(None, call("add", a=1))])``.

    ``script`` is a list of turns (used in order, shared by every job this
    model serves) or a function ``fn(messages) -> Reply`` (deterministic per
    job). Tool calls without ids get ``call_<turn>_<i>``. ``finish_reason``
    is "tool_calls" when there are calls, else "stop" (or the dict's
    ``finish_reason`` key, which is removed from the message).

    The function is handed the request's messages, which are the agent's own (the model says it changes
    none: :class:`~phases.model.ReadOnlyMessages`): it reads them and changes none in place.
    """

    def __init__(self, script: Sequence[Reply] | Callable[[list[Message]], Reply]) -> None:
        if isinstance(script, str | bytes | dict) or not (callable(script) or isinstance(script, Sequence)):
            # A string is a Sequence too: it would answer one character a turn.
            raise InvalidInputError(f"ScriptedModel takes a list of replies or a function of the messages, got "
                                    f"{type(script).__name__}; one reply is ScriptedModel([{script!r:.40}])")
        self._script = script
        self._next = 0
        self._lock = threading.Lock()
        self.calls: list[ModelRequest] = []
        # Per job: the last request's messages and their prompt size, so an agent turn's request that
        # extends them measures only what it adds (the usage reported grows with the history; its cost need not).
        self._sized: dict[str, tuple[list[Message], int]] = {}

    def __repr__(self) -> str:
        return "ScriptedModel()"

    @classmethod
    def from_transcript(cls, messages: Sequence[Message]) -> ScriptedModel:
        """A model that answers with the assistant messages of a stored conversation, in order.

        ``ScriptedModel.from_transcript(app.messages(job_id))`` replays a
        production conversation offline: your tools and code run again on the
        model's recorded answers (tool call ids, provider fields and all), so
        their results can be compared with the stored ones (docs/guide/testing.md,
        "Testing your agent", has the recipe). Slice ``messages`` to
        replay from a later turn (a fork's own messages, say).
        """
        if isinstance(messages, str | dict) or not isinstance(messages, Sequence):
            raise InvalidInputError(f"messages must be a list of transcript messages, got {type(messages).__name__}")
        bad = next((m for m in messages if not isinstance(m, dict) or "role" not in m), None)
        if bad is not None:
            raise InvalidInputError(f"a transcript message must be a dict with a 'role', got {bad!r:.80}")
        answers: list[Reply] = [dict(m) for m in messages if m["role"] == "assistant"]
        if not answers:
            raise InvalidInputError("the transcript holds no assistant message to replay")
        return cls(answers)

    def complete(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            # Kept without its callbacks: they hold the turn that asked (its context, its stream), which
            # a list of every request would otherwise keep alive as long as the model.
            self.calls.append(request if request.on_delta is None and request.on_restart is None
                              else replace(request, on_delta=None, on_restart=None))
            if callable(self._script):
                turn = self._script(list(request.messages))
            else:
                if self._next >= len(self._script):
                    raise IndexError(f"ScriptedModel ran out of turns after {len(self._script)}")
                turn = self._script[self._next]
                self._next += 1
        response = _response(turn, request, self._prompt_chars(request))
        if request.on_delta is not None:
            _stream(response, request.on_delta)
        return response

    def _prompt_chars(self, request: ModelRequest) -> int:
        """The characters of the request's message contents (the usage estimate's prompt size)."""
        messages, job_id = request.messages, request.job_id
        if not job_id:
            return _chars(messages)  # not an agent turn's request: nothing says its messages are never edited
        with self._lock:
            before = self._sized.get(job_id)
        k = 0 if before is None else len(before[0])
        # An agent turn sends its transcript's messages, which nothing edits in place (the turn's cache relies
        # on it too): the very same objects in front sum as they did. Equal but distinct ones are summed
        # again (1 == 1.0, yet "1" != "1.0").
        if before is not None and k <= len(messages) and all(map(operator.is_, messages, before[0])):
            chars = before[1] + _chars(messages[k:])
        else:
            chars = _chars(messages)
        with self._lock:
            self._sized.pop(job_id, None)
            while len(self._sized) >= _SIZED_JOBS:
                self._sized.pop(next(iter(self._sized)))
            self._sized[job_id] = (list(messages), chars)
        return chars


_SIZED_JOBS = 256  # jobs whose last request a ScriptedModel keeps for the prompt estimate


def _chars(messages: Sequence[Message]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages)


def _response(turn: Reply, request: ModelRequest, prompt_chars: int | None = None) -> ModelResponse:
    if isinstance(turn, ModelResponse):
        return turn
    msg: Message = {"role": "assistant", "content": turn} if isinstance(turn, str) else dict(turn)
    finish = msg.pop("finish_reason", None)
    calls = msg.get("tool_calls") or []
    if isinstance(calls, list) and calls:
        # Like a provider: calls without an id get one no other call of the
        # answer uses. Malformed shapes (a dict for the list, a call that is
        # not a dict) pass through untouched, for the agent turn to answer.
        taken = {c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)}
        fixed = []
        for i, c in enumerate(calls):
            if isinstance(c, dict):
                c = {**c, "id": c.get("id") or _fresh_id(f"call_{request.turn}_{i}", taken),
                     "type": c.get("type", "function")}
                taken.add(c["id"])
            fixed.append(c)
        msg["tool_calls"] = fixed
    if prompt_chars is None:
        prompt_chars = _chars(request.messages)
    usage = Usage(prompt_tokens=prompt_chars // 4 + 1, completion_tokens=len(str(msg.get("content") or "")) // 4 + 1,
                  model_calls=1)
    return ModelResponse(message=msg, finish_reason=finish or ("tool_calls" if calls else "stop"), usage=usage,
                         model="scripted")


def _fresh_id(base: str, taken: set[str]) -> str:
    cid, n = base, 1
    while cid in taken:
        n += 1
        cid = f"{base}_{n}"
    return cid


def _stream(response: ModelResponse, on_delta: Callable[[str], None], size: int = 8) -> None:
    """Hand the scripted text to a streaming caller in pieces, as a provider's stream would."""
    text = response.message.get("content")
    if isinstance(text, str):
        for i in range(0, len(text), size):
            on_delta(text[i : i + size])
