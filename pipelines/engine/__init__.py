"""The engine: records and commits, the phase protocol, the runner, the transitions, leases and events.

It imports only itself and the storage / scheduler ports (``adapters.base``):
no agent code, no concrete adapter, nothing of the composition layer above it
(``pipelines.app``, the CLI, the worker entry point). ``adapters`` and
``phases`` build on it; ``pipelines`` composes all three.
"""

__all__: list[str] = []
