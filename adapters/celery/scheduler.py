"""The :class:`~adapters.base.Scheduler` port on Celery: every advance is a Celery task.

Only data crosses the queue (I8). A message here is the task
``"phaserunner.advance"`` with::

    args   [job_id, version]           (JSON)
    kwargs {"app": "pkg.mod:app"}      (only when the scheduler names its app)

sent with Celery's ``json`` serializer. The scheduler refuses a Celery app
that would accept or produce anything else (pickle, yaml, msgpack): a worker
that accepts pickle runs whatever a message carries. The task body imports
the worker's advance by its path, when it runs: the path is the App's to tell
(:attr:`~adapters.base.WorkerEntry.advance_with_default`, given to
:meth:`CeleryScheduler.bind` when an App is built with the scheduler, which
the module ``celery -A`` loads does). This module never names the composing
layer.

A message carries data, never a choice of code: the task is found by name in
the worker's registry, and the app it advances with is the worker's own,
fixed by the worker's process (``use_app``, ``$PIPELINES_APP``, else the
``app=`` of the first ``CeleryScheduler`` built on this Celery app there,
which is what ``celery -A <module>`` loads). A message naming another app
is refused and logged; its app is never imported.

One task id per turn
--------------------
The task id of an advance is ``<namespace>_n<job id>-v<version>`` with the
same injective escaping as the RQ adapter (``_`` → ``__``, ``.`` → ``_d``,
``:`` → ``_c``), written again here so this module does not import RQ. The
namespace (the storage's key prefix) keeps two apps on one broker apart.
Celery does not deduplicate ids: a turn sent twice is delivered twice, and
the runner's lease and version fence make the second a no-op (I6).

Delays and the sweep
--------------------
Delays use the task's ``countdown``. Storage's due index stays the truth (I7):
a message lost with its broker, or revoked, is re-sent by the sweep
(``pipelines advance --due`` from cron, or the Celery beat entry shown in
``examples/celery``). The sweep's re-send is :meth:`CeleryScheduler.requeue`;
it uses a fresh id (``...-v<version>-r<random>``), because a Celery worker
drops every message whose id it has seen revoked.

Recommended worker settings
---------------------------
The task is declared ``acks_late=True`` and ``reject_on_worker_lost=True``
(set ``task_acks_late`` and ``task_reject_on_worker_lost`` on the Celery app
too, for its other tasks). Why: with early acks a worker killed mid-turn has
already acknowledged the message, and only the sweep would recover the job;
with late acks the broker delivers it again, and the job's lease fences the
redelivery against a turn that is still running somewhere. No soft time limit
should apply to it: a worker warns at start of one that does (``_soft_limit_check``).
"""

from __future__ import annotations

import importlib
import logging
import re
import time
import uuid
import warnings
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from kombu.exceptions import OperationalError

from adapters.base import Feature, KeyPrefixed, SchedulerHost
from adapters.celery import lifeline
from pipelines.engine.capabilities import as_feature
from pipelines.engine.errors import ConfigurationError, InvalidInputError, StorageUnavailableError
from pipelines.engine.models import validate_job_id

if TYPE_CHECKING:
    from celery import Celery  # type: ignore[import-untyped]

__all__ = [
    "ADVANCE_TASK",
    "DEFAULT_NAMESPACE",
    "CeleryScheduler",
    "CeleryTaskRef",
    "celery_task_id",
    "check_json_only",
    "parse_celery_task_id",
]

ADVANCE_TASK = "phaserunner.advance"
"""The Celery task name of an advance (what the message names; the worker looks it up in its registry)."""
# What the task body of each Celery app imports and calls on the worker (a dotted path, never a pickled callable):
# told by the App built with a scheduler on that Celery app (CeleryScheduler.bind).
_ENTRIES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
REFUSED = "refused"
"""What the advance task returns for a message its worker refuses (logged as one line, no traceback)."""
DEFAULT_NAMESPACE = "pr"
"""The storage key prefix a scheduler assumes when it is given none (RedisStorage's default)."""

logger = logging.getLogger(__name__)
_SHOWN = 200  # a job id from a message is shown at most this long (it is outside input)
_JSON = {"json", "application/json"}
_NAMESPACE_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")
_ENCODE = {"_": "__", ".": "_d", ":": "_c"}
_DECODE = {v[1]: k for k, v in _ENCODE.items()}
_NAME = r"(?:[A-Za-z0-9-]|_[_dc])+"  # an escaped name: "_" only ever starts a two-character escape
_TASK_ID = re.compile(rf"(?P<ns>{_NAME})_n(?P<job>{_NAME})-v(?P<version>[0-9]+)(?:-r[0-9a-f]{{32}})?")


class CeleryTaskRef(NamedTuple):
    """What a task id made by :func:`celery_task_id` (or a requeue) names."""

    namespace: str
    job_id: str
    version: int


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not namespace or not set(namespace) <= _NAMESPACE_CHARS:
        raise ConfigurationError(f"a Celery namespace must be 1+ of [A-Za-z0-9._:-], got {namespace!r}")
    return namespace


def _escape(job_id: str, namespace: str) -> str:
    ns = "".join(_ENCODE.get(c, c) for c in _check_namespace(namespace))
    return f"{ns}_n" + "".join(_ENCODE.get(c, c) for c in validate_job_id(job_id))


def _unescape(name: str) -> str:
    return re.sub(r"_(.)", lambda e: _DECODE[e.group(1)], name)


def celery_task_id(job_id: str, version: int, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The task id of ``job_id``'s advance at ``version`` under ``namespace``: ``<ns>_n<job>-v<version>``.

    Injective in all three, only ``[A-Za-z0-9_-]``. A bad job id raises
    :class:`~pipelines.engine.errors.InvalidJobIdError`, a bad namespace
    :class:`~pipelines.engine.errors.ConfigurationError`.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise InvalidInputError(f"version must be an int >= 0, got {version!r}")
    return f"{_escape(job_id, namespace)}-v{version}"


def parse_celery_task_id(task_id: str) -> CeleryTaskRef:
    """Invert :func:`celery_task_id` (a requeue's ``-r<hex>`` suffix too); ``InvalidInputError`` for other ids."""
    m = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
    if m is None:
        raise InvalidInputError(f"{task_id!r} is not a task id made by celery_task_id()")
    return CeleryTaskRef(_unescape(m.group("ns")), _unescape(m.group("job")), int(m.group("version")))


def check_json_only(celery_app: Celery) -> None:
    """Raise :class:`ConfigurationError` unless ``celery_app`` sends, stores and accepts only JSON.

    Checked: ``task_serializer``, ``result_serializer``, ``accept_content``
    and ``result_accept_content`` (when set). The error names the setting and
    the line that fixes it.
    """
    conf = celery_app.conf
    problems = [f"{name}={conf.get(name)!r}" for name in ("task_serializer", "result_serializer")
                if conf.get(name) not in _JSON]
    for name in ("accept_content", "result_accept_content"):
        value = conf.get(name)
        unset = value is None and name == "result_accept_content"  # unset: Celery uses accept_content
        if not unset and (isinstance(value, str) or not value or not set(value) <= _JSON):
            problems.append(f"{name}={value!r}")
    if problems:
        raise ConfigurationError(
            "the Celery app must use only JSON (phaserunner never lets a worker unpickle a message); "
            f"found {', '.join(problems)}; set task_serializer='json', result_serializer='json', "
            "accept_content=['json'] (and result_accept_content=['json'] if you set it)")


def _advance_with(celery_app: Celery, worker_app: str | None) -> Any:
    """The task body: an advance with the worker's app, ``worker_app`` when the worker's process names no other."""
    ref = weakref.ref(celery_app)  # the task lives in the Celery app: no cycle through the body

    def advance(job_id: str, version: int | None = None, app: str | None = None) -> str:
        # The worker's entry point is named by the App (bind) and imported here, on the worker,
        # so adapters never import the composing layer (which imports the App).
        owner = ref()
        entry = None if owner is None else _ENTRIES.get(owner)
        if entry is None:
            raise ConfigurationError(
                "this Celery worker's process built a CeleryScheduler but no phaserunner App with it, so it does "
                "not know what to run: build App(storage=..., scheduler=the scheduler) in the module "
                "`celery -A` loads")
        module, _, name = entry.rpartition(".")
        try:
            return str(getattr(importlib.import_module(module), name)(worker_app, job_id, version, app))
        except (InvalidInputError, ConfigurationError) as exc:
            # A message this worker refuses (another app's, a bad job id) or cannot serve: raised, Celery would
            # log it as a task failure with a full traceback, every time. Nothing to retry either way.
            logger.error("refused %s(%s): %s", ADVANCE_TASK, repr(job_id)[:_SHOWN], exc)
            return REFUSED

    return advance


def register_advance_task(celery_app: Celery, app: str | None = None) -> Any:
    """Register ``"phaserunner.advance"`` on ``celery_app`` (once) and return the task.

    ``app``: the app path the worker advances with when its process sets none
    (see the module docstring); the first registration's counts.
    """
    if ADVANCE_TASK in celery_app.tasks:
        return celery_app.tasks[ADVANCE_TASK]
    from celery import signals

    signals.worker_init.connect(_soft_limit_check(celery_app), weak=False,
                                dispatch_uid=f"phaserunner-soft-limit-{id(celery_app)}")
    # shared=False: a shared task would be added to every Celery app this process finalizes later.
    return celery_app.task(name=ADVANCE_TASK, serializer="json", acks_late=True, reject_on_worker_lost=True,
                           ignore_result=True, shared=False)(_advance_with(celery_app, app))


def _soft_limit_check(celery_app: Celery) -> Any:
    """A ``worker_init`` receiver: at the start of a worker of ``celery_app``, warn when a soft time limit applies
    to the advance task (``task_soft_time_limit``, ``--soft-time-limit``, ``task_annotations``).

    A soft limit raises ``SoftTimeLimitExceeded``, an ordinary ``Exception``, wherever the turn is: in a tool or a
    model call it is taken for the job's own error and fails the job for good. The task cannot opt out of the
    worker's default (the pool applies it to every task that sets none), and a soft limit of its own would keep
    the pool from arming the hard ``task_time_limit`` (armed when the soft one fires): so it is said, not hidden."""

    held = weakref.ref(celery_app)  # the signal keeps its receivers for good: not the Celery app with them

    def check(sender: Any = None, **_: Any) -> None:
        app = held()
        if app is None or sender is None or sender.app is not app:  # the sender: the starting worker
            return
        limit = app.tasks[ADVANCE_TASK].soft_time_limit or sender.soft_time_limit
        if limit:
            logger.warning("a soft time limit of %rs applies to %s (task_soft_time_limit, --soft-time-limit or "
                           "task_annotations): a turn past it fails its job for good (SoftTimeLimitExceeded is "
                           "taken for the job's own error); leave it unset for this worker and bound turns with "
                           "tool and model timeouts (a hard task_time_limit is fine)", limit, ADVANCE_TASK)

    return check


class CeleryScheduler:
    """Schedules advances as Celery tasks on ``queue`` (see the module docstring).

    ``celery_app``: a ``celery.Celery`` configured for JSON only (else
    :class:`ConfigurationError`, see :func:`check_json_only`); the advance
    task is registered on it, so a worker that imports the module building
    this scheduler knows the task. ``app``: the import path of the
    :class:`~pipelines.app.App` (``"pkg.mod:app"``) named in every message
    and advanced with by a worker whose process names no app of its own
    (``use_app`` or ``$PIPELINES_APP``); a worker serves only messages
    naming its own app. ``None``: messages name no app.
    ``namespace``: the key prefix of the storage whose jobs this scheduler
    advances (part of every task id; :meth:`for_storage` takes it from the
    storage). ``precision``: how early a delayed task may arrive (worker and
    broker clocks differ a little).
    """

    # No backlog question: Celery brokers differ. So continue_for keeps a job for its whole window even when
    # other work waits (docs/guide/production.md says so).
    features: ClassVar[frozenset[Feature]] = frozenset({Feature.NAMED_QUEUES, Feature.HOSTED})

    def __init__(self, celery_app: Celery, *, queue: str = "pipelines", app: str | None = None,
                 namespace: str = DEFAULT_NAMESPACE, precision: float = 0.5) -> None:
        check_json_only(celery_app)
        _check_namespace(namespace)
        if not queue or not isinstance(queue, str):
            raise ConfigurationError(f"queue must be a non-empty string, got {queue!r}")
        if app is not None and (not isinstance(app, str) or ":" not in app):
            raise ConfigurationError(f"app must look like 'package.module:app', got {app!r}")
        if not isinstance(precision, int | float) or not 0 <= precision < 60:
            raise ConfigurationError(f"precision must be a number of seconds in [0, 60), got {precision!r}")
        self.celery = celery_app
        self.queue = queue
        self.app = app
        self.namespace = namespace
        self.precision = float(precision)
        lifeline.alive_ttl(celery_app)  # a bad setting is named here, not in a worker's signal handler
        self.task = register_advance_task(celery_app, app)
        lifeline.install(celery_app, namespace)  # a worker's processes tell the workers page they live

    def bind(self, host: SchedulerHost) -> None:
        """Run ``host``'s worker entry (:attr:`~adapters.base.WorkerEntry.advance_with_default`) in the task body."""
        _ENTRIES[self.celery] = host.worker_entry.advance_with_default

    @classmethod
    def for_storage(cls, celery_app: Celery, storage: Any, *, queue: str = "pipelines", app: str | None = None,
                    precision: float = 0.5) -> CeleryScheduler:
        """A scheduler namespaced by ``storage``'s key prefix (a :class:`~adapters.redis.RedisStorage`)."""
        prefixed = as_feature(storage, Feature.KEY_PREFIX, KeyPrefixed)  # type: ignore[type-abstract]
        if prefixed is None:
            raise ConfigurationError(f"for_storage needs a storage with a key prefix (RedisStorage), not "
                                     f"{type(storage).__name__}; give CeleryScheduler(..., namespace=...) instead")
        return cls(celery_app, queue=queue, app=app, namespace=prefixed.key_prefix(), precision=precision)

    # --- Scheduler -----------------------------------------------------------
    def queue_for(self, priority: str | None = None) -> str:
        """The Celery queue advances of ``priority`` go to: ``queue``, or ``<queue>-background`` for background."""
        return self._queue_for(priority)

    def now(self) -> float:
        return time.time()

    def schedule_advance(self, job_id: str, delay: float = 0.0, *, pipeline: str = "default",
                         version: int | None = None, priority: str | None = None) -> None:
        """Send the advance of ``job_id`` at ``version`` now, or with ``countdown=delay``.

        ``priority="background"`` sends it to ``<queue>-background``: start workers with
        ``-Q <queue>,<queue>-background`` (Celery reads the queues in that order).
        """
        validate_job_id(job_id)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay < float("inf"):
            raise InvalidInputError(f"delay must be a number of seconds >= 0, got {delay!r}")
        task_id = self.task_id(job_id, version)
        self._send(task_id, job_id, version, float(delay), self._queue_for(priority))

    def _queue_for(self, priority: str | None) -> str:
        if priority in (None, "interactive"):
            return self.queue
        if priority == "background":
            return f"{self.queue}-background"
        raise InvalidInputError(f"priority must be 'interactive' or 'background', got {priority!r}")

    def requeue(self, job_id: str, *, pipeline: str = "default", version: int | None = None,
                priority: str | None = None) -> None:
        """Send again, now, an advance the queue lost (the sweep), under a fresh id.

        A fresh id because a worker drops any id it has seen revoked. Celery
        over Redis has no "front of the queue": the message joins the queue
        like any other.
        """
        validate_job_id(job_id)
        base = self.task_id(job_id, version) if version is not None else f"{_escape(job_id, self.namespace)}"
        self._send(f"{base}-r{uuid.uuid4().hex}", job_id, version, 0.0, self._queue_for(priority))

    # --- helpers -------------------------------------------------------------
    def task_id(self, job_id: str, version: int | None) -> str:
        """The task id of a turn; without a version there is no turn to name, so a random one."""
        if version is not None:
            return celery_task_id(job_id, version, self.namespace)
        return f"{_escape(job_id, self.namespace)}-x{uuid.uuid4().hex}"

    def _send(self, task_id: str, job_id: str, version: int | None, delay: float, queue: str | None = None) -> None:
        options: dict[str, Any] = {"task_id": task_id, "queue": queue or self.queue, "serializer": "json"}
        if delay > 0:
            options["countdown"] = delay
        try:
            self.celery.send_task(ADVANCE_TASK, args=[job_id, version],
                                  kwargs={"app": self.app} if self.app is not None else {}, **options)
        except (OperationalError, OSError) as exc:  # kombu wraps broker connection errors in OperationalError
            raise StorageUnavailableError(f"scheduling job {job_id!r}: Celery broker unreachable: {exc}") from exc


_DEPRECATED_ADVANCE_FUNC = "pipelines.worker.advance_with_default"  # the old alias's value (see __getattr__)


def __getattr__(name: str) -> str:
    # Deprecated for one release: the App tells its scheduler what a worker runs (App.worker_entry), so this
    # adapter no longer names the composing layer; the one exception is this alias, until it goes.
    if name == "ADVANCE_FUNC":
        warnings.warn(f"{__name__}.ADVANCE_FUNC is deprecated (the App tells its scheduler the worker's entry: "
                      "App.worker_entry); it goes in the next release", DeprecationWarning, stacklevel=2)
        return _DEPRECATED_ADVANCE_FUNC
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
