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

The package holds it in four modules: :mod:`~phases.agent_turn.turn` (the phase itself),
:mod:`~phases.agent_turn.model_call` (its model call), :mod:`~phases.agent_turn.ending`
(stop or go on) and :mod:`~phases.agent_turn.plan` (what a turn is set up with).
"""

from __future__ import annotations

from phases.agent_turn.plan import TURN_PHASE, AgentState, PrepareTurn, TurnPlan, resolve_model
from phases.agent_turn.turn import AgentTurn, build_agent_phase

__all__ = ["TURN_PHASE", "AgentState", "AgentTurn", "PrepareTurn", "TurnPlan", "build_agent_phase", "resolve_model"]
