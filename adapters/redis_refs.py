"""Deprecated alias of :mod:`adapters.redis.refs`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.redis.refs import REF_MIN_BYTES, JournalValues, slice_parts

__all__ = ["REF_MIN_BYTES", "JournalValues", "slice_parts"]

moved(__name__, "adapters.redis.refs")
