"""Deprecated alias of :mod:`adapters.redis.recent`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.recent import RecentReads

__all__ = ["RecentReads"]

moved(__name__, "adapters.redis.recent")
