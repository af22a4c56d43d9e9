"""Processes a test started and left running, ended before pytest prints its summary.

A worker, a forked horse or a scheduler child that outlives its test goes on
writing to the terminal (an RQ worker retrying a redis-server the session has
stopped, say) after pytest's summary, where it reads as part of the result.
The suite's ``pytest_sessionfinish`` (which runs before the summary is printed)
calls :func:`end_leftovers`: every process still descending from the pytest
process is killed (SIGKILL), and named in one line so the leak stays visible.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def _parents() -> dict[int, int]:
    """Every process's parent pid, from /proc (empty where there is no /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its last ")".
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(pid: int) -> list[int]:
    """The pids of every living process below ``pid``, parents before their children."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:  # a loop, not a recursion: the depth is whatever the tests made
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    return "?"


def end_leftovers(pid: int | None = None) -> list[str]:
    """Kill every process below ``pid`` (default: this one); returns ``"<pid> <command>"`` for each."""
    found = descendants(os.getpid() if pid is None else pid)
    named = [f"{p} {_command(p)}" for p in found]
    for p in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    for p in found:  # reap our own children, so none lingers as a zombie
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(p, 0)
    return named
