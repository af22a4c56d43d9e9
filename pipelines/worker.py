"""The worker side of any queue: the worker's App, and the advance a queue message runs.

A queue adapter only carries data: the import path of :func:`advance_job`
(:data:`ADVANCE_FUNC`), the job id, the turn's version and, at most, the
path of the app the message was sent for. This module turns that back into
an advance, for RQ today and any other queue the same way. Two rules hold
for every worker:

**A queue message carries data, never a choice of code.** What a worker
runs is fixed when it starts: the one entry point (``pipelines worker``
refuses RQ messages that name any other function, an instance or a
callback: :func:`adapters.rq.entry.entry_point_job`) and the worker's own
App: the one given to :func:`use_app` (``pipelines worker --app M:A`` does
that before it forks), else ``$PIPELINES_APP``, else, for Celery, the
``app=`` of the ``CeleryScheduler`` the worker's own module builds. A
message that names another app is refused and logged, and that app is never
imported: a broker writer must not pick a module for the worker to import
and a callable for it to call. A message naming the worker's own app (what
a scheduler built with ``app=`` sends, and what messages already in flight
during a rolling upgrade carry) is served.

**Whatever lives with a lease is renewed with it and released with it.** A
worker's work-horse and its scheduler child live with the worker: they
watch it and end when it dies (a horse never commits a turn after its
worker is gone; an orphaned scheduler keeps no lock), and the worker's
liveness is a key it renews every few seconds, so ``pipelines health`` calls
a dead worker dead long before its jobs' leases run out
(:mod:`adapters.rq.lifeline`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
from typing import Any

from pipelines.app import App
from pipelines.engine.errors import ConfigurationError, InvalidInputError, PipelineError

__all__ = ["ADVANCE_FUNC", "APP_ENV", "advance_job", "advance_with_default", "forget_apps", "load_app",
           "use_app", "worker_app"]

logger = logging.getLogger(__name__)

ADVANCE_FUNC = "pipelines.worker.advance_job"
"""The worker's entry point, as a queue message names it: a dotted path, never a pickled callable."""

APP_ENV = "PIPELINES_APP"
"""Environment variable naming the app (``pkg.mod:app``) when nothing else does."""

_SHOWN = 200  # a message's app path is shown at most this long in a refusal (it is outside input)

_own: list[tuple[App, str | None]] = []  # the worker's app and the path it was started with
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
    """Make ``app`` this worker's app (what ``pipelines worker`` does before it forks).

    ``path``: the import path the worker was started with; messages naming
    it are served (those a scheduler built with ``app=path`` sends). A
    forking worker's horses inherit the app, so nothing is imported per job.
    """
    if not isinstance(app, App):
        raise ConfigurationError(f"use_app needs a pipelines.App, got {type(app).__name__}")
    with _lock:
        _own[:] = [(app, path)]


def forget_apps() -> None:
    """Drop the process's app (tests; a worker never needs it)."""
    with _lock:
        _own.clear()


def worker_app(named: object = None, *, default: str | None = None) -> App:
    """The App an advance runs with: the worker's own; ``named`` (the app a message names) must be it.

    The worker's app is the one given to :func:`use_app`, else the one
    ``$PIPELINES_APP`` names, else ``default`` (the path the worker's own
    configuration names, never a message's), loaded once. A message naming
    no app, the worker's app path, or an attribute of an already imported
    module that is the worker's App, is served; any other raises
    :class:`InvalidInputError` (logged) and nothing is imported.
    """
    app, path = _own_app(default)
    if named is None or (isinstance(named, str) and (named == path or _names_loaded(named, app))):
        return app
    shown = repr(named)[:_SHOWN] if isinstance(named, str) else f"a {type(named).__name__}"
    message = (f"refused an advance naming app {shown}: this worker runs {path or 'its own app'!r}; a queue "
               f"message carries data, never a choice of code, so the app it names is not imported")
    logger.warning("%s", message)
    raise InvalidInputError(message)


def _own_app(default: str | None) -> tuple[App, str | None]:
    with _lock:
        if not _own:
            path = os.environ.get(APP_ENV) or default
            if not path:
                raise ConfigurationError(
                    f"no app for this advance: run `pipelines worker --app ...`, call pipelines.worker.use_app(app) "
                    f"in the worker, or set {APP_ENV}")
            _own.append((load_app(path), path))
        return _own[0]


def _names_loaded(named: str, app: App) -> bool:
    """Whether ``named`` is ``module:attr`` of a module already imported whose attribute is ``app``.

    Only dictionary look-ups: nothing is imported, no attribute hook runs. It
    keeps a worker given its app as an object (``use_app(app)``) serving the
    messages of a scheduler that names that app by path.
    """
    module_name, sep, attr = named.partition(":")
    module = sys.modules.get(module_name) if sep else None
    return module is not None and vars(module).get(attr) is app


def advance_job(job_id: str, version: int | None = None, app: str | None = None) -> str:
    """What a queue message runs: advance ``job_id`` with the worker's app; returns what happened.

    The return value is an :class:`~pipelines.engine.runner.AdvanceResult` value, a
    plain string, so a JSON serializer can store it. ``version`` names the
    turn the message was sent for; the runner's fencing makes any mismatch
    harmless. ``app``: the app path the message names; anything but the
    worker's own is refused (see :func:`worker_app`).
    """
    return str(worker_app(app).advance(job_id).value)


def advance_with_default(default_app: str | None, job_id: str, version: int | None = None,
                         app: str | None = None) -> str:
    """:func:`advance_job` for a worker whose own configuration names its app (a Celery task).

    ``default_app`` is the app path the task was registered with, in the
    worker's own process; it is the worker's app unless :func:`use_app` or
    ``$PIPELINES_APP`` says otherwise. Never a message's entry point: a
    message cannot name its own default.
    """
    return str(worker_app(app, default=default_app).advance(job_id).value)
