"""``Agent`` and ``run_agent``: the agent loop's public face.

An ``Agent`` holds what describes an agent once — model, tools, system
prompt, limits — and serves both the web side (``agent.run(...)`` /
``run_agent(...)``, which only write and enqueue) and the worker side
(``agent.phases()``, registered in an :class:`~pipelines.app.App`). Model
settings (api keys included) live in code or the environment, never in the
stored job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from adapters.base import Scheduler, Storage
from phases.agent_turn import TURN_PHASE, AgentState, PrepareTurn, build_agent_phase
from phases.model import Model
from phases.stop import StopCondition
from phases.tools import Tool
from pipelines.errors import InvalidInputError, JobNotFoundError
from pipelines.leases import check_lease_seconds
from pipelines.models import JobStatus, Message
from pipelines.phase import Phase
from pipelines.runner import DEFAULT_LEASE_SECONDS, advance_phase
from pipelines.start import RetryMode, start_job

__all__ = ["Agent", "build_agent_phase", "run_agent"]


class Agent:
    """An agent described once: ``Agent(name=, model=, tools=, system=, max_turns=, ...)``.

    ``name`` is the pipeline name stored on its jobs: workers find the agent by it.
    """

    def __init__(
        self,
        *,
        name: str = "agent",
        model: str | Model,
        tools: Sequence[Tool] | Mapping[str, Tool] | None = (),
        system: str | None = None,
        max_turns: int = 10,
        stop_when: StopCondition | Sequence[StopCondition] | None = None,
        model_params: Mapping[str, Any] | None = None,
        output_schema: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        prepare_turn: PrepareTurn | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"an agent needs a non-empty name, got {name!r}")
        self._name = name
        self.lease_seconds = check_lease_seconds(lease_seconds)
        self.output_schema = output_schema
        # Whether workers should import litellm before forking (pipelines worker).
        self.uses_litellm = isinstance(model, str) or type(model).__module__ == "phases.litellm_model"
        # Built now, so a bad tool or limit fails at definition, not at the first job.
        self._phase = build_agent_phase(model=model, tools=tools, system=system, max_turns=max_turns,
                                        stop_when=stop_when, model_params=model_params, output_schema=output_schema,
                                        max_tokens=max_tokens, max_cost_usd=max_cost_usd, prepare_turn=prepare_turn)

    def __repr__(self) -> str:
        return f"Agent(name={self._name!r})"

    @property
    def name(self) -> str:
        return self._name

    def result(self, job_id: str, *, storage: Storage) -> Any:
        """The job's result: an ``output_schema`` instance when the agent has one, else the final text.

        ``None`` while the job has not completed.
        """
        record = storage.get_job(job_id)
        if record is None:
            raise JobNotFoundError(f"job {job_id!r} does not exist")
        if record.status is not JobStatus.COMPLETE or record.result is None:
            return None
        if self.output_schema is not None and isinstance(record.result, dict):
            return self.output_schema.model_validate(record.result)
        return record.result

    def phases(self) -> list[Phase]:
        """The agent's pipeline: one ``turn`` phase that reschedules itself."""
        return [self._phase]

    def run(
        self,
        *,
        job_id: str,
        messages: Sequence[Message | str] = (),
        storage: Storage,
        scheduler: Scheduler,
        retry_mode: RetryMode | None = None,
    ) -> None:
        """Write the job (with ``messages``) and enqueue its first turn. Returns at once.

        On a ``complete`` job id, the conversation goes on: the new messages are
        appended to the kept transcript and more turns run. On an errored job,
        ``retry_mode`` works as in ``run_pipeline``.
        """
        phases = self.phases()

        def advance(job_id: str) -> None:
            advance_phase(job_id=job_id, phases=phases, storage=storage, scheduler=scheduler,
                          lease_seconds=self.lease_seconds)

        scheduler.bind(advance, pipeline=self._name)
        start_job(job_id=job_id, phase_names=[TURN_PHASE], storage=storage, scheduler=scheduler,
                  initial_state=AgentState().model_dump(), retry_mode=retry_mode, pipeline=self._name,
                  messages=_as_messages(messages), continue_completed=True)


def _as_messages(messages: Sequence[Message | str]) -> list[Message]:
    if isinstance(messages, str | dict) or not isinstance(messages, Sequence):
        raise InvalidInputError(
            f"initial_messages must be a list of messages (or strings), got {type(messages).__name__}")
    out: list[Message] = []
    for m in messages:
        if isinstance(m, str):
            out.append({"role": "user", "content": m})
        elif isinstance(m, dict) and isinstance(m.get("role"), str):
            out.append(dict(m))
        else:
            raise InvalidInputError(f"a message must be a string or a dict with a 'role', got {m!r:.80}")
    return out


def run_agent(
    *,
    job_id: str,
    model: str | Model,
    tools: Sequence[Tool] | Mapping[str, Tool] | None = (),
    system: str | None = None,
    initial_messages: Sequence[Message | str] = (),
    storage: Storage,
    scheduler: Scheduler,
    max_turns: int = 10,
    stop_when: StopCondition | Sequence[StopCondition] | None = None,
    model_params: Mapping[str, Any] | None = None,
    retry_mode: RetryMode | None = None,
    name: str = "agent",
    output_schema: type[BaseModel] | None = None,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    prepare_turn: PrepareTurn | None = None,
) -> None:
    """Write an agent job and enqueue its first turn; returns at once.

    The same as ``Agent(...).run(...)``; use an :class:`Agent` when workers in
    other processes must rebuild it (``App(agents=[agent])``).
    """
    agent = Agent(name=name, model=model, tools=tools, system=system, max_turns=max_turns, stop_when=stop_when,
                  model_params=model_params, output_schema=output_schema, max_tokens=max_tokens,
                  max_cost_usd=max_cost_usd, prepare_turn=prepare_turn)
    agent.run(job_id=job_id, messages=initial_messages, storage=storage, scheduler=scheduler, retry_mode=retry_mode)
