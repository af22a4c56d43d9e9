"""What user code may raise inside a turn without taking the worker down with it.

A phase, a model, a migration, a tool: user code, and whatever it raises ends
as data (the job's error, or for a tool a result the model reads), ``SystemExit``,
``GeneratorExit`` and ``asyncio.CancelledError`` included: a library that calls
``sys.exit()`` must not end a worker loop that serves every other job (I9).

Two kinds pass through: ``KeyboardInterrupt`` (someone is stopping the
process), and a ``BaseException`` subclass from outside the standard library,
which by convention says "the process is going down here" (the crash
harness's ``SimulatedCrash``) and must not be turned into a job's error.
"""

from __future__ import annotations

import asyncio

from pipelines.engine.masking import mask

__all__ = ["contained", "describe", "message_of"]

_CONTAINED = (Exception, SystemExit, GeneratorExit, asyncio.CancelledError)


def contained(exc: BaseException) -> bool:
    """Whether ``exc``, raised by user code, ends as data (else it must propagate)."""
    if isinstance(exc, KeyboardInterrupt):
        return False
    if isinstance(exc, BaseExceptionGroup):
        return all(contained(e) for e in exc.exceptions)
    return isinstance(exc, _CONTAINED)


def message_of(exc: BaseException) -> str:
    """``str(exc)``, or a note that it could not be read: user code's exception may raise from ``__str__``."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 - whatever its __str__ raised, the job still says what failed
        return f"(its message could not be read: {type(inner).__name__})"


def describe(exc: BaseException) -> str:
    """``"<type>: <message>"``, or the type alone for an exception without one (``sys.exit()``).

    Credentials in the message are masked (:func:`~pipelines.engine.masking.mask`): the text is stored (a job's
    error) and logged, and a user's exception may quote a key, a token or an address with its password."""
    text = mask(message_of(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
