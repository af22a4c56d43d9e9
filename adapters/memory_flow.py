"""Deprecated alias of :mod:`adapters.memory.flow`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters._moved import moved
from adapters.memory.flow import MemoryFlowStore, take_from_bucket

__all__ = ["MemoryFlowStore", "take_from_bucket"]

moved(__name__, "adapters.memory.flow")
