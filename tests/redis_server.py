"""Process helpers shared by the tests and the bench scripts: a private redis-server, free ports, child cleanup.

``python -m tests.redis_server`` (``make test`` runs it first) makes sure redis-server and redis-cli (which
``tests/redis_cluster.py`` needs to create a cluster) are installed: it installs them as root on Debian, or exits
1 with the exact command to run. ``REQUIRE_REDIS=0`` lets the
Redis tests be skipped instead (and counted in pytest's summary); unset means required.

``RedisServer`` starts redis-server on a free port in a temp dir and stops it
by pid. ``die_with_parent`` is a ``preexec_fn`` that makes a child die with
the process that started it (Linux ``PR_SET_PDEATHSIG``), so an interrupted
test run leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_PR_SET_PDEATHSIG = 1
try:
    # Looked up here, not in the child: after fork the child makes one foreign call and nothing else.
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the child gets SIGKILL when its parent dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def ctrl_c_as_from_a_terminal() -> None:
    """``preexec_fn`` for a child a test stops with SIGINT, as Ctrl-C would: a shell's background job (a test run
    started with ``&``, as CI may be) ignores SIGINT, a child inherits that, and Python then installs no
    KeyboardInterrupt handler, so the child would rightly run on. Dies with its parent too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _ExitedEarlyError(RuntimeError):
    """redis-server exited before answering PING (a taken port, or a bad argument)."""


@dataclass
class RedisServer:
    """One redis-server process. ``restart()`` keeps its port and data dir (for outage tests)."""

    binary: str
    extra_args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="pr-redis-"))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    started: bool = False  # once true, the port is fixed: clients hold the URL

    def start(self) -> None:
        # free_port() finds a port that was free a moment ago; a parallel process can take it first. Before
        # any client holds the URL, an early exit is retried on a new port; restart() keeps its port.
        for _ in range(4 if not self.started else 0):
            try:
                self._start()
            except _ExitedEarlyError:
                self.port = free_port()
            else:
                self.started = True
                return
        self._start()
        self.started = True

    def _start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "no", "--protected-mode", "yes", *self.extra_args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise _ExitedEarlyError(f"redis-server exited with {self.proc.returncode}: {' '.join(args)}")
            try:
                # Ours, not another server that had the port (a parallel process's, or a sibling cluster node
                # whose free_port() gave the same number): that one answers while ours fails to bind and exits.
                if self._answering_pid() == self.proc.pid:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def _answering_pid(self) -> int | None:
        """The process id of the redis-server answering on our port (``INFO server``)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
            s.sendall(b"INFO server\r\n")
            data = b""
            while b"process_id:" not in data or not data.split(b"process_id:", 1)[1].count(b"\r\n"):
                chunk = s.recv(4096)
                if not chunk:
                    return None
                data += chunk
        return int(data.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# Debian's location, looked at even when it is not on PATH (a non-root shell may lack /usr/sbin).
FALLBACK_PATHS: tuple[str, ...] = ("/usr/bin/redis-server", "/usr/sbin/redis-server")
CLI_FALLBACK_PATHS: tuple[str, ...] = ("/usr/bin/redis-cli",)

# The one install command every message names, and what `make test` runs itself as root on Debian.
# redis-cli comes from redis-tools: a dependency of redis-server on Debian, named for a redis-server built elsewhere.
INSTALL_COMMAND = "apt-get update && apt-get install -y redis-server redis-tools"


def find_redis_server() -> str | None:
    """The redis-server binary on PATH or at Debian's location, or None."""
    return shutil.which("redis-server") or next((p for p in FALLBACK_PATHS if os.path.exists(p)), None)


def find_redis_cli() -> str | None:
    """The redis-cli binary (the cluster fixture creates its cluster with it) on PATH or at Debian's location."""
    return shutil.which("redis-cli") or next((p for p in CLI_FALLBACK_PATHS if os.path.exists(p)), None)


def missing_binaries() -> list[str]:
    """Which of redis-server and redis-cli are not installed."""
    found = {"redis-server": find_redis_server(), "redis-cli": find_redis_cli()}
    return [name for name, path in found.items() if path is None]


def redis_required() -> bool:
    """Whether a missing redis-server is an error: yes unless ``REQUIRE_REDIS=0`` asks to skip.

    Unset means required, so a fresh machine never passes by silently skipping the Redis tests.
    """
    value = os.environ.get("REQUIRE_REDIS", "").strip()
    if value in ("", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"REQUIRE_REDIS must be 0 (skip the Redis tests) or 1 (require them; the default), got {value!r}")


def install_command() -> str:
    """The exact command that installs redis-server and redis-cli here: as is for root, through sudo otherwise."""
    return INSTALL_COMMAND if os.geteuid() == 0 else f"sudo sh -c '{INSTALL_COMMAND}'"


def missing_redis_message(binary: str = "redis-server") -> str:
    """What to do when ``binary`` is missing: the exact install command, and the explicit way to skip."""
    return (f"{binary} is not installed; the Redis tests need it. Install it (Debian): {install_command()}"
            " -- or skip the Redis tests on purpose with REQUIRE_REDIS=0")


def _can_apt_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None and os.path.exists("/etc/debian_version")


def _apt_install() -> int:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["sh", "-c", INSTALL_COMMAND], env=env, check=False).returncode


def ensure_redis_server(can_install: Callable[[], bool] = _can_apt_install,
                        install: Callable[[], int] = _apt_install) -> int:
    """``make test``'s first step: find redis-server and redis-cli, else install them (Debian, root), else say how.

    Returns the exit code. With ``REQUIRE_REDIS=0`` a missing binary is fine: the Redis tests will be skipped and
    counted.
    """
    required = redis_required()  # a bad REQUIRE_REDIS value is an error even where redis-server exists
    if not (missing := missing_binaries()):
        print(f"redis-server: {find_redis_server()}, redis-cli: {find_redis_cli()}")
        return 0
    if not required:
        print(f"{', '.join(missing)}: not installed; REQUIRE_REDIS=0, so the Redis tests will be skipped")
        return 0
    if can_install():
        print(f"{', '.join(missing)}: not installed; running: {INSTALL_COMMAND}", flush=True)
        install()
        if not (missing := missing_binaries()):
            print(f"redis-server: {find_redis_server()}, redis-cli: {find_redis_cli()}")
            return 0
    print(missing_redis_message(missing[0]), file=sys.stderr)
    return 1


if __name__ == "__main__":
    try:
        sys.exit(ensure_redis_server())
    except ValueError as e:  # a bad REQUIRE_REDIS value
        print(e, file=sys.stderr)
        sys.exit(2)
