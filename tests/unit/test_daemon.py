"""The lease keeper's and the delta flusher's threads start without waiting for the new thread to run."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from pipelines.engine import leases
from pipelines.engine._daemon import Daemon, start_daemon


def test_the_caller_goes_on_before_the_new_thread_has_run() -> None:
    # With a switch interval far longer than the test, the caller keeps the GIL until it blocks:
    # threading.Thread.start() would block until the thread ran (so the flag would be set by then).
    ran = threading.Event()
    release = threading.Event()

    def loop() -> None:
        ran.set()
        release.wait(5)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        handle = start_daemon(loop, "test-daemon")
        not_yet = not ran.is_set()
    finally:
        sys.setswitchinterval(before)
    assert not_yet, "start_daemon waited for the thread to run"
    assert handle.is_alive()  # counted as running from the start: nobody starts a second one meanwhile
    assert ran.wait(5)
    release.set()


def test_the_thread_runs_under_its_name_and_an_error_that_ends_it_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    names: list[str] = []
    done = threading.Event()

    def loop() -> None:
        names.append(threading.current_thread().name)
        try:
            raise RuntimeError("the loop died")
        finally:
            done.set()

    handle = start_daemon(loop, "pipelines-test-loop")
    assert done.wait(5)
    for _ in range(500):  # the handle is updated just after the loop's own finally
        if not handle.is_alive():
            break
        threading.Event().wait(0.01)
    assert names == ["pipelines-test-loop"]
    assert not handle.is_alive()
    assert any("pipelines-test-loop stopped" in r.getMessage() and r.exc_info for r in caplog.records)


def test_the_lease_keeper_starts_one_loop_and_a_new_one_only_after_it_died(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    handles: list[Daemon] = []

    def fake_start(target: Any, name: str) -> Daemon:  # a handle, no thread
        started.append(name)
        handles.append(Daemon())
        return handles[-1]

    monkeypatch.setattr(leases, "start_daemon", fake_start)
    keeper = leases.LeaseKeeper()
    a = keeper.hold(object(), "j1", "o1", 30.0)  # type: ignore[arg-type]
    keeper.hold(object(), "j2", "o2", 30.0)  # type: ignore[arg-type]
    assert started == ["pipelines-lease-keeper"]
    handles[0].alive = False  # the loop ended (an unexpected error): the next hold starts another
    keeper.drop(a)
    keeper.hold(object(), "j3", "o3", 30.0)  # type: ignore[arg-type]
    assert started == ["pipelines-lease-keeper"] * 2
