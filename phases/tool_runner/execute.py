"""Running a turn's calls: the ledger (started, done), then one call inline or all at once, each journaled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import os
from typing import Any

from phases import journal
from phases.tool_runner.calls import _is_async, _policy, journal_result, storable_result, tool_message
from phases.tool_runner.gates import _apply_interrupt_policies, _check_approvals, _refuse_extra_children
from phases.tool_runner.invoke import _cancelling, _invoke_async, _invoke_sync
from phases.tools import Tool, check_timeout
from pipelines.engine import children
from pipelines.engine._aio import run_sync
from pipelines.engine.models import Message
from pipelines.engine.phase import FailJob, PhaseContext, RetryLater, WaitForInput

__all__ = ["run_tools"]

# Shared by every turn in the process: tool calls are I/O-bound, and a pool
# per turn would cost thread start-up on the hot path.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="pipelines-tool")


def _new_pool_after_fork() -> None:
    # A forked child inherits the executor object but none of its threads.
    global _POOL
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="pipelines-tool")


os.register_at_fork(after_in_child=_new_pool_after_fork)

def run_tools(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int, *,
              default_timeout: float | None = None, before_commit: bool = False) -> list[Message]:
    """Run a turn's tool calls (ids unique, as the agent turn makes them) and return their tool messages.

    Each result is journaled as ``tool:<call id>``, so a re-run after a crash
    runs only the calls not done. ``default_timeout`` (seconds) bounds every
    call of a tool without a ``timeout`` of its own; see :class:`Tool`.
    ``before_commit``: the caller runs nothing with effects outside the job
    between these calls and its commit, so the journal write of a turn's one
    call need not wait for its reply (``PhaseContext.record``).
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
            _execute(ctx, tmap, pending, turn, default_timeout, before_commit)
    return [tool_message(c, storable_result(c, ctx.recorded(journal.tool_key(c['id']))[1])) for c in calls]


def _execute(ctx: PhaseContext[Any], tmap: dict[str, Tool], calls: list[dict[str, Any]], turn: int,
             default_timeout: float | None, before_commit: bool = False) -> None:
    if len(calls) == 1 and not _is_async(tmap, calls[0]):
        # The common case runs inline: no event loop, no thread hop. Its write is the turn's last before
        # the commit when the caller says so (several calls run at once, each journaled as it ends).
        try:
            content = _invoke_sync(ctx, tmap, calls[0], turn, default_timeout)
        except _SIGNALS as signal:
            if not getattr(signal, "unknown_outcome", False):
                _ended_without_result(ctx, calls)
            raise
        journal_result(ctx, calls[0], content, before_commit)
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
        fatal = [f for f in failures if not isinstance(f, _SIGNALS)]
        if not fatal:
            _ended_without_result(ctx, [c for c, o in zip(calls, outcomes, strict=True)
                                        if isinstance(o, _SIGNALS) and not getattr(o, "unknown_outcome", False)])
        raise fatal[0] if fatal else _signal_of_turn(failures)


_SIGNALS = (FailJob, RetryLater, WaitForInput)


def _ended_without_result(ctx: PhaseContext[Any], calls: list[dict[str, Any]]) -> None:
    """Calls whose tool ended by raising a signal (retry later, wait, fail the job) were not interrupted mid-call.

    Not a call the runner abandoned past its timeout (``unknown_outcome`` on the signal): whether that one
    took effect is unknown, and its policy applies when the job runs it again.

    Their ids leave the turn's ``tools:started`` mark, so the attempt that runs them again (the retry,
    the wake-up, a retry of the failed job) runs them as the tool asked, not by its ``on_interrupted``
    policy ("fail" would end the job: whether the call took effect is known).
    """
    ids = {c["id"] for c in calls}
    seen, started = ctx.recorded(journal.TOOLS_STARTED)
    if seen and isinstance(started, list) and ids.intersection(started):
        ctx.record(journal.TOOLS_STARTED, [i for i in started if i not in ids])


def _signal_of_turn(failures: list[BaseException]) -> BaseException:
    """The one signal that ends a turn in which several calls raised one: the precedence rule.

    1. ``FailJob``: the job ends now. Any other signal would let the job run the
       turn again (after a delay, a person or its children) and the failing call
       with it, a second time: a tool that fails the job runs once.
    2. ``RetryLater``: every wait is set up again when the retry runs its call
       (a child run is found again by its id, never started twice; a question is
       asked again), while a wait's end would run the retrying call before its delay.
    3. ``WaitForInput`` for a person (an approval, an interrupted call's outcome,
       a tool's own question): asked at once, the children run meanwhile, and the
       turn run again after the answer finds them.
    4. Waits for child jobs, as one wait for them all.

    Within a rank, the first call's signal, in the answer's order.
    """
    for rank in (FailJob, RetryLater):
        first = next((f for f in failures if isinstance(f, rank)), None)
        if first is not None:
            return first
    person = [f for f in failures if not _waits_for_children(f)]
    if person or len(failures) == 1:
        return (person or failures)[0]
    first_wait = failures[0]
    assert isinstance(first_wait, WaitForInput)  # every one here waits for children
    calls = [c for w in failures if isinstance(w, WaitForInput) for c in w.details.get("calls") or []]
    return WaitForInput(f"waiting for {len(calls)} child jobs", call_id=first_wait.call_id,
                        details={**first_wait.details, "calls": calls})


def _waits_for_children(signal: BaseException) -> bool:
    return isinstance(signal, WaitForInput) and signal.details.get("kind") == children.KIND


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
        await loop.run_in_executor(_POOL, journal_result, ctx, call, content)
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
