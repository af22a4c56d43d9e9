"""A phase that waits for a person's input: :func:`wait_for_input`, and the keys ``App.supply_input`` writes.

The input goes into the job's open checkpoint (``checkpoint.inputs``), which a phase's journal is read
from, so the phase that waited runs again and finds it: a step's result a person supplied. A crash after
that re-runs the phase from the same checkpoint and reads the same input; a full retry starts without it.
"""

from __future__ import annotations

from typing import Any

from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import JSONValue
from pipelines.engine.phase.outcomes import WaitForInput

__all__ = ["INPUT", "check_input_key", "input_key", "wait_for_input"]

INPUT = "input"
"""``record.waiting["kind"]`` of a job whose phase waits for input (``record.waiting["key"]`` names it)."""


def check_input_key(key: object) -> str:
    """``key`` if it names an input: a non-empty string of at most 200 characters."""
    if not isinstance(key, str) or not key or len(key) > 200:
        raise InvalidInputError(f"an input's key must be a non-empty string of at most 200 characters, got {key!r:.80}")
    return key


def input_key(key: str) -> str:
    """The journal key a supplied input is kept under (beside the phase's own steps, never one of them)."""
    return f"{INPUT}:{check_input_key(key)}"


def wait_for_input(ctx: Any, key: str, reason: str) -> JSONValue:
    """The value a person supplied as ``key`` for this job (``app.supply_input(job_id, key, value)``).

    Until one is supplied, raises :class:`WaitForInput` with ``reason``: the job parks in ``waiting``
    (``record.waiting`` holds ``reason``, ``kind="input"`` and ``key``) and this phase runs again once
    the input is there, when this returns it. Work the phase did before the call is journaled with
    ``ctx.step`` as usual, so it is not repeated.
    """
    found, value = ctx.recorded(input_key(key))
    if found:
        return value
    raise WaitForInput(reason, details={"kind": INPUT, "key": key})
