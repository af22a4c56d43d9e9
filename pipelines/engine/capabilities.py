"""Optional capabilities of an adapter, checked in this one place (issue 29: honest ports).

Each adapter class declares what it can do once, as ``features`` (a set of
:class:`~adapters.base.Feature`): ``MemoryStorage.features`` names the live
stream's async read, counts, retention, flow limits... Nothing else in the
library probes an adapter with ``getattr`` / ``hasattr``: it asks
:func:`has`, and narrows the type with :func:`as_feature`.

An adapter that declares nothing (one written before features existed, or a
third party's) is judged once per class by the feature protocols
(:data:`~adapters.base.FEATURE_PROTOCOLS`), so it keeps working; the contract
suites check that the library's own adapters declare exactly what they
implement. A wrapper (the offloading storage) declares its inner storage's
features on the instance.
"""

from __future__ import annotations

from typing import TypeVar

from adapters.base import FEATURE_PROTOCOLS, Feature, LateDelivery

__all__ = ["Feature", "as_feature", "features_of", "has", "lateness_of"]

T = TypeVar("T")

_DERIVED: dict[type, frozenset[Feature]] = {}  # features of classes that declare none, judged once each


def features_of(obj: object) -> frozenset[Feature]:
    """What ``obj`` can do: its declared ``features``, else what its class implements (judged once)."""
    declared = getattr(obj, "features", None)  # the one place an adapter is asked what it is
    if isinstance(declared, frozenset):
        return declared
    cls = type(obj)
    found = _DERIVED.get(cls)
    if found is None:
        found = _DERIVED[cls] = frozenset(f for f, proto in FEATURE_PROTOCOLS.items() if isinstance(obj, proto))
    return found


def has(obj: object, feature: Feature) -> bool:
    """Whether ``obj`` (a storage or a scheduler) has ``feature``."""
    return feature in features_of(obj)


def as_feature(obj: object, feature: Feature, protocol: type[T]) -> T | None:
    """``obj`` typed as ``protocol`` when it has ``feature`` (which stands for that protocol), else ``None``."""
    # mypy refuses a Protocol class as type[T] (python/mypy#4717): callers pass one with an ignore.
    return obj if feature in features_of(obj) else None  # type: ignore[return-value]


def lateness_of(scheduler: object) -> float:
    """How late ``scheduler``'s delayed deliveries may arrive (:class:`~adapters.base.LateDelivery`); 0 without."""
    late = as_feature(scheduler, Feature.LATE_DELIVERY, LateDelivery)  # type: ignore[type-abstract]
    return late.lateness() if late is not None else 0.0
