"""Deprecated alias of :mod:`adapters.redis.live_async`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.live_async import LoopReads, async_connection_args, loop_reads

__all__ = ["LoopReads", "async_connection_args", "loop_reads"]

moved(__name__, "adapters.redis.live_async")
