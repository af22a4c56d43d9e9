"""The deprecation warning of a module alias left behind where a module moved (kept for one release)."""

from __future__ import annotations

import warnings

__all__ = ["moved"]


def moved(old: str, new: str) -> None:
    """Warn that module ``old`` is an alias of ``new`` (a ``DeprecationWarning``: shown in tests and with ``-W``)."""
    warnings.warn(f"{old} moved to {new}: import it from there ({old} is a deprecated alias, removed in the next "
                  "release)", DeprecationWarning, stacklevel=3)
