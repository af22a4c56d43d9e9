"""Deprecated alias of :mod:`adapters.redis.pending`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.pending import PendingReplies, SideConnections

__all__ = ["PendingReplies", "SideConnections"]

moved(__name__, "adapters.redis.pending")
