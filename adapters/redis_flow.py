"""Deprecated alias of :mod:`adapters.redis.flow`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.flow import ADJUST_RATE, BLOCK_RATE, RELEASE_SLOT, RENEW_SLOT, TAKE_RATE, TAKE_SLOT, RedisFlowStore

__all__ = ["ADJUST_RATE", "BLOCK_RATE", "RELEASE_SLOT", "RENEW_SLOT", "TAKE_RATE", "TAKE_SLOT", "RedisFlowStore"]

moved(__name__, "adapters.redis.flow")
