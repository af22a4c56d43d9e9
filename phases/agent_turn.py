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

import asyncio
import concurrent.futures
import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from phases.model import Model, ModelRequest, ModelResponse
from phases.stop import StopCondition, TurnInfo, should_stop
from phases.tools import Tool, ToolArgumentsError, ToolContext, result_content, tool_map
from pipelines._aio import resolve, run_sync
from pipelines.errors import InvalidInputError, PermanentModelError, TransientModelError
from pipelines.models import Message
from pipelines.phase import Done, Fail, FailJob, Next, Phase, PhaseContext, RetryLater, WaitForInput

__all__ = ["AgentState", "TURN_PHASE", "build_agent_phase", "observe_calls", "resolve_model"]

TURN_PHASE = "turn"

# Shared by every turn in the process: tool calls are I/O-bound, and a pool
# per turn would cost thread start-up on the hot path.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="pipelines-tool")


# Test instrumentation (the crash harness counts model and tool executions
# through it); a no-op loop over an empty list when nobody observes.
_observers: list[Callable[[str, str, str], None]] = []


@contextmanager
def observe_calls(fn: Callable[[str, str, str], None]) -> Iterator[None]:
    """Call ``fn(kind, job_id, key)`` right before every model call (``"model"``, turn) and tool execution
    (``"tool"``, call id) in this process, while the ``with`` block runs."""
    _observers.append(fn)
    try:
        yield
    finally:
        _observers.remove(fn)


def _notify(kind: str, job_id: str, key: str) -> None:
    for fn in list(_observers):
        fn(kind, job_id, key)


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
            results = [_tool_message(c, "Error: not run, the model's answer was truncated") for c in calls]
        else:
            results = _run_tools(ctx, tmap, calls, state.turn)
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
    _notify("model", ctx.job_id, str(turn))
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


def _tool_message(call: Mapping[str, Any], content: str) -> Message:
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def _result_of(message: Message, results: list[Message]) -> Any:
    content = message.get("content")
    if content:
        return content
    return results[-1]["content"] if results else None


def _run_tools(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int) -> list[Message]:
    if not calls:
        return []
    pending = [c for c in calls if not ctx.recorded(f"tool:{c['id']}")[0]]
    if pending:
        seen, started = ctx.recorded("tools:started")
        interrupted = set(started or []) if seen else set()
        if interrupted:
            _apply_interrupt_policies(ctx, tmap, [c for c in pending if c["id"] in interrupted], turn)
            pending = [c for c in calls if not ctx.recorded(f"tool:{c['id']}")[0]]
        if pending:
            ctx.record("tools:started", [c["id"] for c in pending])
            _execute(ctx, tmap, pending, turn)
    return [_tool_message(c, ctx.recorded(f"tool:{c['id']}")[1]) for c in calls]


def _apply_interrupt_policies(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]],
                              turn: int) -> None:
    for call in calls:
        name = (call.get("function") or {}).get("name", "")
        t = tmap.get(name)
        if t is None or t.on_interrupted == "retry":
            continue  # runs again below
        what = f"tool {name!r} call {call['id']} was interrupted mid-call; whether it took effect is unknown"
        if t.on_interrupted == "fail":
            raise FailJob(f"{what} (on_interrupted='fail'); record its outcome with record_tool_result, then retry")
        if t.on_interrupted == "ask":
            raise WaitForInput(f"{what}; record its outcome with record_tool_result to continue", call_id=call["id"])
        assert t.reconcile is not None
        args = t.parse((call.get("function") or {}).get("arguments"))
        tctx = ToolContext(job_id=ctx.job_id, call_id=call["id"], tool_name=name, turn=turn)
        found = resolve(t.reconcile(args, tctx))
        if found is not None:
            ctx.record(f"tool:{call['id']}", result_content(found))
        ctx.log(f"reconciled interrupted call {call['id']} of {name!r}: "
                f"{'effect found' if found is not None else 'no effect, running it again'}")


def _execute(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int) -> None:
    if len(calls) == 1 and not _is_async(tmap, calls[0]):
        # The common case runs inline: no event loop, no thread hop.
        ctx.record(f"tool:{calls[0]['id']}", _invoke_sync(ctx, tmap, calls[0], turn))
        return

    async def run_all() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()

        async def one(call: dict[str, Any]) -> None:
            if _is_async(tmap, call):
                content = await _invoke_async(ctx, tmap, call, turn)
            else:
                content = await loop.run_in_executor(_POOL, _invoke_sync, ctx, tmap, call, turn)
            await loop.run_in_executor(_POOL, ctx.record, f"tool:{call['id']}", content)

        # return_exceptions: let every call finish (and journal) before a
        # control signal from one of them ends the turn.
        return await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)

    for outcome in run_sync(run_all()):
        if isinstance(outcome, BaseException):
            raise outcome


def _is_async(tmap: dict[str, Tool], call: Mapping[str, Any]) -> bool:
    t = tmap.get((call.get("function") or {}).get("name", ""))
    return t is not None and t.is_async


def _prepare(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any],
             turn: int) -> tuple[Tool, BaseModel, ToolContext] | str:
    fn = call.get("function") or {}
    name = fn.get("name", "")
    t = tmap.get(name)
    if t is None:
        known = ", ".join(sorted(tmap)) or "none"
        return f"Error: unknown tool {name!r}; available tools: {known}"
    try:
        args = t.parse(fn.get("arguments"))
    except ToolArgumentsError as exc:
        return f"Error: {exc}. Fix the arguments and call the tool again."
    return t, args, ToolContext(job_id=ctx.job_id, call_id=call["id"], tool_name=name, turn=turn)


def _invoke_sync(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int) -> str:
    prepared = _prepare(ctx, tmap, call, turn)
    if isinstance(prepared, str):
        return prepared
    t, args, tctx = prepared
    _notify("tool", ctx.job_id, tctx.call_id)
    try:
        return result_content(resolve(t.call(args, tctx)))
    except (FailJob, RetryLater, WaitForInput):
        raise
    except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model, which may recover
        return f"Error: tool {t.name!r} raised {type(exc).__name__}: {exc}"


async def _invoke_async(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int) -> str:
    prepared = _prepare(ctx, tmap, call, turn)
    if isinstance(prepared, str):
        return prepared
    t, args, tctx = prepared
    _notify("tool", ctx.job_id, tctx.call_id)
    try:
        return result_content(await t.call(args, tctx))
    except (FailJob, RetryLater, WaitForInput):
        raise
    except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model, which may recover
        return f"Error: tool {t.name!r} raised {type(exc).__name__}: {exc}"
