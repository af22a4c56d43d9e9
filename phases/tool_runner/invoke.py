"""One tool call run: its arguments parsed, the tool called (within its timeout), its result or error as text.

What the tool raises stays in its call (:func:`_contained`); a call past its timeout follows its
tool's ``on_interrupted`` policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from phases.observe import notify
from phases.tool_runner.calls import _function, tool_context
from phases.tools import Tool, ToolArgumentsError, ToolContext, result_content
from pipelines.engine import telemetry
from pipelines.engine._aio import resolve
from pipelines.engine.contain import message_of
from pipelines.engine.errors import StateNotSerializableError
from pipelines.engine.masking import mask
from pipelines.engine.phase import FailJob, PhaseContext, RetryLater, WaitForInput

logger = logging.getLogger("pipelines")
_LOGGED = 2000  # characters of a raising call's message kept in the job's log (the transcript holds it whole)

__all__ = ["never_called"]

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


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not a tool raising CancelledError)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_MALFORMED = "Error: this tool call is malformed: "
_UNKNOWN = "Error: unknown tool "
_FIX = ". Fix the arguments and call the tool again."


_BAD_ARGUMENTS = ("Error: arguments for tool ", "Error: invalid arguments for tool ")  # ToolArgumentsError's words


def never_called(content: object) -> bool:
    """Whether a call's result says it never reached its tool (malformed, an unknown tool, bad arguments)."""
    return isinstance(content, str) and (content.startswith((_MALFORMED, _UNKNOWN))
                                         or (content.startswith(_BAD_ARGUMENTS) and content.endswith(_FIX)))


def _prepare(ctx: PhaseContext[Any], tmap: dict[str, Tool], call: Mapping[str, Any],
             turn: int) -> tuple[Tool, BaseModel, ToolContext] | str:
    fn = _function(call)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        known = ", ".join(sorted(tmap)) or "none"
        return f"{_MALFORMED}it names no tool; available tools: {known}"
    t = tmap.get(name)
    if t is None:
        known = ", ".join(sorted(tmap)) or "none"
        return f"{_UNKNOWN}{name!r}; available tools: {known}"
    try:
        args = t.parse(fn.get("arguments"))
    except ToolArgumentsError as exc:
        return f"Error: {exc}{_FIX}"
    return t, args, tool_context(ctx, call["id"], name, turn)


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
        with _unknown_outcome():
            content = _timed_out(t, tctx, late.seconds)
            return content if content is not None else _reconciled(t, resolve(_reconcile(t, args, tctx)), late.seconds)
    except BaseException as exc:  # contained or re-raised, by _contained's rule
        if not _contained(exc):
            raise
        return _raised(ctx, t, tctx.call_id, exc)
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
        with _unknown_outcome():
            content = _timed_out(t, tctx, late.seconds)
            if content is not None:
                return content
            found = _reconcile(t, args, tctx)
            return _reconciled(t, await found if inspect.isawaitable(found) else found, late.seconds)
    except BaseException as exc:  # contained or re-raised, by _contained's rule
        if not _contained(exc) or _cancelling():
            raise
        return _raised(ctx, t, tctx.call_id, exc)
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
    telemetry.record_error(None, "timeout")  # the call's execute_tool span
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


@contextlib.contextmanager
def _unknown_outcome() -> Iterator[None]:
    """A signal raised for a call abandoned past its timeout (its policy's, or its ``reconcile``'s) is marked so.

    The call stays "started" (see ``execute._ended_without_result``): whether it took effect is what is
    unknown, so the attempt that runs it again applies its policy, never the call itself blindly.
    """
    try:
        yield
    except (FailJob, RetryLater, WaitForInput) as signal:
        setattr(signal, "unknown_outcome", True)  # noqa: B010 - a mark on the exception, read with getattr
        raise


def _reconcile(t: Tool, args: BaseModel, tctx: ToolContext) -> Any:
    assert t.reconcile is not None  # on_interrupted="reconcile" requires one (Tool.__init__)
    return t.reconcile(args, tctx)


def _reconciled(t: Tool, found: Any, timeout: float) -> str:
    if found is None:
        # Not run again: the abandoned call may still be running and take effect.
        return f"Error: tool {t.name!r} timed out after {timeout:g} s; reconcile found no effect of it yet"
    return _content(t, found)


def _raised(ctx: PhaseContext[Any], t: Tool, call_id: str, exc: BaseException) -> str:
    """What the model is told of a call that raised; the job's log and the process's log say it too (the
    latter with the traceback at DEBUG), so a tool that crashes is not known to the model alone."""
    telemetry.record_error(None, exc)  # the call's execute_tool span
    said = f"Error: tool {t.name!r} raised {type(exc).__name__}: {mask(message_of(exc))}"  # stored, sent, logged
    # The traceback at DEBUG only: its chained causes may quote what the tool's message leaves out (a URL
    # with a key), which the model, the transcript and the job's log never see.
    logger.warning("job %s: tool %r (call %r) raised %s; the model is told so", ctx.job_id, t.name, call_id,
                   type(exc).__name__, exc_info=exc if logger.isEnabledFor(logging.DEBUG) else None)
    ctx.log(f"{said[:_LOGGED]}{'...' if len(said) > _LOGGED else ''} (call {call_id!r}; the model is told so)",
            level="warn")
    return said


def _content(t: Tool, value: Any) -> str:
    try:
        return result_content(value)
    except StateNotSerializableError as exc:
        detail = exc.__cause__ or exc
        return f"Error: tool {t.name!r} returned a value that is not JSON: {detail}"
