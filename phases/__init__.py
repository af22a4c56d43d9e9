"""Units of work built on the phase protocol: the agent turn, tools, the model call, stop conditions.

``import phases`` never imports litellm; ``phases.litellm_model`` imports it lazily.
"""

__all__: list[str] = []
