"""Time boxes: stop a piece of work when its seconds are up, even if it never looks at the clock.

One-pass algorithms (the list schedulers) have no natural place to stop, and
a search's first phase can outlast a short limit; :func:`placer.algorithms.place`
and ``auto`` box them so that a ``time_limit`` holds. Boxes nest: the
innermost box whose time is up ends first, and an outer box's expiry passes
through the inner ones to the outer ``with``.

Boxes use ``SIGALRM``, so they work on the main thread of a POSIX process;
elsewhere a box never expires and the work runs to its end. The interruption
lands between Python bytecodes, so a long call into C (a solver) ends first:
solvers get their own time limit too. It is held off while a box opens or
closes (it would leave the box open) and during an import (a module left half
imported breaks every later import of it), and comes again where Python
swallowed it (a weakref callback or a ``__del__``). Where a library turns it
into an error of its own (numpy's comparisons re-raise it as a TypeError),
the box that expired swallows that error too.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["TimeBox", "OutOfTime", "seconds_left", "optional_work", "OPTIONAL_SHARE", "frugal", "is_frugal"]


class OutOfTime(BaseException):
    """Raised inside a box whose time is up; its ``with`` statement swallows it.

    A BaseException, so that an algorithm's ``except Exception`` does not
    swallow it first.
    """

    def __init__(self, box: "TimeBox"):
        super().__init__(f"time box of {box.seconds:g} s expired")
        self.box = box


#: Seconds after an expiry's exception until the alarm comes again, in case it was swallowed.
RETRY_S = 0.05
#: Seconds between alarms while an expired box waits for an import to end.
IMPORT_WAIT_S = 0.01

#: The boxes open now, outermost first.
_open: list["TimeBox"] = []
_previous_handler = None


def seconds_left() -> float | None:
    """Seconds until the first open box expires, or None when no box is open: for optional work
    that should rather be skipped than cost the result in hand."""
    if not _open:
        return None
    return max(0.0, min(box.deadline for box in _open) - time.perf_counter())


def _arm() -> None:
    """Set the alarm for the box that expires first (or none)."""
    if _open:
        left = min(box.deadline for box in _open) - time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, max(left, 1e-4))
    else:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _on_alarm(signum, frame) -> None:
    now = time.perf_counter()
    expired = [box for box in _open if box.deadline <= now + 1e-4]
    if not expired:  # an alarm for a box that has closed since
        _arm()
        return
    wait = _must_wait(frame)
    if wait:
        # Raised in a box's bookkeeping, it would leave the ``with`` with the box still open (its body
        # may well have ended in time); raised in an import, it would leave the module half imported.
        signal.setitimer(signal.ITIMER_REAL, wait)
        return
    # The outermost expired box: everything inside it ends with it. Should the exception land where
    # Python swallows it (a weakref callback, a __del__), the alarm comes again; once the box has
    # closed, its __exit__ re-arms for the boxes left.
    expired[0].expired = True
    signal.setitimer(signal.ITIMER_REAL, RETRY_S)
    raise OutOfTime(expired[0])


def _must_wait(frame) -> float:
    """Seconds until the alarm should come again where ``frame`` (where it came) runs in a box's
    ``__enter__`` or ``__exit__`` (microseconds of work), or in an import (which can take seconds:
    alarms too frequent would slow it down walking the stack); 0 elsewhere.
    """
    while frame is not None:
        code = frame.f_code
        if code in _BOOKKEEPING:
            return 1e-4
        if code.co_filename.startswith("<frozen importlib"):
            return IMPORT_WAIT_S
        frame = frame.f_back
    return 0.0


class TimeBox:
    """``with TimeBox(seconds) as box:`` runs the body for at most ``seconds``.

    After the ``with``, ``box.expired`` says whether the body was cut short.
    ``seconds=None`` never expires.

    Examples
    --------
    >>> import time
    >>> with TimeBox(0.05) as box:
    ...     while True:
    ...         time.sleep(0.01)
    >>> box.expired
    True
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.deadline = float("inf")
        self.expired = False
        self._active = False

    def __enter__(self) -> "TimeBox":
        global _previous_handler
        if self.seconds is None or threading.current_thread() is not threading.main_thread():
            return self
        self.deadline = time.perf_counter() + max(float(self.seconds), 1e-4)
        if not _open:
            _previous_handler = signal.signal(signal.SIGALRM, _on_alarm)
        _open.append(self)
        self._active = True
        _arm()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._active:
            _open.remove(self)
            self._active = False
            _arm()
            if not _open:
                signal.signal(signal.SIGALRM, _previous_handler)
        if isinstance(exc, OutOfTime):
            return exc.box is self
        return self.expired and isinstance(exc, Exception)  # raised by what the expiry interrupted


_BOOKKEEPING = {TimeBox.__enter__.__code__, TimeBox.__exit__.__code__, _arm.__code__}


#: Share of a running time limit's remaining seconds that each piece of optional work may take (a list
#: schedule built again, one of the budget search's, a fusion into smaller clusters).
OPTIONAL_SHARE = 0.5


def optional_work(took_s: float) -> TimeBox | None:
    """A time box for optional work expected to take ``took_s`` seconds, or None where there is no time for it.

    Under a running time limit the work gets :data:`OPTIONAL_SHARE` of the
    seconds left (the rest is for what follows, such as the plan's validation);
    none where the last such work took longer than that share. Without a time
    limit the box never expires.
    """
    left = seconds_left()
    if left is None:
        return TimeBox(None)
    if OPTIONAL_SHARE * left < took_s:
        return None
    return TimeBox(OPTIONAL_SHARE * left)


#: Open :func:`frugal` blocks.
_frugal_depth = 0


@contextmanager
def frugal() -> Iterator[None]:
    """Within it, an algorithm's optional search costs at most what the algorithm spent before it.

    For algorithms run as part of another's work (``auto``'s portfolio, Pesto's
    warm start), whose time the caller shares out: there the list schedulers'
    search over memory budgets builds no more schedules than the scheduler built
    so far. A count, not seconds, so that the plan does not depend on the
    machine's speed. Outside, a search runs to its end within the time limit, so
    that a generous limit gives the plan that no limit gives.
    """
    global _frugal_depth
    _frugal_depth += 1
    try:
        yield
    finally:
        _frugal_depth -= 1


def is_frugal() -> bool:
    """Whether a :func:`frugal` block is open."""
    return _frugal_depth > 0
