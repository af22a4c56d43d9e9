"""A pytest plugin (``-p tests.warm_check``): every warm Redis load is checked against a cold one.

A worker that saw a record hash as it is reuses the record it remembered instead of parsing it again
(``adapters.redis.records``); with this plugin each such load also reads the record read-only, parsed,
and fails the test if the two differ. Not part of ``make test``: a tool to run suites with.
"""

from __future__ import annotations

import threading
from typing import Any

from adapters.redis.records import RecordReads
from adapters.redis.values import _text

_load, _stored = RecordReads.load, RecordReads._stored
_seen = threading.local()  # whether this thread's load just now was a warm one (storages are shared by threads)


def _stored_seen(self: RecordReads, job_id: str, reply: Any, held: Any) -> Any:
    _seen.warm = held is not None and held.stored is not None and _text(reply[0]) == "="
    return _stored(self, job_id, reply, held)


def _checked(self: RecordReads, job_id: str, owner: str = "", ttl_ms: str = "") -> Any:
    _seen.warm = False
    warm = _load(self, job_id, owner, ttl_ms)
    if warm is not None and _seen.warm:
        cold = _load(self, job_id)
        assert cold is not None, job_id
        # What LOAD reads beside the record (a request, the inbox, dropped usage) is read alike on both
        # paths, and other threads change it at any time: the record itself is what is compared.
        beside = {"control", "inbox", "dropped"}
        a, b = warm.model_dump(exclude=beside), cold.model_dump(exclude=beside)
        if a != b:
            diff = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
            raise AssertionError(f"warm load of {job_id!r} differs from a cold one: {diff}")
        assert [type(m) for m in warm.history] == [type(m) for m in cold.history]
        CHECKED.append(job_id)
    return warm


CHECKED: list[str] = []


def install(setattr_: Any = setattr) -> None:
    """Check every warm load from now on (``setattr_``: a test's ``monkeypatch.setattr``, undone after it)."""
    setattr_(RecordReads, "load", _checked)
    setattr_(RecordReads, "_stored", _stored_seen)


def pytest_configure(config: Any) -> None:  # loaded with -p: for the whole session
    install()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"warm_check: {len(CHECKED)} warm loads checked against cold ones")
