"""What a phase is and how phases make a pipeline: :class:`Phase`, :class:`Pipeline`, and a state read typed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from pipelines.engine import versions
from pipelines.engine.errors import InvalidPipelineError, StateValidationError

if TYPE_CHECKING:
    from pipelines.engine.phase.context import PhaseContext
    from pipelines.engine.phase.outcomes import Outcome

__all__ = ["Phase", "PhaseFn", "Pipeline", "validate_state"]

PhaseFn = Callable[["PhaseContext[Any]"], "Outcome | Awaitable[Outcome]"]

@dataclass(frozen=True)
class Phase:
    """A named unit of work. ``run(ctx)`` may be ``def`` or ``async def``.

    ``state_model``: when given, the stored state is validated into this
    pydantic model before ``run`` sees it (a stored state that no longer
    validates fails the job with a clear error instead of a crash deep inside).

    ``copy_state`` (default ``True``): ``run`` gets its own copy of the stored
    state, and the runner keeps a copy of the state it returns, so changing a
    state in place (or a dict after returning it) never changes a record a
    storage holds. A phase that does neither (the agent turn: it reads its state
    and returns a new one) may set ``False`` and save the copies.
    """

    name: str
    run: PhaseFn
    state_model: type[BaseModel] | None = None
    copy_state: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidPipelineError(f"a phase needs a non-empty name, got {self.name!r}")
        if not callable(self.run):
            raise InvalidPipelineError(f"phase {self.name!r}: run must be callable, got {type(self.run).__name__}")


@dataclass(frozen=True)
class Pipeline:
    """Phases and, optionally, the pydantic model of their state (declared once, like a typed graph).

    ``Pipeline(phases=[Phase("fetch", fetch), Phase("report", report)], state=MyState)``:
    every phase then sees ``ctx.state`` as a ``MyState`` (a phase's own
    ``state_model`` wins), and a job's stored state is read back typed. The
    first phase is where a new job starts.
    """

    phases: Sequence[Phase]
    state: type[BaseModel] | None = None
    # The code version that writes this pipeline's jobs, and {from_version: fn(state)} upgrades of
    # older jobs' states (see pipelines.engine.versions). None: jobs are not versioned.
    version: str | None = None
    migrations: Mapping[str, Callable[[Any], Any]] | None = None

    def __post_init__(self) -> None:
        phases = self.phases
        if isinstance(phases, Phase) or not isinstance(phases, Sequence):
            raise InvalidPipelineError(f"phases must be a list of Phase, got {type(phases).__name__}")
        if not phases:
            raise InvalidPipelineError("a pipeline needs at least one phase; got an empty list")
        seen: set[str] = set()
        for p in phases:
            if not isinstance(p, Phase):
                raise InvalidPipelineError(f"phases must be Phase objects, got {type(p).__name__}")
            if p.name in seen:
                raise InvalidPipelineError(f"duplicate phase name {p.name!r}")
            seen.add(p.name)
        if self.state is not None and not (isinstance(self.state, type) and issubclass(self.state, BaseModel)):
            raise InvalidPipelineError(f"state must be a pydantic model class, got {self.state!r}")
        object.__setattr__(self, "phases", tuple(phases))
        version = versions.check_version(self.version)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "migrations", versions.check_migrations(self.migrations, version) or None)

    @property
    def by_name(self) -> dict[str, Phase]:
        return {p.name: p for p in self.phases}

    @property
    def first(self) -> str:
        return self.phases[0].name

    def state_model_of(self, phase: Phase) -> type[BaseModel] | None:
        return phase.state_model or self.state


def validate_state(phase: Phase, state: Any, model: type[BaseModel] | None = None) -> Any:
    """Validate stored ``state`` into ``model`` (default: ``phase.state_model``), if there is one."""
    model = model or phase.state_model
    if model is None or isinstance(state, model):
        return state
    try:
        return model.model_validate(state)
    except ValidationError as exc:
        raise StateValidationError(
            f"stored state does not validate against {model.__name__} for phase {phase.name!r}: {exc}"
        ) from exc
