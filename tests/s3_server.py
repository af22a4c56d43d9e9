"""A local S3-compatible server for the S3 blob store's tests: moto's, in this process, on 127.0.0.1.

moto (``moto[s3]`` + flask + flask-cors, in the ``dev`` extra and so in the
lock) answers the S3 REST API on a port the OS picks (port 0: no race with
another test run). It keeps buckets in memory and does not check
signatures; the tests still always hand the client credentials (explicitly
or through ``AWS_*`` variables), so it never looks for instance credentials
on the network.
"""

from __future__ import annotations

import logging
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ACCESS_KEY", "SECRET_KEY", "create_bucket", "s3_server_endpoint"]

ACCESS_KEY = "test-access-key"
SECRET_KEY = "test-secret-never-shown"  # the tests look for it in reprs, errors and logs


@contextmanager
def s3_server_endpoint() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 for the block; its endpoint URL (``http://127.0.0.1:<port>``)."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request at INFO: a page of noise per test.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def create_bucket(endpoint: str, name: str | None = None) -> str:
    """Create a bucket (moto takes an unsigned ``PUT /<bucket>``); its name."""
    name = name or f"blobs-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(f"{endpoint}/{name}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200, answer.status
    return name
