"""Suite-wide guards: no network beyond 127.0.0.1, litellm offline, model calls blocked."""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any

import pytest

# litellm must never fetch its price list or phone home from the test suite.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# Real model calls are blocked: the only model server the suite may reach is
# the loopback fake started by a fixture.
os.environ["PIPELINES_BLOCK_REMOTE_MODELS"] = "1"

_real_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = host == "localhost"
        if not ok:
            raise ConnectionRefusedError(f"test suite blocks network access to {host!r} (only loopback)")
    return _real_connect(self, address)


@pytest.fixture(autouse=True, scope="session")
def _block_network() -> Any:
    socket.socket.connect = _loopback_only  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
