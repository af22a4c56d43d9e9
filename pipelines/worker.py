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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipelines.app import App
from pipelines.app.entry import WORKER_ENTRY
from pipelines.engine import telemetry
from pipelines.engine.errors import (
    ConfigurationError,
    InvalidInputError,
    PipelineError,
    StorageError,
    StorageUnavailableError,
)

if TYPE_CHECKING:
    from adapters.rq import RQScheduler

__all__ = ["ADVANCE_FUNC", "ALIVE_TTL_RANGE", "APP_ENV", "advance_job", "advance_with_default", "forget_apps",
           "load_app", "prune_functions", "rq_scheduler", "run_rq_worker", "start_sweeper", "upgrade_records",
           "use_app", "warm_up", "worker_app"]

logger = logging.getLogger(__name__)

ADVANCE_FUNC = WORKER_ENTRY.advance
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


# --- an RQ worker (``pipelines worker``) ---------------------------------------------
def rq_scheduler(app: App) -> RQScheduler:
    """The app's scheduler as an RQ scheduler: ``pipelines worker`` runs RQ workers only."""
    from adapters.redis import RedisStorage
    from adapters.rq import RQScheduler

    if not isinstance(app.scheduler, RQScheduler):
        raise ConfigurationError(
            f"`pipelines worker` needs an app whose scheduler is adapters.rq.RQScheduler, "
            f"not {type(app.scheduler).__name__}"
        )
    if isinstance(app.storage, RedisStorage) and app.scheduler.namespace != app.storage.prefix:
        # Two apps on one Redis would otherwise overwrite each other's queue messages.
        raise ConfigurationError(
            f"the RQ scheduler's namespace {app.scheduler.namespace!r} differs from the storage prefix "
            f"{app.storage.prefix!r}; build it with RQScheduler.for_storage(storage, ...)")
    return app.scheduler



def warm_up(app: App) -> Callable[[], object] | None:
    """What imports and warms litellm before the worker's first take (None: no agent needs it).

    It runs to the end before the worker asks RQ for a job (adapters.rq.priority), never beside one:
    a job taken while litellm still loads (~4 s, 10 s and more on a busy 2-core host) holds the
    job's lease through the import, and a worker that dies meanwhile costs the job a whole lease.
    When litellm loaded on a thread after the first take, workers restarted every few seconds
    (make chaos) advanced no job at all. Forked work-horses inherit the loaded module.
    """
    if not any(agent.uses_litellm for agent in app.agents.values()):
        return None  # no agent calls litellm: forking a process that imported it would only cost
    try:
        module = importlib.import_module("phases.litellm_model")
    except ImportError:
        return None
    warm = getattr(module, "warm", None)
    return warm if callable(warm) else None


def prepare_parent(app: App) -> None:
    """What every turn would otherwise do first in a process, done once in the worker before it takes a job.

    A forking worker's horses (one a turn) inherit what this process holds, and redo whatever it left
    undone: the OpenTelemetry API's lookup (its propagators are found through entry points: ~5 ms of
    imports) and, on Redis, the key layout check and the function library's (a round trip each).
    Measured in bench/README.md (figure 12). A layout other than the one recorded for the prefix is
    refused here, at start, not by every turn.
    """
    from adapters.redis import RedisStorage

    telemetry.enabled()
    if isinstance(app.storage, RedisStorage):
        try:
            app.storage.conn.check_layout(None)
        except StorageUnavailableError:
            logger.warning("Redis unreachable at start: the key layout is checked by the first turn instead")
            return
        try:
            app.storage.conn.check_library()
        except StorageError as exc:  # a server busy or out of memory now: each call checks, as it would
            logger.warning("the turn's function library is checked by the first turn instead: %s", exc)


def prune_functions(app: App) -> tuple[str, list[str] | None]:
    """Delete other versions' Redis function libraries (``pipelines prune-functions``): this version's name, those gone.

    ``None`` for those gone: the server has no functions. A storage other than Redis has none:
    :class:`ConfigurationError`.
    """
    from adapters.redis import RedisStorage
    from adapters.redis.library import LIBRARY

    if not isinstance(app.storage, RedisStorage):
        raise ConfigurationError(f"{type(app.storage).__name__} keeps no Redis functions: nothing to prune")
    return LIBRARY.name, app.storage.conn.prune_libraries()


def upgrade_records(app: App) -> tuple[str, bool]:
    """Step 2 of moving ``app``'s Redis prefix to the newest record format (``pipelines upgrade-records``; see
    :mod:`adapters.redis.record_format`): the prefix, and ``True`` if it moved now (``False``: it was there).

    A storage other than Redis has one record format: :class:`ConfigurationError`.
    """
    from adapters.redis import RedisStorage, upgrade_record_format

    if not isinstance(app.storage, RedisStorage):
        raise ConfigurationError(f"{type(app.storage).__name__} has one record format: nothing to upgrade")
    return app.storage.prefix, upgrade_record_format(app.storage)


def start_sweeper(app: App, interval: float, grace: float, stop: threading.Event) -> threading.Thread:
    """Re-enqueue overdue jobs every ``interval`` seconds (once now, then on a thread) until ``stop`` is set."""
    def sweep() -> None:
        try:
            requeued = app.requeue_overdue(grace=grace)
        except Exception:  # Redis down for a moment must not end the sweep for good
            logger.warning("sweep failed; trying again in %.1fs", interval, exc_info=True)
            return
        if requeued:
            logger.warning("sweep: re-enqueued %d overdue job(s): %s", len(requeued), ", ".join(requeued[:10]))

    def loop() -> None:
        while not stop.wait(interval):
            sweep()

    # One sweep in the main thread first: its lazy imports happen now, not in
    # the thread while the worker forks.
    sweep()
    thread = threading.Thread(target=loop, name="pipelines-sweep", daemon=True)
    thread.start()
    return thread



ALIVE_TTL_RANGE = (1.0, 3600.0)
"""The seconds a worker's alive key may live: below one a busy machine's beat could miss it; above an hour a dead
worker would look alive for that long."""


def listened_queues(app_queues: list[str], queue: str | None) -> list[str]:
    """The RQ queues a worker listens on, highest priority first: ``--queue`` (``queue``) read as the app's.

    The app's scheduler sends background runs to ``<queue>-background``: naming its queue (``--queue
    agents``, as the docs show) serves both, as no ``--queue`` does. A priority queue named on its own
    (``agents-background``) is listened on alone. Any other name is refused: the app sends nothing there
    (its sweep re-sends overdue jobs to its own queues), so a typo would leave every job waiting.
    """
    if queue is None or queue == app_queues[0]:
        return list(app_queues)
    if queue in app_queues:
        return [queue]  # a worker kept for one priority
    raise ConfigurationError(f"--queue {queue!r} is not a queue of this app: its scheduler sends to "
                             f"{', '.join(app_queues)}; name one of them, or none for all")


def run_rq_worker(app: App, *, path: str | None, queue: str | None = None, burst: bool = False,
                  simple: bool = False, name: str | None = None, sweep_interval: float = 2.0,
                  sweep_grace: float = 5.0, log_level: str = "INFO", background_every: int = 5,
                  alive_ttl: float = 10.0) -> None:
    """Run an RQ worker for ``app`` (``pipelines worker``): its entry point only, RQ's scheduler, the sweep.

    ``path`` is the app's import path, the one a message may name (see :func:`use_app`).
    ``alive_ttl``: seconds after which a worker that stopped renewing its alive key counts as dead
    (``pipelines health``, the workers page); it renews it every third of that.
    """
    low, high = ALIVE_TTL_RANGE
    if isinstance(alive_ttl, bool) or not isinstance(alive_ttl, int | float) or not low <= alive_ttl <= high:
        raise InvalidInputError(f"alive_ttl must be seconds in [{low:g}, {high:g}], got {alive_ttl!r}")
    from rq import Queue
    from rq.serializers import JSONSerializer

    from adapters.rq.entry import entry_point_job
    from adapters.rq.priority import PrioritySimpleWorker, PriorityWorker

    scheduler = rq_scheduler(app)
    named = scheduler.app
    if named is not None and named != path and not _names_loaded(named, app):
        # Checked now, not per message: each would be refused, the sweep would send it again, and every job
        # would wait at "running" with nothing in its log to say why.
        raise ConfigurationError(f"the app's scheduler sends advances naming app {named!r}, but this worker "
                                 f"runs {path or 'an app given as an object'!r} and would refuse every one: give "
                                 f"the scheduler app={path!r} (the path the worker imports), or start the worker "
                                 f"with --app {named}")
    use_app(app, path=path)
    # Interactive first, then background (a share of takes keeps it from starving: adapters.rq.priority).
    names = listened_queues(scheduler.queue_names, queue)
    queues = [Queue(q, connection=scheduler.connection, serializer=JSONSerializer) for q in names]
    worker_class = PrioritySimpleWorker if simple else PriorityWorker
    # The worker runs its entry point and nothing else a message names (see the module docstring).
    worker = worker_class(queues, connection=scheduler.connection, name=name, serializer=JSONSerializer,
                          job_class=entry_point_job(ADVANCE_FUNC))
    worker.background_every = background_every
    worker.alive_ttl, worker.alive_every = float(alive_ttl), alive_ttl / 3
    worker.warm_up = warm_up(app)
    prepare_parent(app)
    stop = threading.Event()
    if sweep_interval > 0:
        start_sweeper(app, sweep_interval, sweep_grace, stop)
    try:
        worker.work(burst=burst, with_scheduler=True, logging_level=log_level)
    finally:
        stop.set()
