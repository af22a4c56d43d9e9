"""``App``: the registry a worker loads by import path (``pipelines worker --app myapp.agents:app``).

A job names its pipeline; the app maps that name to phases, so one worker
serves many pipelines and agents. The web side uses the same object to start
jobs, so an agent is described once.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from adapters.base import Scheduler, Storage
from pipelines.errors import ConfigurationError, InvalidPipelineError, PipelineError
from pipelines.leases import check_lease_seconds
from pipelines.models import JobRecord
from pipelines.phase import Phase
from pipelines.runner import DEFAULT_LEASE_SECONDS, AdvanceResult, advance_job, phase_map
from pipelines.start import RetryMode, start_job

__all__ = ["App", "PipelineSource", "load_app"]

logger = logging.getLogger("pipelines")


class PipelineSource(Protocol):
    """Something that names a pipeline and builds its phases (an ``Agent`` does)."""

    @property
    def name(self) -> str: ...

    def phases(self) -> list[Phase]: ...


class App:
    """Pipelines and agents by name, bound to one storage and one scheduler.

    ``App(storage=..., scheduler=..., pipelines={"etl": [...]}, agents=[support])``
    """

    def __init__(
        self,
        *,
        storage: Storage,
        scheduler: Scheduler,
        pipelines: Mapping[str, Sequence[Phase]] | None = None,
        agents: Iterable[PipelineSource] = (),
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        continue_for: float = 0.0,
    ) -> None:
        self.storage = storage
        self.scheduler = scheduler
        self.lease_seconds = check_lease_seconds(lease_seconds)
        # How long a worker may keep running a job's next due phases itself
        # before handing the job back to the queue (see runner.try_advance).
        self.continue_for = continue_for
        self._pipelines: dict[str, list[Phase]] = {}
        self._maps: dict[str, dict[str, Phase]] = {}
        self._agents: dict[str, PipelineSource] = {}
        for name, phases in (pipelines or {}).items():
            self.add_pipeline(name, phases)
        for agent in agents:
            self.add_agent(agent)
        scheduler.bind(self.advance)

    # --- registry ----------------------------------------------------------
    def add_pipeline(self, name: str, phases: Sequence[Phase]) -> None:
        """Register ``phases`` under ``name`` (validated now, not at the first job)."""
        if not isinstance(name, str) or not name:
            raise InvalidPipelineError(f"a pipeline needs a non-empty name, got {name!r}")
        if name in self._pipelines:
            raise InvalidPipelineError(f"pipeline {name!r} is registered twice")
        self._maps[name] = phase_map(phases)
        self._pipelines[name] = list(phases)

    def add_agent(self, agent: PipelineSource) -> None:
        """Register an agent; its pipeline is named after it."""
        self.add_pipeline(agent.name, agent.phases())
        self._agents[agent.name] = agent

    @property
    def names(self) -> list[str]:
        return sorted(self._pipelines)

    @property
    def agents(self) -> dict[str, PipelineSource]:
        return dict(self._agents)

    def phases_for(self, pipeline: str) -> list[Phase]:
        try:
            return self._pipelines[pipeline]
        except KeyError:
            known = ", ".join(self.names) or "none"
            raise InvalidPipelineError(f"unknown pipeline {pipeline!r}; this app has: {known}") from None

    # --- jobs --------------------------------------------------------------
    def run_pipeline(
        self,
        name: str,
        *,
        job_id: str,
        initial_state: Any = None,
        retry_mode: RetryMode | None = None,
        initial_phase: str | None = None,
    ) -> None:
        """Start (or retry) a job of the registered pipeline ``name``."""
        phases = self.phases_for(name)
        start_job(job_id=job_id, phase_names=[p.name for p in phases], storage=self.storage,
                  scheduler=self.scheduler, initial_state=initial_state, retry_mode=retry_mode,
                  initial_phase=initial_phase, pipeline=name)

    def advance(self, job_id: str) -> None:
        """Advance ``job_id`` with the pipeline its record names (what workers call)."""
        self.try_advance(job_id)

    def try_advance(self, job_id: str) -> AdvanceResult:
        """Advance ``job_id`` with its own pipeline and say what happened.

        The pipeline is looked up from the record loaded with the lease (one
        round trip); a record naming a pipeline this app lacks raises
        :class:`InvalidPipelineError`, with the lease released.
        """

        def phases_for(record: JobRecord) -> dict[str, Phase]:
            pmap = self._maps.get(record.pipeline)
            if pmap is None:
                self.phases_for(record.pipeline)  # raises, naming what this app has
            assert pmap is not None
            return pmap

        return advance_job(job_id, phases_for, storage=self.storage, scheduler=self.scheduler,
                           lease_seconds=self.lease_seconds, continue_for=self.continue_for)

    def advance_due(self, *, grace: float = 0.0, limit: int = 1000) -> list[tuple[str, AdvanceResult]]:
        """Advance every running job that is due (for at least ``grace`` seconds) and not leased: the sweep (I7).

        A periodic sweep next to live workers uses a grace period so it only
        picks up jobs the queue failed to deliver (a lost message, a dead
        worker) instead of racing the queue for every fresh turn.
        """
        done: list[tuple[str, AdvanceResult]] = []
        for job_id in self.storage.due_jobs(self.scheduler.now() - grace, limit=limit):
            try:
                done.append((job_id, self.try_advance(job_id)))
            except PipelineError as exc:
                # One bad job (an unknown pipeline, a corrupt record) must not stop the sweep.
                done.append((job_id, AdvanceResult.UNKNOWN))
                logger.error("sweep: job %s: %s", job_id, exc)
        return done


def load_app(path: str) -> App:
    """Import ``"package.module:attribute"`` and return the :class:`App` it names.

    The attribute may be an ``App`` or a function of no arguments returning
    one. Every failure is a :class:`ConfigurationError` naming the path.
    """
    if not isinstance(path, str):
        raise ConfigurationError(f"app path must be a string like 'package.module:app', got {type(path).__name__}")
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr or module_name.startswith("."):
        raise ConfigurationError(f"app path must look like 'package.module:app', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except PipelineError:
        raise  # already says what is wrong (a bad Redis URL in the app module, say)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for app {path!r}: {exc}") from exc
    except Exception as exc:  # an app module that fails at import is a configuration problem
        raise ConfigurationError(f"cannot load app {path!r}: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    if inspect.isfunction(obj):
        if any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in inspect.signature(obj).parameters.values()):
            raise ConfigurationError(f"{path!r} is a function that needs arguments; it must return an App")
        try:
            obj = obj()  # a factory function returning the app
        except PipelineError:
            raise
        except Exception as exc:
            raise ConfigurationError(f"the app factory {path!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, App):
        raise ConfigurationError(f"{path!r} is a {type(obj).__name__}, not a pipelines.App")
    return obj
