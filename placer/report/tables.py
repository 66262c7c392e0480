"""Terminal output with rich: tables, and what a long command is doing meanwhile.

Every cell, title and message is shown as plain text with its control characters escaped
(:func:`placer.show.terminal`): a name from a file is neither rich markup nor a terminal escape.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..show import terminal
from ..sim.simulator import SimResult

__all__ = ["figure", "print_rows", "print_simulation", "simulation_text", "working"]


def working(message: str, measuring: bool = False):
    """Say on stderr what a long step is doing while it runs: ``with working(message):``.

    A spinner, which rich draws on a terminal only (on a pipe or in a log
    nothing is written). Where the step times something (``measuring``), one
    line instead: the spinner's drawing thread would take time from it.
    """
    if measuring:
        print(terminal(message), file=sys.stderr)
        return contextlib.nullcontext()
    return Console(stderr=True).status(Text(terminal(message)))


def figure(value: float, decimals: int) -> str:
    """``value`` to ``decimals`` places, or below 1 to three significant figures, so that small values keep
    their differences (a LeNet's peaks in GiB all read 0.00 to two places)."""
    return f"{value:.{decimals}f}" if abs(value) >= 1 or value == 0 else f"{value:#.3g}"


def print_rows(
    header: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None, console: Console | None = None
) -> None:
    """Print a table of strings.

    In a narrow terminal, columns of short cells (figures) keep them whole while
    headers wrap and names in the first column fold.
    """
    rows = [[terminal(cell) for cell in row] for row in rows]
    table = Table(title=None if title is None else Text(terminal(title)))
    for k, h in enumerate(header):
        short = max((len(row[k]) for row in rows), default=0) <= 12
        table.add_column(Text(h), overflow="fold", no_wrap=k > 0 and short)
    for row in rows:
        table.add_row(*map(Text, row))
    (console or Console()).print(table)


def print_simulation(result: SimResult, report: dict, console: Console | None = None) -> None:
    """Per-device load and memory of a simulated plan, then the step's figures."""
    busy = result.busy_s()
    span = result.makespan_s or 1.0
    rows = []
    for j, d in enumerate(result.cluster.devices):
        peak = int(result.peak_memory_bytes[j])
        rows.append(
            [
                d.name,
                d.kind,
                str(int((result.device_of == j).sum())),
                f"{busy[j] * 1e3:.3f}",
                f"{100 * busy[j] / span:.0f}%",
                f"{figure(peak / 2**30, 3)} / {figure(d.memory_bytes / 2**30, 0)} GiB",
                "yes" if peak <= d.memory_bytes else "NO",
            ]
        )
    print_rows(
        ["device", "kind", "ops", "busy ms", "utilisation", "peak memory", "fits"],
        rows,
        title=f"{result.graph.name} on {result.cluster.name}",
        console=console,
    )
    sent = int(result.transfers.nbytes.sum())
    (console or Console()).print(
        f"makespan {report['makespan_s'] * 1e3:.3f} ms; lower bound {report['lower_bound_s'] * 1e3:.3f} ms; "
        f"{len(result.transfers)} transfers, {sent / 2**20:.1f} MiB; fits: {report['fits']}",
        highlight=False,
    )


def simulation_text(result: SimResult, report: dict, width: int = 100) -> str:
    """:func:`print_simulation` as plain text."""

    console = Console(file=io.StringIO(), width=width, color_system=None)
    print_simulation(result, report, console)
    return console.file.getvalue()
