"""A missing redis-server never passes silently: it fails with the install command unless REQUIRE_REDIS=0.

The pytest-level rule is checked in a child pytest run that loads the suite's conftest and sees no
redis-server (PATH points at an empty dir and Debian's fallback paths are switched off by a tiny plugin).
The real redis-server stays installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import redis_server
from tests.redis_server import INSTALL_COMMAND, ensure_redis_server, find_redis_server

ROOT = Path(__file__).resolve().parents[2]

# Two Redis tests (one marked, one only asking for the fixture, as the contract suite does) and one that is not.
CHILD_TESTS = '''
import pytest

@pytest.mark.redis
def test_marked():
    pass

def test_uses_the_fixture(redis_url):
    assert redis_url.startswith("redis://")

def test_memory_only():
    pass
'''


def run_child_pytest(
    tmp_path: Path, require: str | None, redis_bin: str | None = None, tests: str = CHILD_TESTS
) -> subprocess.CompletedProcess[str]:
    """Run ``tests`` under the suite's conftest with ``redis_bin`` (or nothing) as the only redis-server."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if redis_bin is not None:
        (bindir / "redis-server").symlink_to(redis_bin)
    (tmp_path / "no_fallback.py").write_text("import tests.redis_server as r\nr.FALLBACK_PATHS = ()\n"
                                             "r.CLI_FALLBACK_PATHS = ()\n")
    test_file = tmp_path / "test_child.py"
    test_file.write_text(tests)
    env = {k: v for k, v in os.environ.items() if k != "REQUIRE_REDIS"}
    env.update(PATH=str(bindir), PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    if require is not None:
        env["REQUIRE_REDIS"] = require
    args = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
            "-p", "no_fallback", "-p", "tests.conftest", "-p", "no:cacheprovider", str(test_file)]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("require", [None, "1"], ids=["unset", "REQUIRE_REDIS=1"])
def test_missing_redis_server_fails_with_the_install_command(tmp_path: Path, require: str | None) -> None:
    run = run_child_pytest(tmp_path, require)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert INSTALL_COMMAND in out
    # The first Redis test errors and the run stops there, instead of repeating the message for each one.
    assert "ERROR at setup of test_marked" in out
    assert "1 error in" in out.splitlines()[-1], out


def test_a_test_that_only_asks_for_the_fixture_fails_the_same_way(tmp_path: Path) -> None:
    only_fixture = "def test_uses_the_fixture(redis_url):\n    pass\n"
    run = run_child_pytest(tmp_path, None, tests=only_fixture)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert INSTALL_COMMAND in out
    assert "ERROR at setup of test_uses_the_fixture" in out


def test_require_redis_0_skips_them_and_the_summary_counts_them(tmp_path: Path) -> None:
    run = run_child_pytest(tmp_path, "0")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "SKIPPED 2 Redis tests (REQUIRE_REDIS=0)" in out
    assert "1 passed, 2 skipped" in out


def test_a_bad_require_redis_value_stops_the_run_naming_it(tmp_path: Path) -> None:
    run = run_child_pytest(tmp_path, "yes")
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "REQUIRE_REDIS must be 0" in out
    assert "'yes'" in out


@pytest.mark.redis
def test_require_redis_0_still_runs_them_when_redis_server_is_there(tmp_path: Path) -> None:
    binary = find_redis_server()
    assert binary is not None  # the redis marker already failed or skipped this test otherwise
    run = run_child_pytest(tmp_path, "0", redis_bin=binary)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "3 passed" in out
    assert "SKIPPED" not in out


CLUSTER_TEST = "def test_on_the_cluster(redis_cluster_url):\n    pass\n"


@pytest.mark.redis
def test_the_cluster_fixture_without_redis_cli_fails_with_the_install_command(tmp_path: Path) -> None:
    run = run_child_pytest(tmp_path, None, redis_bin=find_redis_server(), tests=CLUSTER_TEST)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "redis-cli is not installed" in out
    assert INSTALL_COMMAND in out


@pytest.mark.redis
def test_the_cluster_fixture_without_redis_cli_is_skipped_and_counted_with_require_redis_0(tmp_path: Path) -> None:
    run = run_child_pytest(tmp_path, "0", redis_bin=find_redis_server(), tests=CLUSTER_TEST)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "SKIPPED 1 Redis tests (REQUIRE_REDIS=0)" in out


# --- `make test`'s first step: python -m tests.redis_server -------------------------------------------------


@pytest.fixture
def no_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No redis-server anywhere; returns the (empty) PATH dir where a fake install may put one."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(redis_server, "FALLBACK_PATHS", ())
    monkeypatch.setattr(redis_server, "CLI_FALLBACK_PATHS", ())
    monkeypatch.delenv("REQUIRE_REDIS", raising=False)
    return tmp_path


def fake_binary(bindir: Path, name: str) -> None:
    fake = bindir / name
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)


def test_ensure_installs_redis_server_when_it_can(no_redis: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def fake_install() -> int:
        fake_binary(no_redis, "redis-server")
        fake_binary(no_redis, "redis-cli")
        return 0

    assert ensure_redis_server(can_install=lambda: True, install=fake_install) == 0
    assert f"running: {INSTALL_COMMAND}" in capsys.readouterr().out


def test_ensure_fails_with_the_exact_command_when_it_cannot_install(
    no_redis: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def install() -> int:
        calls.append("install")
        return 0

    assert ensure_redis_server(can_install=lambda: False, install=install) == 1
    assert INSTALL_COMMAND in capsys.readouterr().err
    assert calls == []


def test_ensure_fails_when_the_install_did_not_provide_redis_server(
    no_redis: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ensure_redis_server(can_install=lambda: True, install=lambda: 100) == 1
    assert INSTALL_COMMAND in capsys.readouterr().err


def test_ensure_fails_naming_redis_cli_when_only_redis_server_is_there(
    no_redis: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_binary(no_redis, "redis-server")
    assert ensure_redis_server(can_install=lambda: False) == 1
    err = capsys.readouterr().err
    assert "redis-cli is not installed" in err
    assert INSTALL_COMMAND in err


def test_ensure_accepts_a_missing_redis_server_only_with_require_redis_0(
    no_redis: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REQUIRE_REDIS", "0")
    assert ensure_redis_server(can_install=lambda: False) == 0
    assert "will be skipped" in capsys.readouterr().out


def test_ensure_rejects_a_bad_require_redis_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUIRE_REDIS", "true")
    with pytest.raises(ValueError, match=r"REQUIRE_REDIS must be 0 .* got 'true'"):
        ensure_redis_server(can_install=lambda: False)
