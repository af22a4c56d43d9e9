"""Running the tool calls of one turn: journaled, concurrent, with the interrupted-call policies.

The ledger per call: the model response journals it as *intended*,
``tools:started`` as *started* (the ids about to run), ``tool:<call id>`` as
*done* with its result. A call found started but not done after a crash
follows its tool's ``on_interrupted`` policy. When every call about to run
belongs to a ``retry`` tool, *started* is not written: such a call runs again
after a crash whether or not it had started, so the mark would change nothing.

Whatever a tool raises stays inside its call and becomes an error message the
model reads (``SystemExit``, ``asyncio.CancelledError`` and ``GeneratorExit``
included). Only these propagate: the control signals ``FailJob``,
``RetryLater`` and ``WaitForInput``, ``KeyboardInterrupt``, and any other
``BaseException`` subclass from outside the standard library, which by
convention means "the process is going down" (the crash harness's
``SimulatedCrash`` is one). Either way the shared thread pool and this
thread's event loop are left with nothing of the turn still pending, so the
next job run by the same thread starts clean.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import hashlib
import inspect
import json
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel

from phases import journal
from phases.observe import notify
from phases.tools import Tool, ToolArgumentsError, ToolContext, check_timeout, result_content
from pipelines.engine import children, telemetry
from pipelines.engine._aio import resolve, run_sync
from pipelines.engine.errors import StateNotSerializableError
from pipelines.engine.models import Message
from pipelines.engine.phase import FailJob, PhaseContext, RetryLater, WaitForInput

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
    """The tool message answering ``call``."""
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def run_tools(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int, *,
              default_timeout: float | None = None) -> list[Message]:
    """Run a turn's tool calls (ids unique, as the agent turn makes them) and return their tool messages.

    Each result is journaled as ``tool:<call id>``, so a re-run after a crash
    runs only the calls not done. ``default_timeout`` (seconds) bounds every
    call of a tool without a ``timeout`` of its own; see :class:`Tool`.
    """
    default_timeout = check_timeout(default_timeout, "default_timeout")
    if not calls:
        return []
    _refuse_extra_children(ctx, tmap, calls)
    pending = [c for c in calls if not ctx.recorded(journal.tool_key(c['id']))[0]]
    if pending:
        _check_approvals(ctx, tmap, pending)
        pending = [c for c in calls if not ctx.recorded(journal.tool_key(c['id']))[0]]
    if pending:
        seen, started = ctx.recorded(journal.TOOLS_STARTED)
        interrupted = set(started or []) if seen else set()
        if interrupted:
            _apply_interrupt_policies(ctx, tmap, [c for c in pending if c["id"] in interrupted], turn)
            pending = [c for c in calls if not ctx.recorded(journal.tool_key(c['id']))[0]]
        if pending:
            if any(_policy(tmap, c) != "retry" for c in pending):
                # Only a tool that does not simply run again needs to know it
                # may have started: for "retry" tools, running again is the
                # recovery whether or not they started, so the write is saved.
                ctx.record(journal.TOOLS_STARTED, [c["id"] for c in pending])
            _execute(ctx, tmap, pending, turn, default_timeout)
    return [tool_message(c, ctx.recorded(journal.tool_key(c['id']))[1]) for c in calls]


def _refuse_extra_children(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]]) -> None:
    """Journal an error result for each child-starting call past the turn's fan-out limit (no child starts).

    Counted in the answer's order over all its calls, done or not, so a
    re-run after a crash refuses the same calls.
    """
    starting = [c for c in calls if getattr(_tool_of(tmap, c), "starts_child", False) is True]
    for call in starting[children.MAX_CHILDREN_PER_TURN:]:
        if not ctx.recorded(journal.tool_key(call['id']))[0]:
            ctx.record(journal.tool_key(call['id']), children.fan_out_refused(str(_function(call).get("name"))))


def arguments_digest(call: Mapping[str, Any]) -> str:
    """What an approval is bound to: the call's tool name and exact arguments text."""
    fn = _function(call)
    text = json.dumps([fn.get("name"), fn.get("arguments")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_approvals(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]]) -> None:
    """Calls of tools that need approval run only once a person approved these exact arguments."""
    waiting = []
    for call in calls:
        fn = _function(call)
        t = _tool_of(tmap, call)
        if t is None or t.needs_approval is False:
            continue
        try:
            args = t.parse(fn.get("arguments"))
        except ToolArgumentsError:
            continue  # never runs: the model gets the argument error instead
        if not t.requires_approval(args):
            continue
        found, decision = ctx.recorded(journal.approval_key(call['id']))
        if not found or decision.get("digest") != arguments_digest(call):
            waiting.append({"call_id": call["id"], "tool": t.name, "arguments": fn.get("arguments")})
        elif decision.get("decision") == "rejected":
            reason = decision.get("reason") or "no reason given"
            ctx.record(journal.tool_key(call['id']), f"Error: a person rejected this call: {reason}")
    if waiting:
        names = ", ".join(f"{w['tool']} ({w['call_id']})" for w in waiting)
        raise WaitForInput(f"approval needed for {names}", call_id=waiting[0]["call_id"],
                           details={"kind": "approval", "calls": waiting})


def _policy(tmap: dict[str, Tool], call: Mapping[str, Any]) -> str:
    t = _tool_of(tmap, call)
    return "retry" if t is None else t.on_interrupted


def _apply_interrupt_policies(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]],
                              turn: int) -> None:
    for call in calls:
        name = _function(call).get("name", "")
        t = _tool_of(tmap, call)
        if t is None or t.on_interrupted == "retry":
            continue  # runs again below
        what = f"tool {name!r} call {call['id']} was interrupted mid-call; whether it took effect is unknown"
        if t.on_interrupted == "fail":
            raise FailJob(f"{what} (on_interrupted='fail'); record its outcome with record_tool_result, then retry")
        if t.on_interrupted == "ask":
            raise WaitForInput(f"{what}; record its outcome with record_tool_result to continue", call_id=call["id"],
                               details={"kind": "outcome", "tool": name})
        assert t.reconcile is not None
        args = t.parse(_function(call).get("arguments"))
        tctx = tool_context(ctx, call["id"], name, turn)
        found = resolve(t.reconcile(args, tctx))
        if found is not None:
            ctx.record(journal.tool_key(call['id']), result_content(found))
        ctx.log(f"reconciled interrupted call {call['id']} of {name!r}: "
                f"{'effect found' if found is not None else 'no effect, running it again'}")


# --- running the calls ------------------------------------------------------------

_SIGNALS = (FailJob, RetryLater, WaitForInput, KeyboardInterrupt)
# What a tool may raise without taking the worker down with it. Other
# BaseException subclasses (not the standard library's) mean the process is
# dying, like SimulatedCrash, and pass through.
_CONTAINED = (Exception, SystemExit, GeneratorExit, asyncio.CancelledError)


class _TimedOut(Exception):  # noqa: N818 - private marker, never leaves this module
    """The call ran past its timeout (distinct from a TimeoutError the tool raised itself)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timed out after {seconds:g} s")
        self.seconds = seconds


def _contained(exc: BaseException) -> bool:
    """Whether ``exc`` from a tool becomes an error message for the model (else it propagates)."""
    if isinstance(exc, _SIGNALS):
        return False
    if isinstance(exc, BaseExceptionGroup):
        return all(_contained(e) for e in exc.exceptions)
    return isinstance(exc, _CONTAINED)


def _execute(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int,
             default_timeout: float | None) -> None:
    if len(calls) == 1 and not _is_async(tmap, calls[0]):
        # The common case runs inline: no event loop, no thread hop.
        ctx.record(journal.tool_key(calls[0]['id']), _invoke_sync(ctx, tmap, calls[0], turn, default_timeout))
        return
    tasks: list[asyncio.Task[Any]] = []
    try:
        outcomes = run_sync(_run_all(ctx, tmap, calls, turn, default_timeout, tasks))
    except BaseException:
        # Something stopped the loop mid-turn (a KeyboardInterrupt from a
        # signal): what is left of this turn must not run in the next job's.
        _cancel_left_over(tasks)
        raise
    failures = [o for o in outcomes if o is not None]
    if failures:
        # A dying process outranks a control signal from another call.
        fatal = [f for f in failures if not isinstance(f, FailJob | RetryLater | WaitForInput)]
        raise fatal[0] if fatal else _waits_merged(failures)


def _waits_merged(failures: list[BaseException]) -> BaseException:
    """Several calls waiting for child jobs wait as one (the job waits for them all); else the first signal."""
    waits = [f for f in failures if isinstance(f, WaitForInput) and f.details.get("kind") == "children"]
    if len(waits) < 2 or len(waits) != len(failures):
        return failures[0]
    calls = [c for w in waits for c in w.details.get("calls") or []]
    return WaitForInput(f"waiting for {len(calls)} child jobs", call_id=waits[0].call_id,
                        details={**waits[0].details, "calls": calls})


async def _run_all(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int,
                   default_timeout: float | None, tasks: list[asyncio.Task[Any]]) -> list[BaseException | None]:
    """Every call at once; ``tasks`` receives this task and the calls' tasks, for ``_cancel_left_over``."""
    loop = asyncio.get_running_loop()
    before = asyncio.all_tasks(loop)
    me = asyncio.current_task(loop)
    assert me is not None  # a coroutine run by run_sync always runs as a task
    tasks.append(me)
    tasks.extend(loop.create_task(_one(ctx, tmap, c, turn, default_timeout)) for c in calls)
    try:
        # Each call finishes (and journals) before a signal from one of them
        # ends the turn: _one hands back what it raised instead of raising.
        return list(await asyncio.gather(*tasks[1:]))
    finally:
        # Tasks a tool started and left behind would otherwise run, and could
        # raise, inside whatever this thread's loop runs next: another job.
        strays = [t for t in asyncio.all_tasks(loop) if t not in before and t not in tasks]
        for t in strays:
            t.cancel()
        await asyncio.gather(*strays, return_exceptions=True)


async def _one(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: dict[str, Any], turn: int,
               default_timeout: float | None) -> BaseException | None:
    loop = asyncio.get_running_loop()
    try:
        if _is_async(tmap, call):
            content = await _invoke_async(ctx, tmap, call, turn, default_timeout)
        else:
            # In this task's context (the turn's span, when tracing), not the pool thread's empty one.
            content = await loop.run_in_executor(_POOL, contextvars.copy_context().run, _invoke_sync, ctx, tmap,
                                                 call, turn, default_timeout)
        await loop.run_in_executor(_POOL, ctx.record, journal.tool_key(call['id']), content)
    except BaseException as exc:  # returned, not raised: see below
        # A KeyboardInterrupt or SystemExit raised out of a task escapes the
        # event loop and strands the other calls' tasks on it; as a value it
        # is raised by _execute once every call is done.
        if isinstance(exc, asyncio.CancelledError) and _cancelling():
            raise
        return exc
    return None


def _cancel_left_over(tasks: list[asyncio.Task[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    if not pending:
        return
    loop = pending[0].get_loop()
    if loop.is_closed() or loop.is_running():
        return  # a helper thread's loop (asyncio.run cleaned it up) or not ours to drive
    for t in pending:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not a tool raising CancelledError)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = call.get("function")
    return fn if isinstance(fn, Mapping) else {}


def _tool_of(tmap: dict[str, Tool], call: Mapping[str, Any]) -> Tool | None:
    name = _function(call).get("name")
    return tmap.get(name) if isinstance(name, str) else None


def _is_async(tmap: dict[str, Tool], call: Mapping[str, Any]) -> bool:
    t = _tool_of(tmap, call)
    return t is not None and t.is_async


def _prepare(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any],
             turn: int) -> tuple[Tool, BaseModel, ToolContext] | str:
    fn = _function(call)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        known = ", ".join(sorted(tmap)) or "none"
        return f"Error: this tool call is malformed: it names no tool; available tools: {known}"
    t = tmap.get(name)
    if t is None:
        known = ", ".join(sorted(tmap)) or "none"
        return f"Error: unknown tool {name!r}; available tools: {known}"
    try:
        args = t.parse(fn.get("arguments"))
    except ToolArgumentsError as exc:
        return f"Error: {exc}. Fix the arguments and call the tool again."
    return t, args, tool_context(ctx, call["id"], name, turn)


def tool_context(ctx: PhaseContext[Any], call_id: str, name: str, turn: int) -> ToolContext:
    """What the tool ``name`` is handed for call ``call_id``: its run's context and the App's environment."""
    scope = ctx.tool_scope
    if scope is None:
        return ToolContext(job_id=ctx.job_id, call_id=call_id, tool_name=name, turn=turn, env=ctx.env)
    return ToolContext(job_id=ctx.job_id, call_id=call_id, tool_name=name, turn=turn, context=scope.context,
                       tool_context=scope.tool_contexts.get(name), env=ctx.env)


def _span_of(call: Mapping[str, Any]) -> Any:
    fn = call.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    return telemetry.tool_span(str(name or "unknown"), str(call.get("id", "")))


def _invoke_sync(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int,
                 default_timeout: float | None) -> str:
    with _span_of(call):
        return _invoke_sync_in_span(ctx, tmap, call, turn, default_timeout)


def _invoke_sync_in_span(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int,
                         default_timeout: float | None) -> str:
    prepared = _prepare(ctx, tmap, call, turn)
    if isinstance(prepared, str):
        return prepared
    t, args, tctx = prepared
    timeout = t.timeout if t.timeout is not None else default_timeout
    notify("tool", ctx.job_id, tctx.call_id)
    try:
        if timeout is None:
            value = resolve(t.call(args, tctx))
        else:
            value = _on_own_thread(lambda: resolve(t.call(args, tctx)), timeout)
    except _TimedOut as late:
        content = _timed_out(t, tctx, late.seconds)
        return content if content is not None else _reconciled(t, resolve(_reconcile(t, args, tctx)), late.seconds)
    except BaseException as exc:  # contained or re-raised, by _contained's rule
        if not _contained(exc):
            raise
        return _raised(t, exc)
    return _content(t, value)


async def _invoke_async(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int,
                        default_timeout: float | None) -> str:
    with _span_of(call):
        return await _invoke_async_in_span(ctx, tmap, call, turn, default_timeout)


async def _invoke_async_in_span(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any], turn: int,
                                default_timeout: float | None) -> str:
    prepared = _prepare(ctx, tmap, call, turn)
    if isinstance(prepared, str):
        return prepared
    t, args, tctx = prepared
    timeout = t.timeout if t.timeout is not None else default_timeout
    notify("tool", ctx.job_id, tctx.call_id)
    try:
        value = await _within(t.call(args, tctx), timeout)
    except _TimedOut as late:
        content = _timed_out(t, tctx, late.seconds)
        if content is not None:
            return content
        found = _reconcile(t, args, tctx)
        return _reconciled(t, await found if inspect.isawaitable(found) else found, late.seconds)
    except BaseException as exc:  # contained or re-raised, by _contained's rule
        if not _contained(exc) or _cancelling():
            raise
        return _raised(t, exc)
    return _content(t, value)


def _on_own_thread(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` on a daemon thread of its own; past ``timeout`` the thread is abandoned, never joined.

    Not the shared pool: an abandoned call would hold one of its threads, and
    enough of them would stall every job in the process.
    """
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting turn, which decides
            future.set_exception(exc)

    threading.Thread(target=target, name="pipelines-tool-timed", daemon=True).start()
    done, _ = concurrent.futures.wait([future], timeout=timeout)
    if not done:
        raise _TimedOut(timeout)
    return future.result()


async def _within(awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """Await ``awaitable``, cancelling it after ``timeout`` seconds (``_TimedOut``)."""
    if timeout is None:
        return await awaitable
    task = asyncio.ensure_future(_captured(awaitable))
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        await asyncio.wait({task})  # let it unwind; what it ends with is dropped
        raise _TimedOut(timeout)
    ok, value = task.result()
    if not ok:
        raise value
    return value


async def _captured(awaitable: Awaitable[Any]) -> tuple[bool, Any]:
    # In a task of its own a SystemExit would escape the event loop: carry it out as a value.
    try:
        return True, await awaitable
    except BaseException as exc:  # noqa: BLE001 - re-raised by _within in the caller's task
        return False, exc


def _timed_out(t: Tool, tctx: ToolContext, timeout: float) -> str | None:
    """The message for a call past its timeout; raises for "fail" / "ask"; None: ask ``reconcile``."""
    if t.on_interrupted == "retry":
        return f"Error: tool {t.name!r} timed out after {timeout:g} s"
    what = (f"tool {t.name!r} call {tctx.call_id} timed out after {timeout:g} s and was abandoned; "
            "whether it took effect is unknown")
    if t.on_interrupted == "fail":
        raise FailJob(f"{what} (on_interrupted='fail'); record its outcome with record_tool_result, then retry")
    if t.on_interrupted == "ask":
        raise WaitForInput(f"{what}; record its outcome with record_tool_result to continue", call_id=tctx.call_id,
                           details={"kind": "outcome", "tool": t.name})
    return None


def _reconcile(t: Tool, args: BaseModel, tctx: ToolContext) -> Any:
    assert t.reconcile is not None  # on_interrupted="reconcile" requires one (Tool.__init__)
    return t.reconcile(args, tctx)


def _reconciled(t: Tool, found: Any, timeout: float) -> str:
    if found is None:
        # Not run again: the abandoned call may still be running and take effect.
        return f"Error: tool {t.name!r} timed out after {timeout:g} s; reconcile found no effect of it yet"
    return _content(t, found)


def _raised(t: Tool, exc: BaseException) -> str:
    return f"Error: tool {t.name!r} raised {type(exc).__name__}: {exc}"


def _content(t: Tool, value: Any) -> str:
    try:
        return result_content(value)
    except StateNotSerializableError as exc:
        detail = exc.__cause__ or exc
        return f"Error: tool {t.name!r} returned a value that is not JSON: {detail}"
