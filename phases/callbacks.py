"""Lifecycle callbacks: on_start, on_turn_start, on_tool_start, on_tool_end, on_turn_end, on_end.

They run in the worker, agent's first, then the run's own (given per call).
They are **at-least-once**: a turn re-run after a crash or a retry fires its
callbacks again; each gets the attempt number. An exception in one is logged
(a ``warn`` line on the job and the ``pipelines`` logger) and never fails the
turn.

Per-call callbacks are Python callables: they cannot travel to another
worker. The App keeps them in its environment (``RunEnv.callbacks``, handed
to each turn as ``ctx.env``), so they are honoured only with an in-process
scheduler (``MemoryScheduler``); the App refuses them on a queue scheduler
instead of silently dropping them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JSONValue
from pipelines.engine.phase import PhaseContext

__all__ = ["CALLBACKS", "Lifecycle", "check_callbacks", "fire"]

CALLBACKS = ("on_start", "on_turn_start", "on_tool_start", "on_tool_end", "on_turn_end", "on_end")
"""The lifecycle callbacks, in the order a run fires them."""

logger = logging.getLogger("pipelines")


@dataclass(frozen=True)
class Lifecycle:
    """What a callback receives: which moment (``kind``), of which job, turn and attempt, and its data.

    ``data`` by kind: ``on_tool_start`` call_id, tool, arguments; ``on_tool_end``
    call_id, tool, result; ``on_turn_end`` usage, finish_reason; ``on_end``
    usage (the job's total), result, reason.
    """

    kind: str
    job_id: str
    turn: int
    attempt: int
    context: JSONValue = None
    data: dict[str, Any] = field(default_factory=dict)


def check_callbacks(given: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """The callbacks among ``given`` (only known names, each callable), else :class:`InvalidInputError`."""
    out = {}
    for name, fn in given.items():
        if name not in CALLBACKS:
            raise InvalidInputError(f"unknown callback {name!r}; callbacks are {', '.join(CALLBACKS)}")
        if not callable(fn):
            raise InvalidInputError(f"{name} must be callable, got {fn!r:.60}")
        out[name] = fn
    return out


def fire(ctx: PhaseContext[Any], agent_callbacks: Mapping[str, Callable[..., Any] | None], kind: str, *,
         turn: int, context: JSONValue = None, **data: Any) -> None:
    """Call the agent's ``kind`` callback, then the run's; an exception is logged, never raised."""
    run_fn = ctx.env.callbacks.get(ctx.job_id, kind)
    fns = [fn for fn in (agent_callbacks.get(kind), run_fn) if fn is not None]
    if not fns:
        return
    event = Lifecycle(kind=kind, job_id=ctx.job_id, turn=turn, attempt=ctx.attempt, context=context, data=data)
    for fn in fns:
        try:
            fn(event)
        except Exception as exc:  # a callback's failure is reported, never fails the turn
            ctx.log(f"{kind} callback {getattr(fn, '__name__', fn)!r} raised {type(exc).__name__}: {exc}", "warn")
            logger.warning("job %s: %s callback failed", ctx.job_id, kind, exc_info=True)
