"""The runner's entry points: take a job's lease and load it in one call, run its due turns, let the lease go.

``advance_phase`` / ``try_advance`` run a given pipeline; ``advance_under_lease`` (what the App and the
workers call) chooses it from the record. The turns themselves run in :mod:`~pipelines.engine.runner.turn`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from pydantic import BaseModel

from adapters.base import Scheduler, Storage
from pipelines.engine import flow
from pipelines.engine.env import EMPTY_ENV, RunEnv
from pipelines.engine.errors import CorruptRecordError, InvalidInputError
from pipelines.engine.leases import LEASE_KEEPER, check_lease_seconds
from pipelines.engine.models import validate_job_id
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner.interrupted import DEFAULT_MAX_INTERRUPTED_TURNS, check_max_interrupted
from pipelines.engine.runner.results import AdvanceResult
from pipelines.engine.runner.turn import PipelineFor, _LeasedJob
from pipelines.engine.tokens import new_token

__all__ = ["DEFAULT_LEASE_SECONDS", "DEFAULT_MAX_INTERRUPTED_TURNS", "advance_phase", "advance_under_lease",
           "as_pipeline", "check_continue_for", "try_advance"]

DEFAULT_LEASE_SECONDS = 10.0
"""Lease time to live. The lease keeper renews it every third of that while a phase runs, so a killed
worker's lease runs out 6.7-10 s after its death and the worker's sweep re-sends the turn (issue 34)."""

def advance_phase(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    state_model: type[BaseModel] | None = None,
) -> None:
    """Run the job's next phase once, if it is running, due and not leased (else a no-op).

    Safe to call any number of times, from any number of processes (I6). A
    phase's exception never escapes: it is recorded on the job as status
    ``error`` (I9). ``state_model`` (or a :class:`Pipeline` with ``state=``)
    makes the phases see the state as that pydantic model.
    """
    try_advance(job_id=job_id, phases=phases, storage=storage, scheduler=scheduler, lease_seconds=lease_seconds,
                state_model=state_model)


def as_pipeline(phases: Sequence[Phase] | Pipeline, state_model: type[BaseModel] | None = None) -> Pipeline:
    """``phases`` as a :class:`Pipeline` (validated); ``state_model`` declares its state."""
    if isinstance(phases, Pipeline):
        if state_model is not None and phases.state not in (None, state_model):
            raise InvalidInputError("state_model differs from the Pipeline's own state model")
        return phases if state_model is None else Pipeline(phases.phases, state=state_model)
    return Pipeline(phases, state=state_model)


def try_advance(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
    state_model: type[BaseModel] | None = None,
) -> AdvanceResult:
    """``advance_phase`` that says what it did (for the CLI, the sweep and tests).

    ``continue_for`` (seconds, default 0): after a commit whose next phase is
    due at once, keep the lease and run that phase right away instead of a
    queue round trip, until this much time has passed (the turn in progress
    always finishes). A worker then serves one job for at most about that
    long before it goes back to the queue, which keeps jobs fair.
    """
    pipeline = as_pipeline(phases, state_model)
    return advance_under_lease(job_id, lambda record: pipeline, storage=storage, scheduler=scheduler,
                       lease_seconds=lease_seconds, continue_for=continue_for)


def check_continue_for(continue_for: object) -> float:
    """``continue_for`` as seconds: a finite number >= 0, else :class:`InvalidInputError` naming it."""
    if isinstance(continue_for, bool) or not isinstance(continue_for, int | float) or not 0 <= continue_for < math.inf:
        raise InvalidInputError(f"continue_for must be a finite number of seconds >= 0, got {continue_for!r}")
    return float(continue_for)


def advance_under_lease(
    job_id: str,
    pipeline_for: PipelineFor,
    *,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
    continue_for: float = 0.0,
    flow_control: flow.FlowControl | None = None,
    env: RunEnv | None = None,
    max_interrupted_turns: int | None = DEFAULT_MAX_INTERRUPTED_TURNS,
) -> AdvanceResult:
    """``try_advance`` with the pipeline chosen from the record (``App`` resolves it by name).

    One round trip takes the lease and loads the record; ``pipeline_for`` runs
    under the lease, so a job naming an unknown pipeline raises with the lease
    released and nothing written. ``flow_control`` (the App's) gates each turn
    on its concurrency key and is what the agent turn's rate limits read; a
    refused turn is rescheduled, not run (:attr:`AdvanceResult.DEFERRED`).
    ``env``: what the App hands each phase (:class:`~pipelines.engine.env.RunEnv`); its ``flow`` is the
    one used when ``flow_control`` is not given.
    ``max_interrupted_turns``: a job whose turn lost its lease without committing this many times in a row
    (each worker that ran it died) is failed instead of run again (:mod:`~pipelines.engine.runner.interrupted`);
    ``None``: never.
    """
    validate_job_id(job_id)
    check_lease_seconds(lease_seconds)
    check_continue_for(continue_for)
    limit = check_max_interrupted(max_interrupted_turns)
    owner = new_token()
    try:
        record = storage.acquire_lease(job_id, owner, lease_seconds)
    except CorruptRecordError:
        # The lease may have been taken before the record failed to parse:
        # leave no lease behind a record that a person must repair first.
        storage.release_lease(job_id, owner)
        raise
    if record is None:
        return AdvanceResult.BUSY if storage.get_job(job_id) is not None else AdvanceResult.UNKNOWN
    held = LEASE_KEEPER.hold(storage, job_id, owner, lease_seconds)
    # Every advance this turn schedules goes to the queue of the run's priority.
    turn = _LeasedJob(storage, flow.with_priority(scheduler, flow.priority_of(record)), owner,
                 time.monotonic() + continue_for if continue_for > 0 else None)
    env = env if env is not None else EMPTY_ENV
    if flow_control is not None and flow_control is not env.flow:
        env = replace(env, flow=flow_control)
    turn.env = env
    turn.flow = env.active_flow()
    turn.lease = held
    turn.max_interrupted = limit
    try:
        return turn.run(record, pipeline_for)
    finally:
        LEASE_KEEPER.drop(held)
        if not turn.released:
            storage.release_lease(job_id, owner)
