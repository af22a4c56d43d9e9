"""Deprecated alias of :mod:`adapters.rq.entry`, where this module moved; removed in the next release."""

from __future__ import annotations

from adapters.rq.entry import entry_point_job

__all__ = ["entry_point_job"]

# No warning yet: pipelines/cli.py imports this path (moved to the new one in a later change).
