"""`make test` on a fresh Debian machine: Redis is settled before anything needs it, node without npm is a skip.

- The Redis check (install as root, else stop with the exact command) is the first step of `make test`, run by
  the system's python3 before the venv exists, and every target that runs Redis tests depends on it.
- Without root, the command it names is the one to type (through sudo).
- node missing, or node without npm: one line says what is missing and how to install it, `make node-deps`
  goes on, and the tests that need node are skipped with that same line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import node_tools, redis_server

ROOT = Path(__file__).resolve().parents[2]


def make_dry_run(target: str) -> list[str]:
    """The commands `make -n <target>` would run, with the venv already built (so only the target's own)."""
    # Run under `make test` itself (as CI does), the child make would inherit MAKEFLAGS/MAKELEVEL and print
    # "Entering directory" lines: clear them so the listing is the one a person typing the command sees.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", target], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True, env=env)
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_make_test_settles_redis_first_with_the_system_python() -> None:
    steps = make_dry_run("test")
    assert steps[0] == "python3 -m tests.redis_server"  # before ruff, mypy, the docs, node and pytest
    assert sum("tests.redis_server" in s for s in steps) == 1


@pytest.mark.parametrize("target", ["node-test", "pytest"])
def test_every_target_that_runs_redis_tests_settles_redis_before_pytest(target: str) -> None:
    steps = make_dry_run(target)
    check = next(i for i, s in enumerate(steps) if "tests.redis_server" in s)
    first_pytest = next(i for i, s in enumerate(steps) if "-m pytest" in s)
    assert check < first_pytest


def test_without_root_the_redis_message_names_the_sudo_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert f"sudo sh -c '{redis_server.INSTALL_COMMAND}'" in redis_server.missing_redis_message()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    message = redis_server.missing_redis_message()
    assert redis_server.INSTALL_COMMAND in message and "sudo" not in message


@pytest.fixture
def only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Put only the named fake tools on PATH, and an empty tests/node (nothing npm-installed)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr(node_tools, "NODE_DIR", tmp_path / "node")

    def put(*names: str) -> None:
        for name in names:
            (bindir / name).write_text("#!/bin/sh\nexit 0\n")
            (bindir / name).chmod(0o755)

    return put


def test_node_without_npm_is_one_clear_line_and_a_skip(only: Callable[..., None],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    only("node")
    assert node_tools.main() == 0  # `make node-deps` goes on
    out = capsys.readouterr().out
    assert out == ("node-deps: SKIPPED - npm not installed: the AI SDK check (tests/node) is skipped; install with "
                   f"(Debian, as root): {node_tools.INSTALL_COMMAND}, then `make node-deps`\n")
    assert node_tools.skip_reason() == out.removeprefix("node-deps: SKIPPED - ").rstrip("\n")


def test_no_node_at_all_is_a_skip_naming_both(only: Callable[..., None]) -> None:
    only()
    reason = node_tools.skip_reason()
    assert reason is not None and reason.startswith("node and npm not installed: the AI SDK check")


def test_npm_there_but_never_run_is_not_a_skip(only: Callable[..., None]) -> None:
    only("node", "npm")  # a forgotten `make node-deps` fails the test (tests/integration/test_sse.py), not skips
    assert node_tools.skip_reason() is None and not node_tools.installed()


def test_make_test_leaves_out_only_the_slow_tests_and_make_test_all_runs_every_one() -> None:
    quick = [s for s in make_dry_run("test") if "-m pytest" in s]
    assert len(quick) == 1 and '-m "not slow"' in quick[0]  # one pytest run: the docs and node checks are in it
    every = [s for s in make_dry_run("test-all") if "-m pytest" in s]
    assert len(every) == 1 and '-m ""' in every[0]
