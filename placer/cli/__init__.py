"""The ``placer`` command line: one module per group of commands.

:func:`main` is the entry point (``placer = "placer.cli:main"``); the
commands are in :mod:`~placer.cli.core` (plan, simulate, validate, compare,
demo), :mod:`~placer.cli.capture`, :mod:`~placer.cli.cost` (profile,
calibrate, cost), :mod:`~placer.cli.run` (run, tune) and
:mod:`~placer.cli.learn` (the Placeto policy).
"""

from .core import build_parser, main

__all__ = ["main", "build_parser"]
