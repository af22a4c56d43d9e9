"""Storage and scheduler adapters: ``adapters.memory``, ``adapters.redis``, ``adapters.rq``.

Import the adapter you need; this package imports none of them, so
``import adapters`` never pulls in redis or rq. The ports they implement are
in ``adapters.base``.
"""

__all__: list[str] = []
