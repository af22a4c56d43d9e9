"""Deprecated alias of :mod:`adapters.rq.recovery`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.rq.recovery import RidesOutOutages, SchedulerKeeper

__all__ = ["RidesOutOutages", "SchedulerKeeper"]

moved(__name__, "adapters.rq.recovery")
