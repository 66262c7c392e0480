"""SIGTERM as an exception inside a block, so that a process that starts others stops them and removes its
temporary files before it terminates: Python's default action ends it at once, leaving both behind."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["Terminated", "terminate_raises"]


class Terminated(BaseException):
    """SIGTERM arrived inside :func:`terminate_raises`'s block."""


@contextmanager
def terminate_raises(said: str | None = None) -> Iterator[None]:
    """Inside the block SIGTERM raises :class:`Terminated`, so that the block's ``finally`` clauses and context
    managers run (stopping child processes, removing directories); afterwards the process terminates as SIGTERM
    asked, printing ``said`` on stderr first where given.

    Only in the main thread, and only where SIGTERM had its default action: a block inside another
    (``placer calibrate`` around a gloo measurement) lets the exception reach the outer one, which terminates.
    The handler is limited to the block because a Python handler waits for a long C call to return
    (a collective, a solver), which the default action does not.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if said:
            print(said, file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)       # terminate, now that the block has cleaned up
        raise                                     # (not reached)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
