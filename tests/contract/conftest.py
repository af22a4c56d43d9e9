"""Storage adapters under the contract suite. A new adapter joins with one entry in ``ADAPTERS``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from adapters.memory import MemoryStorage, VirtualClock

StorageFactory = Callable[[], Any]


def _memory(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    clock = VirtualClock(start=1_000_000.0)
    yield lambda: MemoryStorage(clock=clock)


def _redis_storages(request: pytest.FixtureRequest, url_fixture: str, **options: Any) -> Iterator[StorageFactory]:
    # Imported here so the memory entry runs even where redis-py is missing.
    from adapters.redis import RedisStorage

    url = request.getfixturevalue(url_fixture)
    made: list[RedisStorage] = []

    def make() -> RedisStorage:
        # A fresh prefix per storage: two storages of one test never see each other.
        storage = RedisStorage.from_url(url, prefix=f"t{uuid.uuid4().hex[:10]}", **options)
        made.append(storage)
        return storage

    yield make
    for storage in made:
        if options.get("cluster"):
            # A RedisCluster made from a URL gives each node a client on a pool of its own making, which the
            # cluster's close() leaves open: their sockets were collected unclosed (a ResourceWarning printed
            # after pytest's summary when a cluster test ran last).
            for node in storage.client.get_nodes():  # type: ignore[union-attr]
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        storage.close()


def _sqlite(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    # A real file on disk (WAL mode), a new one per storage: two storages of one test never see each other.
    from adapters.sqlite import SQLiteStorage

    tmp = request.getfixturevalue("tmp_path")
    made: list[SQLiteStorage] = []

    def make() -> SQLiteStorage:
        made.append(SQLiteStorage(str(tmp / f"s{len(made)}.db")))
        return made[-1]

    yield make
    for storage in made:
        storage.close()


def _offload_memory(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    # The offloading wrapper (adapters/offload.py) over memory, its blobs in a directory. The threshold is
    # one byte: nearly every message and step result goes through the blob store and back.
    from adapters.blobs import DirectoryBlobStore
    from adapters.offload import OffloadingStorage

    clock = VirtualClock(start=1_000_000.0)
    tmp = request.getfixturevalue("tmp_path")
    made: list[int] = []

    def make() -> OffloadingStorage:
        made.append(1)
        return OffloadingStorage(MemoryStorage(clock=clock), DirectoryBlobStore(tmp / f"blobs{len(made)}"), threshold=1)

    yield make


def _redis(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    yield from _redis_storages(request, "redis_url")


def _redis_buckets(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    # The Cluster layout (indexes split into hash-tagged buckets) on a plain server: every index reader
    # must walk the buckets. Three buckets, so a handful of jobs already spans several.
    yield from _redis_storages(request, "redis_url", buckets=3)


def _redis_cluster(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    # A real 3-master Redis Cluster (tests/redis_cluster.py): a cross-slot script would fail here.
    yield from _redis_storages(request, "redis_cluster_url", cluster=True)


ADAPTERS: dict[str, Callable[[pytest.FixtureRequest], Iterator[StorageFactory]]] = {
    "memory": _memory,
    "offload-memory": _offload_memory,
    "redis": _redis,
    "redis-buckets": _redis_buckets,
    "redis-cluster": _redis_cluster,
    "sqlite": _sqlite,
}


@pytest.fixture(params=sorted(ADAPTERS))
def make_storage(request: pytest.FixtureRequest) -> Iterator[StorageFactory]:
    """A factory of fresh storages for one adapter (each call: a new, empty namespace)."""
    yield from ADAPTERS[request.param](request)
