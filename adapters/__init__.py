"""Storage and scheduler adapters: ``adapters.memory``, ``adapters.redis``, ``adapters.rq``.

Import the adapter you need; this package imports none of them, so
``import adapters`` never pulls in redis or rq.
"""

# Initialise the core first: `pipelines` imports `adapters.base`, and a user
# who imports `adapters.x` before `pipelines` would otherwise meet a
# half-initialised module in the middle of that cycle.
import pipelines  # noqa: F401

__all__: list[str] = []
