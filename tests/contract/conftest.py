"""Storage adapters under the contract suite. A new adapter joins with one entry in ``ADAPTERS``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapters.memory import MemoryStorage, VirtualClock

StorageFactory = Callable[[], Any]


def _memory(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    clock = VirtualClock(start=1_000_000.0)
    yield lambda: MemoryStorage(clock=clock)


ADAPTERS: dict[str, Callable[[pytest.FixtureRequest], Iterator[StorageFactory]]] = {"memory": _memory}


@pytest.fixture(params=sorted(ADAPTERS))
def make_storage(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    """A factory of fresh storages for one adapter (each call: a new, empty namespace)."""
    yield from ADAPTERS[request.param](request)
