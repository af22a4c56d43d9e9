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
``SimulatedCrash`` is one). When several calls of one turn raise signals, one
ends the turn: ``FailJob``, else ``RetryLater``, else a wait for a person, else
the waits for child runs as one (``execute._signal_of_turn`` says why). Either way the shared thread pool and this
thread's event loop are left with nothing of the turn still pending, so the
next job run by the same thread starts clean.

The package holds it in four modules: :mod:`~phases.tool_runner.execute` (the ledger and the
calls run together), :mod:`~phases.tool_runner.gates` (what decides whether a call runs),
:mod:`~phases.tool_runner.invoke` (one call run) and :mod:`~phases.tool_runner.calls` (a call
as the model wrote it).
"""

from __future__ import annotations

from phases.tool_runner.calls import arguments_digest, tool_message
from phases.tool_runner.calls import tool_context as tool_context
from phases.tool_runner.execute import run_tools

__all__ = ["arguments_digest", "run_tools", "tool_message"]
