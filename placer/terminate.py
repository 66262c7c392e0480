"""Signals a command heeds: SIGTERM as an exception inside a block, Ctrl-C recorded even where a library
swallows it, and both held back while outputs are put in place.

* :func:`terminate_raises`: SIGTERM raises inside a block, so that a process that starts others stops them
  and removes its temporary files before it terminates (Python's default action ends it at once, leaving
  both behind).
* :func:`interrupts_recorded`: Ctrl-C (SIGINT) raises KeyboardInterrupt as always, and is remembered, so
  that a command whose library caught the exception (a solver that stops and returns its best so far, a
  search that keeps what it had) still ends as interrupted: :func:`raise_if_interrupted` before an output
  is written, and exit status 130.
* :func:`signals_deferred`: SIGINT and SIGTERM wait until a block (outputs renamed into place) has ended.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = [
    "Terminated",
    "terminate_raises",
    "interrupts_recorded",
    "interrupted",
    "raise_if_interrupted",
    "signals_deferred",
]


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
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
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
        signal.raise_signal(signal.SIGTERM)  # terminate, now that the block has cleaned up
        raise  # (not reached)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: Whether SIGINT came within the outermost :func:`interrupts_recorded` block open now (or last open).
_interrupted = False
#: Whether an :func:`interrupts_recorded` block is open.
_recording = False


def _on_interrupt(signum, frame) -> None:
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


@contextmanager
def interrupts_recorded() -> Iterator[None]:
    """Inside the block, Ctrl-C raises KeyboardInterrupt as Python's own handler does, and is remembered
    (:func:`interrupted`) should a library swallow the exception.

    Only in the main thread, and only where SIGINT has Python's default handler: a block inside another
    shares the outer one's record, and a process that ignores SIGINT (started in the background) still
    does. The record is cleared when the outermost block opens.

    Examples
    --------
    >>> import signal
    >>> with interrupts_recorded():
    ...     try:
    ...         signal.raise_signal(signal.SIGINT)
    ...     except KeyboardInterrupt:
    ...         pass                  # swallowed, as OR-Tools or a search's "keep the best" would
    ...     interrupted()
    True
    """
    global _interrupted, _recording
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    _interrupted, _recording = False, True
    signal.signal(signal.SIGINT, _on_interrupt)
    try:
        yield
    finally:
        _recording = False
        signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted() -> bool:
    """Whether Ctrl-C came inside the :func:`interrupts_recorded` block open now (or the last one)."""
    return _interrupted


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C came inside the :func:`interrupts_recorded` block open now, even
    where the exception it raised was caught since: what the command made after it is not its result."""
    if _interrupted and _recording:
        raise KeyboardInterrupt


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside the block, SIGINT and SIGTERM wait: each that came is raised again once it ends.

    For the few renames that put a command's outputs in place, so that a signal leaves either all the
    previous files or all the new ones; and for starting a child process, so that one started is one its
    parent knows to stop. Only in the main thread, and only for a signal whose handler was
    set from Python or is the default (one set from C is left as it is); an ignored signal stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def defer(signum, frame) -> None:
        pending.append(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None and handler is not signal.SIG_IGN:
            previous[signum] = handler
            signal.signal(signum, defer)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)
