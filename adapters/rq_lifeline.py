"""Deprecated alias of :mod:`adapters.rq.lifeline`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.rq.lifeline import ALIVE_FIELD, Lifeline, alive_key, watch_parent

__all__ = ["ALIVE_FIELD", "Lifeline", "alive_key", "watch_parent"]

moved(__name__, "adapters.rq.lifeline")
