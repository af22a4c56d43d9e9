"""Deprecated alias of :mod:`adapters.rq.priority`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.rq.priority import DEFAULT_BACKGROUND_EVERY, PrioritySimpleWorker, PriorityWorker, priority_order

__all__ = ["DEFAULT_BACKGROUND_EVERY", "PrioritySimpleWorker", "PriorityWorker", "priority_order"]

moved(__name__, "adapters.rq.priority")
