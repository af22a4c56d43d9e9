"""Units of work built on the phase protocol: the agent turn, tools, the model call, stop conditions.

``import phases`` never imports litellm; ``phases.model`` imports it lazily.
"""

# Initialise the core first: `pipelines/__init__` imports modules of this
# package, and a user who imports `phases.x` before `pipelines` would
# otherwise meet a half-initialised module in the middle of that cycle.
import pipelines  # noqa: F401

__all__: list[str] = []
