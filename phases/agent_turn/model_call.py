"""A turn's model call: the request sent (under the App's rate limits, in a span), the answer normalised,
and the structured-output follow-up when the final answer does not fit the schema."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel, ValidationError

from phases import flow_limits, journal
from phases.model import (
    Model,
    ModelRequest,
    ModelResponse,
    ReadOnlyMessages,
    is_secret_param,
    looks_secret,
    provider_of,
    shown_address,
)
from phases.observe import notify
from phases.tool_calls import normalise_tool_calls
from pipelines.engine import telemetry
from pipelines.engine._aio import resolve
from pipelines.engine.models import JSONValue, Message, fresh_json
from pipelines.engine.phase import Done, Fail, PhaseContext

__all__: list[str] = []

KEPT_ANSWER_CHARS = 16_000
"""How much of a fenced-off attempt's answer is kept beside the record (see :func:`_kept_answer`)."""


def _kept_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A fenced-off attempt's journaled answer as kept for the page: whole up to :data:`KEPT_ANSWER_CHARS` of JSON;
    a longer one keeps its finish reason, usage and model, how long it was (``cut``) and its start (``preview``)."""
    text = json.dumps(answer)
    if len(text) <= KEPT_ANSWER_CHARS:
        return answer
    return {"finish_reason": answer.get("finish_reason"), "usage": answer.get("usage"), "model": answer.get("model"),
            "cut": len(text), "preview": text[:KEPT_ANSWER_CHARS // 4]}

_STRUCTURED_NUDGE = "Now reply with only a JSON object that matches the required schema, and nothing else."


def _structured(ctx: PhaseContext[Any], model: Model, schema: type[BaseModel], history: list[Message],
                new_messages: list[Message], done: Done, params: dict[str, Any], turn: int) -> Done | Fail:
    """Validate the final answer against ``schema``; if it does not fit, ask once more without tools."""
    obj = _parse(schema, new_messages[0].get("content"))
    if obj is None:
        # One follow-up call, journaled like the turn's own model call. No
        # tools are offered, so response_format is safe to send.
        nudge: Message = {"role": "user", "content": _STRUCTURED_NUDGE}
        key = journal.structured_key(ctx.attempt)
        raw = ctx.step(key, lambda: _call_model(model, ctx, [*history, *new_messages, nudge], [], params, turn,
                                                schema))
        follow = ModelResponse.model_validate(raw)
        ctx.add_usage(follow.usage, key=key)
        message = _without_calls(ctx, follow.message)
        new_messages += [nudge, message]
        text = message.get("content")
        obj = _parse(schema, text)
        if obj is None:
            return Fail(f"the answer does not validate against {schema.__name__}; the model said: {str(text)[:1000]}")
    return Done(result=obj.model_dump(mode="json"), reason=done.reason)


def _without_calls(ctx: PhaseContext[Any], message: Message) -> Message:
    """The follow-up's answer without tool calls (none were offered), with a warning in the job's log.

    Kept, a call would stay unanswered in the transcript, and providers refuse the whole conversation on its next
    request; answered with an error, the transcript would end on a tool message instead of the answer the result
    comes from. The answer's text is what was asked for: it is kept (none fails the job, as any invalid answer).
    """
    calls = message.get("tool_calls")
    if not calls:
        return message
    names = [str((c.get("function") or {}).get("name")) for c in calls if isinstance(c, dict)]
    ctx.log(f"the structured-output answer called tools {names} though none were offered: the calls were dropped",
            "warn")
    return {k: v for k, v in message.items() if k != "tool_calls"}


def _parse(schema: type[BaseModel], text: Any) -> BaseModel | None:
    if not isinstance(text, str) or not text.strip():
        return None
    candidate = text.strip()
    if candidate.startswith("```"):
        # Models often fence JSON in markdown; accept ```json ... ``` too.
        candidate = candidate.strip("`").removeprefix("json").strip()
    try:
        return schema.model_validate_json(candidate)
    except ValidationError:
        return None


def journal_form(response: ModelResponse) -> dict[str, Any] | ModelResponse:
    """``response`` as the journal keeps it: without the fields that hold their defaults.

    A reader (this version or an older one: the defaults have not changed) fills them in again when it
    validates the answer. Every turn journals its answer, so the ``None`` fields and zero counts left
    out (``raw``, ``tools_offered``, ``unknown_cost_calls``...) are ~70 bytes a turn not sent to Redis.
    The message itself is kept as it is, ``None`` values included. An answer JSON cannot carry is
    returned as it is: the step's own conversion then says what is wrong with it, as for any step.
    """
    try:
        return response.model_dump(mode="json", exclude_defaults=True)
    except (ValueError, RecursionError):  # PydanticSerializationError is a ValueError
        return response


def _content_of(answer: JSONValue) -> str | None:
    """The text of a journaled model answer (a ``ModelResponse`` in JSON form), if it has one."""
    message = answer.get("message") if isinstance(answer, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else None


def _call_model(model: Model, ctx: PhaseContext[Any], messages: list[Message], schemas: list[dict[str, Any]],
                params: dict[str, Any], turn: int, response_format: type[BaseModel] | None = None, *,
                taken: frozenset[str] | None = None) -> ModelResponse:
    # The model's own copy of the messages (they are the worker's transcript cache), unless it says it
    # changes none in place.
    given = messages if isinstance(model, ReadOnlyMessages) else fresh_json(messages)
    request = ModelRequest(messages=given, tools=schemas, params=params, job_id=ctx.job_id, turn=turn,
                           response_format=response_format, on_delta=ctx.on_delta,
                           stream_retries=ctx.on_delta.retries if ctx.on_delta else 0,
                           on_restart=ctx.on_delta.restart if ctx.on_delta else None)
    notify("model", ctx.job_id, str(turn))
    started = time.monotonic()
    # The App's shared rate limit, if any, is taken here (or the turn deferred) and settled with the real usage.
    # The span opens once the call is allowed: a call deferred by the rate limit never happened.
    requested, provider = flow_limits.model_name(model), provider_of(model) if telemetry.enabled() else None
    with flow_limits.limited_call(ctx.env.active_flow(), model, messages) as settle, \
            telemetry.model_span(requested, provider) as current:
        response = resolve(model.complete(request))
        if not isinstance(response, ModelResponse):
            response = ModelResponse.model_validate(response)
        settle(response.usage.total_tokens)
        usage = response.usage
        telemetry.record_model(current, model=response.model, input_tokens=usage.prompt_tokens,
                               output_tokens=usage.completion_tokens, finish_reason=response.finish_reason,
                               cost_usd=usage.cost_usd, started=started, request_model=requested, provider=provider)
    message = dict(response.message)
    message.setdefault("role", "assistant")
    # Tool call ids key the journal and the idempotency key: fixed here (unique
    # in the transcript, every call well-formed) before the answer is journaled,
    # so a re-run replays the same ids and the model sees each call answered.
    # ``taken``: the ids of the whole transcript (the turn's answer); without it, those of ``messages``.
    # Ids it makes for calls that came without one are numbered by the job's turn over its whole life, not the
    # run's (the same in a first run): a full retry cuts the transcript back, and an id made again would make a
    # call's idempotency key (``<job>/<call id>``) that of a call before the retry.
    message = normalise_tool_calls(message, ctx.job_turn - 1, messages if taken is None else (), taken=taken)
    sent = request_summary(messages, schemas, params)
    return response.model_copy(update={"message": message, "request": sent})


def request_summary(messages: list[Message], schemas: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """What a model call sent, in short, for the page's view of a turn: never a secret.

    The messages are counted, not copied (they are the transcript, stored once); a parameter whose name
    says it holds a secret (:func:`phases.model.is_secret_param`, the rule error messages use too), or
    whose value looks like one (``Bearer ...``, ``sk-...``), is named with its value hidden, and an
    address loses any user, password and query string in it (a gateway's ``?key=``).
    """
    shown: dict[str, Any] = {}
    for name, value in sorted(params.items()):
        if is_secret_param(str(name)) or (isinstance(value, str) and looks_secret(value)):
            shown[str(name)] = "[hidden]"
        elif isinstance(value, str):
            shown[str(name)] = shown_address(value)[:200]
        elif value is None or isinstance(value, bool | int | float):
            shown[str(name)] = value
        else:
            shown[str(name)] = f"<{type(value).__name__}>"
    tools = [str((s.get("function") or {}).get("name", "?")) for s in schemas]
    return {"messages": len(messages), "tools": tools, **({"params": shown} if shown else {})}


