"""S3BlobStore against moto's S3-compatible server on 127.0.0.1: layout, configuration, errors, no secrets shown.

The store's share of the blob contract (offload, read back, delete, retention, orphans, crashes) runs in
``test_blobs.py`` with the other stores; this file covers what is S3's own, and the deployment shape end to
end: Redis storage with S3 blobs.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from typing import Any

import boto3
import pytest

from adapters.blobs.s3 import S3BlobStore
from adapters.memory import MemoryScheduler, MemoryStorage, VirtualClock
from adapters.offload import OffloadingStorage
from adapters.redis import RedisStorage
from pipelines import Agent, App, JobStatus, tool
from pipelines.engine.blobs import BLOB_KEY, blob_name
from pipelines.engine.errors import ConfigurationError, StorageError, StorageUnavailableError
from pipelines.engine.models import JobRecord
from pipelines.testing import ScriptedModel, call, reply
from tests.redis_server import free_port
from tests.s3_server import ACCESS_KEY, SECRET_KEY

BIG = 100 * 1024  # over the 64 KiB default threshold
A = blob_name(b'"a"')
B = blob_name(b'"b"')


@pytest.fixture(autouse=True)
def _no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # boto3 reads AWS_* variables and ~/.aws: a developer's own must not point these tests elsewhere, and
    # nothing may ask the instance-metadata address for credentials (the tests talk to 127.0.0.1 only).
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def make_store(endpoint: str, bucket: str, **options: Any) -> S3BlobStore:
    return S3BlobStore(bucket, endpoint=endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                       **({"prefix": "app/blobs"} | options))


def raw_client(endpoint: str) -> Any:
    """A plain boto3 client, for reading and writing the bucket beside the store under test."""
    return boto3.session.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                                 region_name="us-east-1").client("s3", endpoint_url=endpoint)


def raw_keys(endpoint: str, bucket: str) -> list[str]:
    """Every key in the bucket, listed directly (not through the store under test)."""
    pages = raw_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))


@pytest.fixture
def store(s3_endpoint: str, s3_bucket: str) -> S3BlobStore:
    return make_store(s3_endpoint, s3_bucket)


def test_blobs_are_one_object_each_under_the_jobs_prefix(store: S3BlobStore, s3_endpoint: str) -> None:
    store.put("a", A, b'"a"')
    store.put("a", B, b'"b"')
    store.put("ab", A, b'"a"')  # a job id that the other's is a prefix of
    store.put("x:y.z", A, b'"a"')
    assert raw_keys(s3_endpoint, store.bucket) == sorted(
        [f"app/blobs/job-a/{A}", f"app/blobs/job-a/{B}", f"app/blobs/job-ab/{A}", f"app/blobs/job-x:y.z/{A}"])
    assert store.get("a", B) == b'"b"' and store.get("b", A) is None and store.get("ab", B) is None
    store.put("a", A, b'"a"')  # again: idempotent, the same object
    assert sorted(store.job_ids()) == ["a", "ab", "x:y.z"]
    assert store.delete_job("a") == 2
    assert store.delete_job("a") == 0
    assert raw_keys(s3_endpoint, store.bucket) == [f"app/blobs/job-ab/{A}", f"app/blobs/job-x:y.z/{A}"]
    assert sorted(store.job_ids()) == ["ab", "x:y.z"]


def test_the_orphan_sweep_goes_by_age_and_ignores_foreign_objects(s3_endpoint: str, s3_bucket: str) -> None:
    store = make_store(s3_endpoint, s3_bucket)
    other = make_store(s3_endpoint, s3_bucket, prefix="elsewhere")
    root = make_store(s3_endpoint, s3_bucket, prefix="")
    store.put("j", A, b'"a"')
    other.put("k", A, b'"a"')
    raw = raw_client(s3_endpoint)
    raw.put_object(Bucket=s3_bucket, Key="app/blobs/job-j/notes.txt", Body=b"not a blob")  # someone else's
    raw.put_object(Bucket=s3_bucket, Key="app/blobs/readme", Body=b"x")
    assert list(store.job_ids(older_than=3600)) == []  # just written: a create may be under way
    assert list(store.job_ids()) == ["j"]
    assert list(other.job_ids()) == ["k"]
    assert list(root.job_ids()) == []  # "app/..." and "elsewhere/..." are not job folders at the root
    assert store.delete_job("j") == 1  # the foreign file under the job's folder goes with it, uncounted
    assert raw_keys(s3_endpoint, s3_bucket) == ["app/blobs/readme", f"elsewhere/job-k/{A}"]


def test_redis_storage_with_s3_blobs_end_to_end(s3_endpoint: str, s3_bucket: str, redis_url: str) -> None:
    """The deployment shape: an agent's large tool result goes to S3; readers resolve it; delete and gc empty it."""

    def page(n: int) -> str:
        return f"page {n} " * (BIG // 7)

    @tool
    def fetch(n: int) -> str:
        """Fetch a large page."""
        return page(n)

    def answer(messages: list[dict[str, Any]]) -> Any:
        k = sum(1 for m in messages if m["role"] == "assistant")
        return reply(None, call("fetch", n=k)) if k < 1 else "done"

    prefix = f"s3e2e{uuid.uuid4().hex[:8]}"
    inner = RedisStorage.from_url(redis_url, prefix=prefix)
    blobs = make_store(s3_endpoint, s3_bucket, prefix=prefix)
    app = App(storage=OffloadingStorage(inner, blobs), provenance=False,
              scheduler=MemoryScheduler(clock=VirtualClock(start=1_000_000.0)),
              agents=[Agent(name="bot", model=ScriptedModel(answer), tools=[fetch])])
    try:
        for job in ("keep", "gone"):
            app.run_agent("bot", job_id=job, messages=["read"]).wait()
        view = app.get("keep")
        assert view is not None and view.status is JobStatus.COMPLETE and view.result == "done"
        (result,) = [m for m in app.messages("keep") if m["role"] == "tool"]
        assert result["content"] == page(0)  # readers get it whole
        (ref,) = [m for m in inner.messages("keep") if BLOB_KEY in m]  # Redis holds a reference only
        name = ref[BLOB_KEY]["name"]
        assert f"{prefix}/job-keep/{name}" in raw_keys(s3_endpoint, s3_bucket)
        app.delete("gone")
        assert not any(k.startswith(f"{prefix}/job-gone/") for k in raw_keys(s3_endpoint, s3_bucket))
        app.scheduler.clock.advance(100)  # type: ignore[attr-defined]
        assert app.gc(older_than=10) == ["keep"]
        assert raw_keys(s3_endpoint, s3_bucket) == []
    finally:
        inner.close()


def test_credentials_are_never_shown(s3_endpoint: str, s3_bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    store = make_store(s3_endpoint, s3_bucket, session_token="token-never-shown")
    store.put("j", A, b'"a"')
    assert store.get("j", A) == b'"a"'
    shown = repr(store) + str(vars(store))
    assert repr(store) == f"S3BlobStore(bucket={s3_bucket!r}, prefix='app/blobs', endpoint={s3_endpoint!r})"
    dead = make_store(f"http://127.0.0.1:{free_port()}", s3_bucket, max_retries=0, connect_timeout=1, timeout=2)
    with pytest.raises(StorageUnavailableError) as err:
        dead.put("j", A, b'"a"')
    shown += str(err.value) + repr(err.value) + caplog.text
    for secret in (SECRET_KEY, "token-never-shown"):
        assert secret not in shown


def test_credentials_from_the_standard_aws_variables(s3_endpoint: str, s3_bucket: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    store = S3BlobStore(s3_bucket, endpoint=s3_endpoint)
    store.put("j", A, b'"a"')
    assert store.get("j", A) == b'"a"'


def test_from_url(s3_endpoint: str, s3_bucket: str) -> None:
    store = S3BlobStore.from_url(f"s3://{s3_bucket}/team/blobs/?endpoint={s3_endpoint}&region=us-east-1",
                                 access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
    assert (store.bucket, store.prefix, store.endpoint) == (s3_bucket, "team/blobs", s3_endpoint)
    store.put("j", A, b'"a"')
    assert raw_keys(s3_endpoint, s3_bucket) == [f"team/blobs/job-j/{A}"]
    assert S3BlobStore.from_url("s3://bucket-1", region="eu-west-1").prefix == "pipelines"
    assert S3BlobStore.from_url("s3://bucket-1", prefix="p").prefix == "p"  # keywords win


@pytest.mark.parametrize("url, match", [
    ("http://bucket-1/p", "expected s3://"),
    ("s3:///p", "expected s3://"),
    ("s3://Bucket-1", "bucket name"),
    ("s3://bucket-1:9000", "bucket name"),
    ("s3://key:hunter2@bucket-1", "carries credentials"),
    ("s3://bucket-1?endpoint=http://127.0.0.1:1&secret=hunter2", "the keys it takes are endpoint, region"),
    ("s3://bucket-1?region=a&region=b", "each once"),
    ("s3://bucket-1?endpoint=ftp://127.0.0.1", "bad S3 endpoint"),
    ("s3://bucket-1?endpoint=http://key:hunter2@127.0.0.1:9000", "carries credentials"),
    ("s3://bucket-1?endpoint=http://127.0.0.1:port", "bad S3 endpoint"),
    ("s3://bucket-1/a/../b", "bad S3 prefix"),
    ("s3://bucket-1/a b", "bad S3 prefix"),
])
def test_bad_urls_are_configuration_errors(url: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as err:
        S3BlobStore.from_url(url)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("options, match", [
    ({"bucket": "ab"}, "bucket name"),
    ({"bucket": "a" * 64}, "bucket name"),
    ({"bucket": "under_score"}, "bucket name"),
    ({"bucket": "bucket-1", "prefix": "a//b"}, "bad S3 prefix"),
    ({"bucket": "bucket-1", "timeout": 0}, "timeout"),
    ({"bucket": "bucket-1", "max_retries": -1}, "max_retries"),
    ({"bucket": "bucket-1", "access_key_id": "only-half"}, "both access_key_id and secret_access_key"),
])
def test_bad_settings_are_configuration_errors(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        S3BlobStore(**options)


def test_a_missing_bucket_is_a_configuration_error(s3_endpoint: str) -> None:
    store = make_store(s3_endpoint, "no-such-bucket-here")
    for attempt in (lambda: store.put("j", A, b'"a"'), lambda: store.get("j", A), lambda: store.delete_job("j"),
                    lambda: list(store.job_ids())):
        with pytest.raises(ConfigurationError, match=r"'no-such-bucket-here' at http://127\.0\.0\.1:\d+ does not"):
            attempt()


def test_an_unreachable_endpoint_is_storage_unavailable_and_nothing_is_created(s3_bucket: str) -> None:
    dead = make_store(f"http://127.0.0.1:{free_port()}", s3_bucket, max_retries=1, connect_timeout=1, timeout=2)
    for attempt in (lambda: dead.put("j", A, b'"a"'), lambda: dead.get("j", A), lambda: dead.delete_job("j"),
                    lambda: list(dead.job_ids())):
        with pytest.raises(StorageUnavailableError, match="unreachable"):
            attempt()
    # Through the offloading storage: the blob is written first, so a create whose blob fails writes nothing.
    inner = MemoryStorage()
    with pytest.raises(StorageUnavailableError):
        OffloadingStorage(inner, dead).create_job(JobRecord(job_id="j", version=1),
                                                  messages=[{"role": "user", "content": "x" * BIG}])
    assert inner.get_job("j") is None
    assert issubclass(StorageUnavailableError, StorageError)  # a turn meeting it is retried later, not failed


def test_the_client_library_is_imported_at_the_first_request_only() -> None:
    import subprocess
    import sys

    code = ("import sys; import adapters.blobs, adapters.offload, pipelines; a = 'adapters.blobs.s3' in sys.modules; "
            "from adapters.blobs.s3 import S3BlobStore; S3BlobStore('bucket-1', region='eu-west-1'); "
            "print(a, 'boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


def test_a_forked_child_uses_the_store_its_parent_used(store: S3BlobStore) -> None:
    """An RQ work-horse is forked from a worker whose retention sweep may have used the store already."""
    store.put("parent", A, b'"a"')  # the parent's client and connection pool now exist
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running pytest's teardown
        code = 1
        try:
            store.put("child", B, b'"b"')
            code = 0 if store.get("parent", A) == b'"a"' else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 30
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on its first S3 request")
        time.sleep(0.05)
    assert os.read(read, 1) == b"\x00"
    os.close(read)
    assert store.get("child", B) == b'"b"' and sorted(store.job_ids()) == ["child", "parent"]
