"""The blob store port (pipelines/engine/blobs.py ``BlobStore``), run against every blob store: memory, a
directory, Redis (a plain server and a Cluster) and S3 (moto's server on 127.0.0.1, tests/s3_server.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pipelines.engine.blobs import BlobStore, blob_name
from pipelines.engine.errors import InvalidInputError
from tests.contract.ports import covers


def _memory(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    from adapters.blobs import MemoryBlobStore

    yield MemoryBlobStore()


def _directory(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    from adapters.blobs import DirectoryBlobStore

    yield DirectoryBlobStore(request.getfixturevalue("tmp_path") / "blobs")


def _redis_store(request: pytest.FixtureRequest, url_fixture: str, **options: Any) -> Iterator[BlobStore]:
    from adapters.blobs import RedisBlobStore
    from adapters.redis import RedisStorage

    prefix = f"b{uuid.uuid4().hex[:10]}"  # a fresh namespace: job_ids scans only this store's keys
    storage = RedisStorage.from_url(request.getfixturevalue(url_fixture), prefix=prefix, **options)
    yield RedisBlobStore(storage.client, prefix=prefix)
    storage.close()


def _redis(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    yield from _redis_store(request, "redis_url")


def _redis_cluster(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    yield from _redis_store(request, "redis_cluster_url", cluster=True)


def _s3(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    # One store (and so one boto3 client, a second to build) for the module, emptied before each test.
    store: BlobStore = request.getfixturevalue("s3_store")
    for job_id in list(store.job_ids()):
        store.delete_job(job_id)
    yield store


BLOB_STORES: dict[str, Callable[[pytest.FixtureRequest], Iterator[BlobStore]]] = {
    "memory": _memory, "directory": _directory, "redis": _redis, "redis-cluster": _redis_cluster, "s3": _s3}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1, for this module's tests."""
    from tests.s3_server import s3_server_endpoint

    with s3_server_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def s3_store(s3_endpoint: str) -> BlobStore:
    """An S3 blob store in a bucket of its own on that server."""
    from adapters.blobs.s3 import S3BlobStore
    from tests.s3_server import ACCESS_KEY, SECRET_KEY, create_bucket

    return S3BlobStore(create_bucket(s3_endpoint), prefix="app/blobs", endpoint=s3_endpoint, access_key_id=ACCESS_KEY,
                       secret_access_key=SECRET_KEY)


@pytest.fixture(params=sorted(BLOB_STORES))
def blob_store(request: pytest.FixtureRequest) -> Iterator[BlobStore]:
    """A fresh, empty blob store of one kind."""
    yield from BLOB_STORES[request.param](request)


BIG = bytes(range(256)) * 1024  # every byte value, 256 KiB: stored exactly, not as text
SMALL = b'{"role":"tool","content":"x"}'


@covers("BlobStore.put", "BlobStore.get")
def test_a_blob_reads_back_exactly_under_its_job_and_name(blob_store: BlobStore) -> None:
    assert isinstance(blob_store, BlobStore)
    big, small = blob_name(BIG), blob_name(SMALL)
    assert blob_store.get("j1", big) is None
    blob_store.put("j1", big, BIG)
    blob_store.put("j1", small, SMALL)
    assert blob_store.get("j1", big) == BIG and blob_store.get("j1", small) == SMALL
    assert blob_store.get("j2", big) is None  # per job: another job's name is not this one's
    blob_store.put("j1", big, BIG)  # again (a re-run of the same turn): a no-op
    assert blob_store.get("j1", big) == BIG
    assert isinstance(blob_store.get("j1", small), bytes)


@covers("BlobStore.put", "BlobStore.get", "BlobStore.delete_job")
def test_a_bad_name_or_job_id_is_refused_by_every_method(blob_store: BlobStore) -> None:
    for bad in ("", "sha256-", "sha256-" + "A" * 64, "sha256-" + "0" * 63, "../sha256-" + "0" * 64,
                "md5-" + "0" * 64, "sha256-" + "0" * 64 + "/x"):
        with pytest.raises(InvalidInputError, match="blob name"):
            blob_store.put("j1", bad, SMALL)
        with pytest.raises(InvalidInputError, match="blob name"):
            blob_store.get("j1", bad)
    for bad_id in ("bad id/..", "", "../x"):
        with pytest.raises(InvalidInputError, match="job id"):
            blob_store.put(bad_id, blob_name(SMALL), SMALL)
        with pytest.raises(InvalidInputError, match="job id"):
            blob_store.get(bad_id, blob_name(SMALL))
        with pytest.raises(InvalidInputError, match="job id"):
            blob_store.delete_job(bad_id)
    assert list(blob_store.job_ids()) == []  # nothing was written


@covers("BlobStore.delete_job", "BlobStore.get", "BlobStore.job_ids")
def test_deleting_a_job_removes_its_blobs_only_and_says_how_many(blob_store: BlobStore) -> None:
    for data in (BIG, SMALL):
        blob_store.put("j1", blob_name(data), data)
    blob_store.put("j2", blob_name(SMALL), SMALL)
    assert blob_store.delete_job("j1") == 2
    assert blob_store.get("j1", blob_name(BIG)) is None and blob_store.get("j1", blob_name(SMALL)) is None
    assert blob_store.get("j2", blob_name(SMALL)) == SMALL
    assert blob_store.delete_job("j1") == 0  # again: nothing left
    assert blob_store.delete_job("never") == 0
    assert sorted(blob_store.job_ids()) == ["j2"]
    blob_store.put("j1", blob_name(SMALL), SMALL)  # a job's blobs can come back after a delete
    assert blob_store.get("j1", blob_name(SMALL)) == SMALL


@covers("BlobStore.job_ids", "BlobStore.put")
def test_job_ids_lists_each_job_with_blobs_once_unless_written_lately(blob_store: BlobStore) -> None:
    assert list(blob_store.job_ids()) == []
    for job_id in ("b", "a:1", "c.x_y"):
        blob_store.put(job_id, blob_name(SMALL), SMALL)
        blob_store.put(job_id, blob_name(BIG), BIG)
    ids = list(blob_store.job_ids())
    assert sorted(ids) == ["a:1", "b", "c.x_y"] and len(ids) == 3
    assert list(blob_store.job_ids(older_than=3600)) == []  # every one was written just now: the sweep waits
