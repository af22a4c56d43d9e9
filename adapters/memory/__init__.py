"""In-memory storage and scheduler, for tests and the offline demo.

* :mod:`adapters.memory.storage`: :class:`MemoryStorage`, everything kept as
  JSON text (what Redis would reject is rejected here too), thread-safe.
* :mod:`adapters.memory.scheduler`: :class:`MemoryScheduler`, advances in due
  order on a :class:`VirtualClock` (``drain()`` never sleeps).
* :mod:`adapters.memory.flow`: the flow-control state in process memory.
* :mod:`adapters.memory.history`, :mod:`adapters.memory.listing`: the record's
  turn history kept apart, and the sorted listing indexes.
"""

from adapters.memory.clock import VirtualClock
from adapters.memory.scheduler import MemoryScheduler
from adapters.memory.storage import MemoryStorage

__all__ = ["MemoryScheduler", "MemoryStorage", "VirtualClock"]
