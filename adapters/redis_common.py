"""Deprecated alias of :mod:`adapters.redis.client`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.client import driver_info, settle_driver_info

__all__ = ["driver_info", "settle_driver_info"]

moved(__name__, "adapters.redis.client")
