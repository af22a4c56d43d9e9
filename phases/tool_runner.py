"""Running the tool calls of one turn: journaled, concurrent, with the interrupted-call policies.

The ledger per call: the model response journals it as *intended*,
``tools:started`` as *started* (the ids about to run), ``tool:<call id>`` as
*done* with its result. A call found started but not done after a crash
follows its tool's ``on_interrupted`` policy. When every call about to run
belongs to a ``retry`` tool, *started* is not written: such a call runs again
after a crash whether or not it had started, so the mark would change nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from phases.observe import notify
from phases.tools import Tool, ToolArgumentsError, ToolContext, result_content
from pipelines._aio import resolve, run_sync
from pipelines.models import Message
from pipelines.phase import FailJob, PhaseContext, RetryLater, WaitForInput

__all__ = ["arguments_digest", "run_tools", "tool_message"]

# Shared by every turn in the process: tool calls are I/O-bound, and a pool
# per turn would cost thread start-up on the hot path.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="pipelines-tool")


def _new_pool_after_fork() -> None:
    # A forked child inherits the executor object but none of its threads.
    global _POOL
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="pipelines-tool")


os.register_at_fork(after_in_child=_new_pool_after_fork)


def tool_message(call: Mapping[str, Any], content: str) -> Message:
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def run_tools(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int) -> list[Message]:
    if not calls:
        return []
    pending = [c for c in calls if not ctx.recorded(f"tool:{c['id']}")[0]]
    if pending:
        _check_approvals(ctx, tmap, pending)
        pending = [c for c in calls if not ctx.recorded(f"tool:{c['id']}")[0]]
    if pending:
        seen, started = ctx.recorded("tools:started")
        interrupted = set(started or []) if seen else set()
        if interrupted:
            _apply_interrupt_policies(ctx, tmap, [c for c in pending if c["id"] in interrupted], turn)
            pending = [c for c in calls if not ctx.recorded(f"tool:{c['id']}")[0]]
        if pending:
            if any(_policy(tmap, c) != "retry" for c in pending):
                # Only a tool that does not simply run again needs to know it
                # may have started: for "retry" tools, running again is the
                # recovery whether or not they started, so the write is saved.
                ctx.record("tools:started", [c["id"] for c in pending])
            _execute(ctx, tmap, pending, turn)
    return [tool_message(c, ctx.recorded(f"tool:{c['id']}")[1]) for c in calls]


def arguments_digest(call: Mapping[str, Any]) -> str:
    """What an approval is bound to: the call's tool name and exact arguments text."""
    fn = call.get("function") or {}
    text = json.dumps([fn.get("name"), fn.get("arguments")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_approvals(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]]) -> None:
    """Calls of tools that need approval run only once a person approved these exact arguments."""
    waiting = []
    for call in calls:
        fn = call.get("function") or {}
        t = tmap.get(fn.get("name", ""))
        if t is None or t.needs_approval is False:
            continue
        try:
            args = t.parse(fn.get("arguments"))
        except ToolArgumentsError:
            continue  # never runs: the model gets the argument error instead
        if not t.requires_approval(args):
            continue
        found, decision = ctx.recorded(f"approval:{call['id']}")
        if not found or decision.get("digest") != arguments_digest(call):
            waiting.append({"call_id": call["id"], "tool": t.name, "arguments": fn.get("arguments")})
        elif decision.get("decision") == "rejected":
            reason = decision.get("reason") or "no reason given"
            ctx.record(f"tool:{call['id']}", f"Error: a person rejected this call: {reason}")
    if waiting:
        names = ", ".join(f"{w['tool']} ({w['call_id']})" for w in waiting)
        raise WaitForInput(f"approval needed for {names}", call_id=waiting[0]["call_id"],
                           details={"kind": "approval", "calls": waiting})


def _policy(tmap: dict[str, Tool], call: Mapping[str, Any]) -> str:
    t = tmap.get((call.get("function") or {}).get("name", ""))
    return "retry" if t is None else t.on_interrupted


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
            raise WaitForInput(f"{what}; record its outcome with record_tool_result to continue", call_id=call["id"],
                               details={"kind": "outcome", "tool": name})
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
    notify("tool", ctx.job_id, tctx.call_id)
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
    notify("tool", ctx.job_id, tctx.call_id)
    try:
        return result_content(await t.call(args, tctx))
    except (FailJob, RetryLater, WaitForInput):
        raise
    except Exception as exc:  # noqa: BLE001 - a failing tool is reported to the model, which may recover
        return f"Error: tool {t.name!r} raised {type(exc).__name__}: {exc}"
