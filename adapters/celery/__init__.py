"""The scheduler on Celery: every advance a Celery task (see :mod:`adapters.celery.scheduler`).

Needs ``pip install phaserunner[celery]``.
"""

from adapters.celery.scheduler import (
    ADVANCE_TASK,
    DEFAULT_NAMESPACE,
    CeleryScheduler,
    CeleryTaskRef,
    celery_task_id,
    check_json_only,
    parse_celery_task_id,
)

__all__ = [
    "ADVANCE_TASK",
    "DEFAULT_NAMESPACE",
    "CeleryScheduler",
    "CeleryTaskRef",
    "celery_task_id",
    "check_json_only",
    "parse_celery_task_id",
]


def __getattr__(name: str) -> str:
    if name == "ADVANCE_FUNC":  # deprecated, warned about by adapters.celery.scheduler
        from adapters.celery import scheduler

        return scheduler.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
