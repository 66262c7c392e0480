"""Pausing Python's cyclic garbage collector over placer's bulk work.

The collector runs after every few hundred new container objects and, once
enough of them survive, walks every live object. Placer's hot loops (the
simulator's event loop, a list scheduler's bookings) create hundreds of
thousands of small lists and tuples that do survive, so on a large graph the
collector walks the whole heap again and again, which can take as long as
the work itself. That work makes no reference cycles (reference counting
frees everything it drops), so the collector can wait until it ends.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off for the block; back as it was afterwards.

    Nested blocks leave it to the outermost. The collector is per process, so
    another thread's cycles also wait for the block's end.

    Examples
    --------
    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
