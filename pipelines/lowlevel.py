"""The low-level layer, with cl-pipelines' names: ``run_pipeline``, ``run_agent`` (and, in the runner,
``advance_phase``; in the agent turn, ``build_agent_phase``).

One calling convention: keyword-only, the adapters passed explicitly, a
:class:`~pipelines.handle.RunHandle` returned. Each call goes through the App
attached to the scheduler (``App.for_adapters``), so an App's settings
(``lease_seconds``, ``continue_for``) are never replaced behind its back. An
in-process scheduler keeps its App alive itself; with a queue scheduler the
App is found while something holds it, and a call with none held gets a new
App with the defaults.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from adapters.base import Scheduler, Storage
from phases.model import Model
from pipelines.agent import Agent, as_messages
from pipelines.app import App
from pipelines.engine.errors import InvalidInputError
from pipelines.engine.models import Message
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner import advance_under_lease, as_pipeline
from pipelines.engine.start import RetryMode
from pipelines.handle import RunHandle

__all__ = ["advance_phase", "run_agent", "run_pipeline"]

_UNSET: Any = object()


def run_pipeline(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    initial_state: Any = None,
    retry_mode: RetryMode | None = None,
    initial_phase: str | None = None,
    pipeline: str = "default",
    state_model: type[BaseModel] | None = None,
) -> RunHandle:
    """Write the job to storage and enqueue its first advance; returns at once.

    ``phases`` are registered as ``pipeline`` on the scheduler's App (workers
    of a queue scheduler need the same name in their own App). A new
    ``job_id`` starts at ``initial_phase`` (default: the first phase). For a
    job that ended in ``error`` or ``cancelled``, ``retry_mode="resume"``
    (the default when it has a checkpoint) continues from the checkpoint;
    ``"full"`` restarts from the first phase and ``initial_state``, cutting
    the transcript back to where this run began. ``state_model`` declares the
    state's pydantic model (phases then see it typed). A running, waiting or
    paused job raises :class:`~pipelines.engine.errors.JobConflictError`. Bad input
    raises before anything is written.
    """
    app = App.for_adapters(storage, scheduler)
    app.add_pipeline(pipeline, as_pipeline(phases, state_model), replace=True)
    return app.run_pipeline(pipeline, job_id=job_id, initial_state=initial_state, retry_mode=retry_mode,
                            initial_phase=initial_phase)


def run_agent(
    *,
    job_id: str,
    model: str | Model,
    storage: Storage,
    scheduler: Scheduler,
    messages: Sequence[Message | str] = (),
    initial_messages: Any = _UNSET,
    retry_mode: RetryMode | None = None,
    name: str = "agent",
    **options: Any,
) -> RunHandle:
    """Write an agent job and enqueue its first turn; returns at once.

    The same as ``Agent(name=name, model=model, **options).run(...)``; the
    options are the :class:`Agent`'s. ``initial_messages`` is cl-pipelines'
    spelling of ``messages`` (give one or the other). Use an :class:`Agent`
    registered on an App when workers in other processes must rebuild it.
    """
    if initial_messages is not _UNSET:
        if messages:
            raise InvalidInputError("give messages or initial_messages (its cl-pipelines alias), not both")
        messages = as_messages(initial_messages, name="initial_messages")
    agent = Agent(name=name, model=model, **options)
    return agent.run(job_id=job_id, messages=messages, storage=storage, scheduler=scheduler, retry_mode=retry_mode)


def advance_phase(
    *,
    job_id: str,
    phases: Sequence[Phase] | Pipeline,
    storage: Storage,
    scheduler: Scheduler,
    lease_seconds: float | None = None,
    state_model: type[BaseModel] | None = None,
) -> None:
    """Run the job's next phase once, if it is running, due and not leased (else a no-op).

    Safe to call any number of times, from any number of processes (I6): what a cron runs. A
    phase's exception never escapes: it is recorded on the job as status ``error`` (I9).
    ``state_model`` (or a :class:`Pipeline` with ``state=``) makes the phases see the state as that
    pydantic model. Through the App attached to the scheduler: its lease (``lease_seconds``, unless
    given here), its ``max_interrupted_turns``, its flow control (rate limits, concurrency keys) and its
    environment (child runs, callbacks) hold as for a worker's turn. (``pipelines.engine.runner.advance_phase`` is the
    engine's own, with none of an App's settings.)
    """
    app = App.for_adapters(storage, scheduler)
    pipeline = as_pipeline(phases, state_model)
    advance_under_lease(job_id, lambda record: pipeline, storage=storage, scheduler=scheduler,
                        lease_seconds=app.lease_seconds if lease_seconds is None else lease_seconds, env=app.env,
                        max_interrupted_turns=app.max_interrupted_turns)
