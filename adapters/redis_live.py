"""Deprecated alias of :mod:`adapters.redis.live`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.live import LiveReads, behind_first

__all__ = ["LiveReads", "behind_first"]

moved(__name__, "adapters.redis.live")
