"""Deprecated alias of :mod:`adapters.rq.entry`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.rq.entry import entry_point_job

__all__ = ["entry_point_job"]

moved(__name__, "adapters.rq.entry")
