"""The agent turn: one phase that calls the model, runs the tools it asked for, and commits.

Step by step (each step journaled, so a re-run after a crash repeats nothing
that finished, I5):

1. ``model``: the model call; its response is journaled.
2. ``tools:started``: the ids of the calls about to run (the ledger's
   "started"; the model response is their "intended").
3. ``tool:<call id>``: each tool's result, journaled as each finishes
   (the ledger's "done"). Calls run concurrently: threads for ``def`` tools,
   the runner's event loop for ``async def`` ones.
4. Stop check; the runner commits the new messages (append-only) with the
   next turn, or completes the job.

A call found started but not done after a crash follows its tool's
``on_interrupted`` policy (retry / fail / reconcile / ask).
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from phases.model import Model, ModelRequest, ModelResponse
from phases.observe import notify
from phases.stop import StopCondition, TurnInfo, should_stop
from phases.tool_runner import run_tools, tool_message
from phases.tools import Tool, tool_map
from pipelines._aio import resolve
from pipelines.errors import InvalidInputError, PermanentModelError, TransientModelError
from pipelines.models import Message
from pipelines.phase import Done, Fail, Next, Phase, PhaseContext, RetryLater

__all__ = ["AgentState", "TURN_PHASE", "build_agent_phase", "resolve_model"]

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


def build_agent_phase(
    *,
    model: str | Model,
    tools: Sequence[Tool] | Mapping[str, Tool] | None = (),
    system: str | None = None,
    max_turns: int = 10,
    stop_when: StopCondition | Sequence[StopCondition] | None = None,
    model_params: Mapping[str, Any] | None = None,
    max_model_attempts: int = 5,
) -> Phase:
    """Build the agent's turn phase (named ``"turn"``); it reschedules itself until a stop.

    ``model_params`` go to litellm unchanged (api_base, api_key, temperature,
    ...) and are never stored. Transient model errors re-run the turn later,
    up to ``max_model_attempts`` times; permanent ones fail the job.
    """
    if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns <= 0:
        raise InvalidInputError(f"max_turns must be a positive int, got {max_turns!r}")
    if system is not None and not isinstance(system, str):
        raise InvalidInputError(f"system must be a string, got {type(system).__name__}")
    if stop_when is not None and not callable(stop_when) and not all(callable(c) for c in stop_when):
        raise InvalidInputError("stop_when must be a callable or a list of callables")
    the_model = resolve_model(model, model_params)
    # A model string's params went into its LiteLLMModel; a Model object gets them with each request.
    request_params = {} if isinstance(model, str) else dict(model_params or {})
    tmap = tool_map(tools)
    schemas = [t.schema() for t in tmap.values()]
    prefix: list[Message] = [{"role": "system", "content": system}] if system else []

    history = _HistoryCache()

    def turn(ctx: PhaseContext[Any]) -> Next | Done | Fail:
        state = AgentState.model_validate(ctx.state or {})
        past = history.get(ctx)
        try:
            raw = ctx.step("model", lambda: _call_model(the_model, ctx, prefix + past, schemas, request_params,
                                                        state.turn))
        except TransientModelError as exc:
            if ctx.attempt + 1 >= max_model_attempts:
                return Fail(f"model call failed {ctx.attempt + 1} times, last: {exc}")
            delay = exc.retry_after if exc.retry_after is not None else min(300.0, 2.0 * 2**ctx.attempt)
            raise RetryLater(delay, f"model: {exc}") from exc
        except PermanentModelError as exc:
            return Fail(f"model error: {exc}")
        response = ModelResponse.model_validate(raw)
        message = response.message
        calls = response.tool_calls
        truncated = response.finish_reason == "length"
        if truncated and calls:
            # Arguments of a cut-off answer cannot be trusted: answer every
            # call without running it, so the transcript stays valid.
            results = [tool_message(c, "Error: not run, the model's answer was truncated") for c in calls]
        else:
            results = run_tools(ctx, tmap, calls, state.turn)
        ctx.append_messages([message, *results])
        ctx.add_usage(response.usage)
        history.remember_after_commit(ctx, [*past, message, *results])
        done_turns = state.turn + 1
        info = TurnInfo(turn=done_turns, message=message, tool_calls=calls, tool_results=results,
                        state=state, usage=response.usage)
        result = _result_of(message, results)
        if truncated:
            ctx.log(f"model answer truncated (finish_reason=length) at turn {done_turns}; stopping", "warn")
            return Done(result=result)
        if not calls:
            return Done(result=result)
        reason = should_stop(stop_when, info)
        if reason is not None:
            ctx.log(f"stopped by {reason} at turn {done_turns}")
            return Done(result=result)
        if done_turns >= max_turns:
            ctx.log(f"stopped: max_turns={max_turns} reached with tool calls pending a reply", "warn")
            return Done(result=result)
        return Next(TURN_PHASE, state=AgentState(turn=done_turns))

    return Phase(TURN_PHASE, turn)


class _HistoryCache:
    """The transcript of recently advanced jobs, so a worker that runs a job's next turn reads no history.

    An entry is valid only for the exact checkpoint its turn committed
    (``commit_id``); any other writer, a retry or a truncation misses it and
    the transcript is read from storage. Bounded: least recently used out.
    """

    def __init__(self, size: int = 256) -> None:
        self._entries: OrderedDict[str, tuple[str, list[Message]]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, ctx: PhaseContext[Any]) -> list[Message]:
        commit_id = ctx.checkpoint.commit_id
        with self._lock:
            hit = self._entries.get(ctx.job_id)
        if hit is not None and commit_id and hit[0] == commit_id and len(hit[1]) == ctx.checkpoint.transcript_len:
            return hit[1]
        return ctx.messages()

    def remember_after_commit(self, ctx: PhaseContext[Any], messages: list[Message]) -> None:
        def put(cp: Any) -> None:
            with self._lock:
                self._entries[ctx.job_id] = (cp.commit_id, messages)
                self._entries.move_to_end(ctx.job_id)
                while len(self._entries) > self._size:
                    self._entries.popitem(last=False)

        ctx.on_commit(put)


def _call_model(model: Model, ctx: PhaseContext[Any], prefix: list[Message], schemas: list[dict[str, Any]],
                params: dict[str, Any], turn: int) -> ModelResponse:
    request = ModelRequest(messages=prefix, tools=schemas, params=params, job_id=ctx.job_id, turn=turn)
    notify("model", ctx.job_id, str(turn))
    response = resolve(model.complete(request))
    if not isinstance(response, ModelResponse):
        response = ModelResponse.model_validate(response)
    message = dict(response.message)
    message.setdefault("role", "assistant")
    calls = message.get("tool_calls") or []
    if calls:
        # Tool call ids key the journal and the idempotency key: make sure
        # every call has one, unique within the turn.
        fixed = []
        for i, call in enumerate(calls):
            call = dict(call)
            if not call.get("id"):
                call["id"] = f"call_{turn}_{i}"
            call.setdefault("type", "function")
            fixed.append(call)
        message["tool_calls"] = fixed
    return response.model_copy(update={"message": message})


def _result_of(message: Message, results: list[Message]) -> Any:
    content = message.get("content")
    if content:
        return content
    return results[-1]["content"] if results else None
