"""How the ``pipelines`` command ends on a failure: one line on stderr naming the problem and the fix.

:func:`error_line` turns an exception into ``error: <what went wrong>; <what to do>`` (never a
traceback, never a second line); :func:`closed_pipe` ends the command quietly when whoever read
its output went away (``pipelines jobs | head -1``).
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from pipelines.errors import JobNotFoundError, StorageUnavailableError, WaitTimeoutError

__all__ = ["CLOSED_PIPE_EXIT", "closed_pipe", "error_line"]

CLOSED_PIPE_EXIT = 141
"""The exit code after a closed pipe: 128 + SIGPIPE, what a shell reports for ``yes | head -1``."""


def _fix(exc: BaseException, app: str) -> str:
    """What to do about ``exc``, or "" when its message already says it."""
    if isinstance(exc, JobNotFoundError):
        return f"`pipelines jobs{app}` lists the jobs this app's storage holds"
    if isinstance(exc, StorageUnavailableError) or _is_backend_connection_error(exc):
        asked = getattr(exc, "fix", None) or "is the storage server running where the app's storage points?"
        return f"{asked} `pipelines health{app}` checks it"
    if isinstance(exc, WaitTimeoutError):
        if exc.status in ("waiting", "paused"):
            return ""  # its message says whom it waits for and what to run; no worker is missing
        return (f"the job goes on; is a worker running for this app (`pipelines worker{app}`)? "
                f"`pipelines status{app} JOB` shows where it is")
    return ""


def _is_backend_connection_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("redis", "rq") and type(exc).__name__ in (
        "ConnectionError", "TimeoutError", "BusyLoadingError")


def error_line(exc: BaseException, app_path: str | None = None) -> str:
    """``error: ...`` on one line: the exception's message (a backend's with its type), then the fix if known."""
    text = str(exc)
    if type(exc).__module__.split(".")[0] in ("redis", "rq"):
        text = f"{type(exc).__name__}: {text}"
    text = " ".join(part.strip() for part in text.splitlines() if part.strip()) or type(exc).__name__
    fix = _fix(exc, f" --app {app_path}" if app_path else "")
    return f"error: {text}; {fix}" if fix else f"error: {text}"


def closed_pipe(out: TextIO) -> int:
    """The reader of ``out`` is gone: nothing more to say, and nothing at exit either.

    Python flushes stdout once more at exit, which would fail again and print
    "Exception ignored ... BrokenPipeError"; pointing the descriptor at
    /dev/null first makes that flush a no-op.
    """
    if out is sys.stdout or out is sys.__stdout__:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no real descriptor behind it: nothing will be flushed at exit
            pass
    return CLOSED_PIPE_EXIT
