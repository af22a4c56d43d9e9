"""The worker side of any queue: finding the App by import path, and the advance a queue message runs.

A queue adapter only carries data: the import path of :func:`advance_job`
(``"pipelines.worker.advance_job"``), the job id, the turn's version and the
app path. This module turns that back into an advance, for RQ today and any
other queue the same way. The App is loaded once per process (a forking
worker's horses reuse the parent's, see :func:`use_app`).
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
from typing import Any

from pipelines.app import App
from pipelines.engine.errors import ConfigurationError, PipelineError

__all__ = ["APP_ENV", "advance_job", "forget_apps", "load_app", "use_app"]

APP_ENV = "PIPELINES_APP"
"""Environment variable naming the app (``pkg.mod:app``) when nothing else does."""

_apps: dict[str, App] = {}
_default: list[App] = []
_lock = threading.Lock()


def load_app(path: str) -> App:
    """Import ``"package.module:attribute"`` and return the :class:`App` it names.

    The attribute may be an ``App`` or a function of no arguments returning
    one. Every failure is a :class:`ConfigurationError` naming the path.
    """
    if not isinstance(path, str):
        raise ConfigurationError(f"app path must be a string like 'package.module:app', got {type(path).__name__}")
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr or module_name.startswith("."):
        raise ConfigurationError(f"app path must look like 'package.module:app', got {path!r}")
    obj = _attribute(_module(module_name, path), module_name, attr)
    if inspect.isfunction(obj):
        obj = _call_factory(obj, path)
    if not isinstance(obj, App):
        raise ConfigurationError(f"{path!r} is a {type(obj).__name__}, not a pipelines.App")
    return obj


def _module(module_name: str, path: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except PipelineError:
        raise  # already says what is wrong (a bad Redis URL in the app module, say)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} for app {path!r}: {exc}") from exc
    except Exception as exc:  # an app module that fails at import is a configuration problem
        raise ConfigurationError(f"cannot load app {path!r}: {type(exc).__name__}: {exc}") from exc


def _attribute(module: Any, module_name: str, attr: str) -> Any:
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _call_factory(fn: Any, path: str) -> Any:
    if any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
           for p in inspect.signature(fn).parameters.values()):
        raise ConfigurationError(f"{path!r} is a function that needs arguments; it must return an App")
    try:
        return fn()  # a factory function returning the app
    except PipelineError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"the app factory {path!r} failed: {type(exc).__name__}: {exc}") from exc


def use_app(app: App, *, path: str | None = None) -> None:
    """Make ``app`` this process's app (what ``pipelines worker`` does before it forks).

    With ``path`` it also answers jobs that name that app path, so a forking
    worker's horses reuse the parent's app instead of importing it per job.
    """
    with _lock:
        _default[:] = [app]
        if path is not None:
            _apps[path] = app


def forget_apps() -> None:
    """Drop the process's app and every cached one (tests; a worker never needs it)."""
    with _lock:
        _default.clear()
        _apps.clear()


def resolve_app(path: str | None) -> App:
    """The App for an advance naming ``path`` (else this process's, else ``$PIPELINES_APP``)."""
    with _lock:
        if path is None and _default:
            return _default[0]
        path = path or os.environ.get(APP_ENV)
        if not path:
            raise ConfigurationError(
                f"no app for this advance: pass app= to the scheduler, run `pipelines worker --app ...`, "
                f"or set {APP_ENV}")
        app = _apps.get(path)
        if app is None:
            app = _apps[path] = load_app(path)
        return app


def advance_job(job_id: str, version: int | None = None, app: str | None = None) -> str:
    """What a queue message runs: advance ``job_id`` with the app it belongs to; returns what happened.

    The return value is an :class:`~pipelines.engine.runner.AdvanceResult` value, a
    plain string, so a JSON serializer can store it. ``version`` names the
    turn the message was sent for; the runner's fencing makes any mismatch
    harmless.
    """
    return str(resolve_app(app).advance(job_id).value)
