"""Child processes of the bench: a private redis-server and RQ worker processes, always killed by pid."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.redis_server import find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[1]


def redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


class Children:
    """Processes started by the bench, each in its own session; :meth:`stop_all` ends them by pid."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pr-bench-"))
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.notes: list[str] = []

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until it exits
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def redis(self) -> str:
        """Start a private redis-server on a free port; its URL."""
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError("redis-server not found")
        port = free_port()
        data = self.dir / "redis"
        data.mkdir()
        proc = self.start("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                                    "--save", "", "--appendonly", "no", "--protected-mode", "yes"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}\n{self.logs()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return f"redis://127.0.0.1:{port}/0"
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING within 10 s")

    def python(self, name: str, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env}
        full_env.pop("PIPELINES_APP", None)
        return self.start(name, [sys.executable, *args], env=full_env)

    def logs(self, tail: int = 2000) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-tail:]}"
                         for p in sorted(self.dir.glob("*.log")))

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
        """SIGTERM the child's process group (RQ: warm shutdown), SIGKILL it if it lingers."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group may hold RQ's scheduler child or a horse
        if proc.poll() is None:
            proc.wait(5)

    def stop_all(self) -> None:
        # Workers first, redis-server last (workers shut down cleanly while it is still up).
        for _name, proc in sorted(self.procs, key=lambda np: np[0] == "redis"):
            self.stop(proc)
        self.procs.clear()

    def cleanup(self) -> None:
        self.stop_all()
        shutil.rmtree(self.dir, ignore_errors=True)
