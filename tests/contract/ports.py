"""What the contract suites exercise: each test names the port methods it calls on its backend.

A contract test declares, with :func:`covers`, the port members it calls on
the backend its fixture hands it (``"JobStore.get_job"``, ``"Scheduler.precision"``)::

    @covers("InboxStore.send", "InboxStore.inbox")
    def test_sent_messages_wait_in_order(storage: Storage) -> None: ...

``tests/contract/test_port_coverage.py`` reads these declarations from the
source and checks that every public member of every port protocol
(``adapters.base`` and :class:`~pipelines.engine.blobs.BlobStore`) is
declared by some test, that each declaring test takes a backend fixture
(one of :data:`BACKEND_FIXTURES`, parametrized over every backend of its
kind), and that the test really calls the method (``.name(...)``, in its
body or a helper of its module it calls). The decorator itself does nothing
at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["BACKEND_FIXTURES", "covers"]

F = TypeVar("F", bound=Callable[..., object])

BACKEND_FIXTURES = frozenset({"storage", "make_storage", "harness", "blob_store"})
"""The fixtures that hand a test a backend, each parametrized over every backend of its kind: storages
(``tests/contract/conftest.py``), schedulers (``scheduler_fixtures.py``), blob stores (``test_blob_contract.py``)."""


def covers(*members: str) -> Callable[[F], F]:
    """Declare the port members (``"Port.method"``) the decorated contract test calls on its backend."""

    def declare(fn: F) -> F:
        return fn

    return declare
