"""The App's registry: its pipelines, agents and output schemas, by name.

A job names its pipeline; the registry maps that name to phases, so one
worker serves many pipelines and agents. What the App needs of an agent is
:class:`PipelineSource` (an :class:`~pipelines.agent.Agent` is one); the
registry never imports the agent module, so the App sits below it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

from pipelines.engine import versions
from pipelines.engine.errors import ConfigurationError, InvalidInputError, InvalidPipelineError
from pipelines.engine.models import JobRecord
from pipelines.engine.phase import Phase, Pipeline
from pipelines.engine.runner import as_pipeline

if TYPE_CHECKING:
    from pipelines.app.face import App

__all__ = ["PipelineSource", "Registry", "TitledSource", "named_pipelines"]

logger = logging.getLogger("pipelines")


def named_pipelines(pipelines: object) -> list[tuple[str, Any]]:
    """``App(pipelines=...)`` as (name, phases) pairs; a list of phases or other non-mapping is refused."""
    if pipelines is None:
        return []
    if not isinstance(pipelines, Mapping):
        raise ConfigurationError(f"pipelines must map names to phases ({{'etl': [Phase(...), ...]}}), got "
                                 f"{type(pipelines).__name__}")
    return list(pipelines.items())


@runtime_checkable
class PipelineSource(Protocol):
    """Something that names a pipeline and builds it (an :class:`~pipelines.agent.Agent` does)."""

    @property
    def name(self) -> str: ...

    @property
    def uses_litellm(self) -> bool:
        """Whether its model calls litellm (workers then import and warm it before forking)."""
        ...

    def pipeline(self) -> Pipeline: ...

    @property
    def takes_messages_while_running(self) -> bool:
        """Whether ``app.send`` may queue messages for a run in progress (else it is refused)."""
        ...

    def start_run(self, job_id: str, messages: Any, options: Mapping[str, Any], app: App) -> dict[str, Any]:
        """Keyword arguments for :func:`~pipelines.engine.start.start_job` of one run (messages, state, options)."""
        ...

    def typed_result(self, record: JobRecord, app: App) -> Any:
        """The job's result as its users expect it (an output schema instance, say)."""
        ...

    def accept_schemas(self, schemas: Mapping[str, type[BaseModel]]) -> None:
        """Learn the output schemas registered on the App (per-run ``output_schema`` names them)."""
        ...


@runtime_checkable
class TitledSource(Protocol):
    """A source whose conversations may get a title from a title job (an Agent with a ``title_agent``)."""

    @property
    def titles_conversations(self) -> bool:
        """Whether its runs are titled by a title job (see :mod:`phases.titles`)."""
        ...


class Registry:
    """Pipelines and agents by name, and the output schemas runs may name.

    ``version``: the App's version, given to a pipeline registered without
    one when it is a version (see :mod:`pipelines.engine.versions`).
    """

    def __init__(self, version: str | None) -> None:
        self.version = version
        self.pipelines: dict[str, Pipeline] = {}
        self.agents: dict[str, PipelineSource] = {}
        self.schemas: dict[str, type[BaseModel]] = {}

    def add_schema(self, schema: type[BaseModel]) -> None:
        """Register an output schema runs may name (by its class name)."""
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            raise InvalidInputError(f"schemas must be pydantic model classes, got {schema!r}")
        if self.schemas.get(schema.__name__, schema) is not schema:
            raise InvalidInputError(f"two schemas named {schema.__name__!r}")
        self.schemas[schema.__name__] = schema
        for agent in self.agents.values():
            agent.accept_schemas(self.schemas)

    def add_pipeline(self, name: str, phases: Sequence[Phase] | Pipeline, *, replace: bool = False) -> None:
        """Register ``phases`` (or a :class:`Pipeline`) under ``name``, validated now, not at the first job."""
        if not isinstance(name, str) or not name:
            raise InvalidPipelineError(f"a pipeline needs a non-empty name, got {name!r}")
        if name in self.pipelines and not replace:
            raise InvalidPipelineError(f"pipeline {name!r} is registered twice")
        pipeline = as_pipeline(phases)
        if pipeline.version is None and versions.is_version(self.version):
            # Versioned by default with the app's version (a non-numeric app version leaves jobs unversioned).
            pipeline = dataclasses.replace(pipeline, version=self.version)
        self.pipelines[name] = pipeline
        self.agents.pop(name, None)
        self._add_children(phase.run for phase in pipeline.phases)

    def add_agent(self, agent: PipelineSource, *, replace: bool = False) -> None:
        """Register an agent; its pipeline is named after it."""
        if not isinstance(agent, PipelineSource):
            raise InvalidInputError(f"agents must be Agent objects, got {type(agent).__name__}")
        if self.agents.get(agent.name) is agent:
            return
        self.add_pipeline(agent.name, agent.pipeline(), replace=replace)
        self.agents[agent.name] = agent
        agent.accept_schemas(self.schemas)
        self._add_children(_tools_of(agent))
        # Its title jobs run on whichever worker takes them (another process, after a restart): that worker knows
        # the title agent only if it is registered with the agent, not when a run first starts one.
        title = getattr(getattr(agent, "config", None), "title_agent", None)
        if isinstance(title, PipelineSource) and self.agents.get(title.name) is not title:
            if title.name == agent.name or (title.name in self.pipelines and not replace):
                # As before it was registered here: this agent's conversations get no title (the title job's
                # start is refused and logged), the app is built all the same.
                logger.warning("agent %r: its title agent is not registered: the name %r is taken by another "
                               "agent or pipeline (give the title agent a name of its own)", agent.name, title.name)
            else:
                self.add_agent(title, replace=replace)

    def _add_children(self, holders: Iterable[Any]) -> None:
        """Register the agents that tools and phases run as child jobs, so workers know their pipelines."""
        for holder in holders:
            child = getattr(holder, "child_agent", None)
            if child is not None and self.agents.get(child.name) is not child:
                self.add_agent(child)

    @property
    def names(self) -> list[str]:
        """Registered pipeline names (agents included), sorted."""
        return sorted(self.pipelines)

    def pipeline(self, name: str) -> Pipeline:
        """The pipeline registered as ``name``; :class:`InvalidPipelineError` naming what exists otherwise."""
        try:
            return self.pipelines[name]
        except KeyError:
            known = ", ".join(self.names) or "none"
            raise InvalidPipelineError(f"unknown pipeline {name!r}; this app has: {known}") from None

    def agent(self, agent: str | PipelineSource) -> PipelineSource:
        """The agent named ``agent``, or ``agent`` itself, registered now if it was not yet."""
        if isinstance(agent, str):
            found = self.agents.get(agent)
            if found is None:
                known = ", ".join(sorted(self.agents)) or "none"
                raise InvalidPipelineError(f"unknown agent {agent!r}; this app has: {known}")
            return found
        self.add_agent(agent)  # an Agent object not registered yet is registered now
        if self.agents.get(agent.name) is not agent:
            raise ConfigurationError(f"another agent named {agent.name!r} is registered on this app")
        return agent


def _tools_of(agent: Any) -> list[Any]:
    """The tools an agent declares up front (a tools provider's are known only per run)."""
    config = getattr(agent, "config", None)
    tmap = getattr(config, "tmap", None) if getattr(config, "tools_provider", None) is None else None
    return list(tmap.values()) if isinstance(tmap, Mapping) else []
