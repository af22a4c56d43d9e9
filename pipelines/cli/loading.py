"""What every ``pipelines`` command shares: the App it works on (``--app``) and how it prints a time."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime

from pipelines.app import App
from pipelines.errors import ConfigurationError, PipelineError
from pipelines.worker import APP_ENV, load_app

__all__ = ["load", "when"]


def when(t: float | None) -> str:
    """``t`` (seconds) as an ISO time in UTC, to the millisecond; ``-`` for none."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def load(path: str | None) -> App:
    """The App at ``path`` (``package.module:app``), else ``$PIPELINES_APP``; a failed import is a one-line error."""
    path = path or os.environ.get(APP_ENV)
    if not path:
        raise ConfigurationError(f"no app given: pass --app package.module:app or set {APP_ENV}")
    # The console script does not put the working directory on sys.path
    # (python -m does); an app module next to the user must still import.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_app(path)
    except PipelineError:
        raise
    except Exception as exc:  # the user's module failed at import: say so, without a traceback
        raise ConfigurationError(f"cannot load app {path!r}: {type(exc).__name__}: {exc}") from exc

