"""Every algorithm on one graph and cluster, side by side.

:func:`compare` runs each algorithm through :func:`placer.place`, keeps the
plan or the reason there is none, and measures each plan with the reference
simulator. :meth:`Comparison.write` saves the same table as Markdown, CSV and
JSON, a Gantt chart and a memory chart per plan, every plan file, and one
self-contained HTML report.
"""

from __future__ import annotations

import csv
import io
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..algorithms import available_algorithms, get_algorithm, place
from ..algorithms.registry import checked_options, failure_message
from ..cluster import Cluster
from ..errors import OptionError, PlacerError
from ..graph import OpGraph
from ..io import check_output, json_text, text_writer, write_files_atomic
from ..plan import Plan
from ..show import markdown, one_line
from ..sim import lower_bound, simulate_plan
from ..sim.simulator import SimResult
from ..terminate import raise_if_interrupted, terminate_raises
from ..transform.microbatch import check_microbatches
from .html import html_report
from .tables import figure, print_rows

__all__ = ["Comparison", "Entry", "compare", "check_options"]

COLUMNS = [
    "algorithm",
    "makespan_ms",
    "gap_to_lower_bound",
    "speedup_over_expert",
    "speedup_over_single",
    "max_peak_memory_gib",
    "fits",
    "plan_time_s",
    "note",
]


@dataclass
class Entry:
    """One algorithm's outcome: a plan and its simulation, or the error that stopped it."""

    algorithm: str
    plan: Plan | None = None
    result: SimResult | None = None
    error: str | None = None

    @property
    def makespan_s(self) -> float:
        return self.result.makespan_s if self.result is not None else math.inf


class Comparison:
    """The outcomes of several algorithms on one graph and cluster."""

    def __init__(self, graph: OpGraph, cluster: Cluster, entries: list[Entry]):
        self.graph = graph
        self.cluster = cluster
        self.entries = entries
        self.lower_bound_s = lower_bound(graph, cluster)
        #: The bound for plans that split operations (their critical path is not the graph's).
        self.split_lower_bound_s = lower_bound(graph, cluster, splits=True)

    def bound_for(self, entry: Entry) -> float:
        """The lower bound that holds for ``entry``'s plan: the split bound when it splits or rewrites the graph."""
        return self.split_lower_bound_s if entry.plan is not None and entry.plan.rewrites_graph else self.lower_bound_s

    def entry(self, algorithm: str) -> Entry | None:
        return next((e for e in self.entries if e.algorithm == algorithm), None)

    @property
    def best(self) -> Entry | None:
        """The fastest entry with a plan (ties: the one listed first)."""
        planned = [e for e in self.entries if e.result is not None]
        return min(planned, key=lambda e: e.makespan_s) if planned else None

    def rows(self) -> list[dict]:
        """One dict per algorithm with the columns of :data:`COLUMNS` (None where not applicable)."""
        reference = {
            name: (self.entry(name).makespan_s if self.entry(name) else math.inf) for name in ("expert", "single")
        }
        rows = []
        for e in self.entries:
            if e.result is None:
                rows.append({**{c: None for c in COLUMNS}, "algorithm": e.algorithm, "fits": False, "note": e.error})
                continue
            span = e.makespan_s
            bound = self.bound_for(e)
            rows.append(
                {
                    "algorithm": e.algorithm,
                    "makespan_ms": span * 1e3,
                    "gap_to_lower_bound": _gap(span, bound),
                    "speedup_over_expert": _speedup(reference["expert"], span),
                    "speedup_over_single": _speedup(reference["single"], span),
                    "max_peak_memory_gib": float(e.result.peak_memory_bytes.max()) / 2**30,
                    "fits": e.result.fits,
                    "plan_time_s": e.plan.search_time_s,
                    "note": "splits ops: gap to the split bound" if bound != self.lower_bound_s else "",
                }
            )
        return rows

    # ------------------------------------------------------------ output
    @staticmethod
    def _cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return figure(value, 3)
        return str(value)

    @staticmethod
    def _percent(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    def markdown(self) -> str:
        """The table as Markdown; names as written, none read as HTML or markup (:func:`placer.show.markdown`)."""
        lines = [
            f"# {markdown(self.graph.name)} on {markdown(self.cluster.name)}",
            "",
            f"{self.graph.num_nodes} operations; lower bound {self.lower_bound_s * 1e3:.3f} ms "
            f"({self.split_lower_bound_s * 1e3:.3f} ms for plans that split operations).",
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS),
        ]
        for row in self.rows():  # a cell holds no | and no line break, which would end it or its row
            lines.append(
                "| "
                + " | ".join(markdown(" ".join(self._cell(row[c]).replace("|", "/").split())) for c in COLUMNS)
                + " |"
            )
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(self.rows())
        return out.getvalue()

    def to_dict(self) -> dict:
        peaks = {
            e.algorithm: {d.name: int(p) for d, p in zip(self.cluster.devices, e.result.peak_memory_bytes)}
            for e in self.entries
            if e.result is not None
        }
        return {
            "graph": self.graph.name,
            "cluster": self.cluster.name,
            "nodes": self.graph.num_nodes,
            "lower_bound_s": self.lower_bound_s,
            "split_lower_bound_s": self.split_lower_bound_s,
            "rows": self.rows(),
            "peak_memory_bytes": peaks,
        }

    def print(self, console: Console | None = None) -> None:
        header = [
            "algorithm",
            "makespan\nms",
            "gap to\nLB",
            "speedup\nvs\nexpert",
            "speedup\nvs\nsingle",
            "peak\nGiB",
            "fits",
            "plan\ns",
        ]
        rows, notes = [], []
        for row in self.rows():
            if row["makespan_ms"] is None:
                rows.append([row["algorithm"], "no plan", "-", "-", "-", "-", "-", "-"])
                notes.append(row["note"])
                continue
            rows.append(
                [
                    row["algorithm"],
                    f"{row['makespan_ms']:.5g}",
                    self._percent(row["gap_to_lower_bound"]),
                    self._cell(row["speedup_over_expert"]),
                    self._cell(row["speedup_over_single"]),
                    figure(row["max_peak_memory_gib"], 2),
                    self._cell(row["fits"]),
                    f"{row['plan_time_s']:.2f}",
                ]
            )
        print_rows(
            header,
            rows,
            console=console,
            title=f"{self.graph.name} on {self.cluster.name} (lower bound {self.lower_bound_s * 1e3:.3f} ms; "
            f"{self.split_lower_bound_s * 1e3:.3f} ms for plans that split operations)",
        )
        for note in notes:
            (console or Console()).print(f"no plan: {one_line(note)}", highlight=False, markup=False)

    def write(self, folder: str | os.PathLike) -> dict[str, Path]:
        """Write the table (md, csv, json), plans, charts and ``report.html``; return the paths by role.

        Everything is made before the first file lands in ``folder``: the tables and plans in memory, the
        charts (the slow part) in a temporary folder outside it, removed on any error, Ctrl-C or SIGTERM.
        Then every file is put in place together (:func:`placer.io.write_files_atomic`): a stopped write
        leaves the earlier report whole, and nothing of its own. Plans and charts an earlier report left
        in ``folder`` for algorithms this one did not plan are removed with it.
        """
        from .charts import gantt_chart, memory_chart  # deferred: imports matplotlib

        folder = check_output(folder, "report folder", folder=True)
        paths = {
            "markdown": folder / "comparison.md",
            "csv": folder / "comparison.csv",
            "json": folder / "comparison.json",
            "html": folder / "report.html",
        }
        texts = {paths["markdown"]: self.markdown(), paths["csv"]: self.csv(), paths["json"]: json_text(self.to_dict())}
        planned = [e for e in self.entries if e.result is not None]
        for e in planned:
            texts[folder / f"plan-{e.algorithm}.json"] = json_text(e.plan.to_dict())
        folder.mkdir(parents=True, exist_ok=True)
        with terminate_raises(), tempfile.TemporaryDirectory(prefix="placer-report-") as scratch_name:
            scratch, charts = Path(scratch_name), {}
            for e in planned:
                gantt, memory = scratch / f"gantt-{e.algorithm}.png", scratch / f"memory-{e.algorithm}.png"
                gantt_chart(
                    e.result,
                    gantt,
                    title=f"{e.algorithm}: {self.graph.name} on {self.cluster.name}, "
                    f"makespan {e.makespan_s * 1e3:.3f} ms",
                )
                memory_chart(e.result, memory, title=f"{e.algorithm}: memory per device (dotted: capacity)")
                charts[e.algorithm] = (gantt, memory)
            texts[paths["html"]] = html_report(self, charts)
            outputs = {path: text_writer(text) for path, text in texts.items()}
            outputs.update(
                {folder / chart.name: partial(shutil.copyfile, chart) for pair in charts.values() for chart in pair}
            )
            # An earlier report's plans and charts of algorithms this one did not plan would read as this run's.
            stale = [
                path
                for pattern in ("plan-*.json", "gantt-*.png", "memory-*.png")
                for path in folder.glob(pattern)
                if path not in outputs
            ]
            write_files_atomic(outputs, "report file", remove=stale)
        return paths


def _gap(span: float, bound: float) -> float | None:
    """``span / bound - 1``; at a bound of 0 (operations that take no time), 0 for a span of 0 and None for any
    other (no finite gap: 0 would call a plan slowed by its transfers optimal)."""
    if bound > 0:
        return span / bound - 1
    return 0.0 if span == 0 else None


def _speedup(reference: float, span: float) -> float | None:
    """``reference / span``, or None where there is no reference or the span is 0 (a graph with no compute)."""
    return reference / span if math.isfinite(reference) and span > 0 else None


def check_options(algorithms: Iterable[str] | None, *, seed: int = 0, time_limit: float | None = None) -> list[str]:
    """The names to compare (default: every registered algorithm), each known and taking ``seed`` and
    ``time_limit``; OptionError otherwise, before anything runs."""
    names = list(algorithms) if algorithms is not None else available_algorithms()
    if not names:
        raise OptionError("no algorithm to compare: the list of algorithms is empty")
    for name in names:
        checked_options(get_algorithm(name), {"seed": seed, "time_limit": time_limit})
    return names


def compare(
    graph: OpGraph,
    cluster: Cluster,
    algorithms: Iterable[str] | None = None,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    console: Console | None = None,
    progress: bool = True,
    microbatches: int | None = None,
) -> Comparison:
    """Run each algorithm (default: every registered one) on ``graph`` and ``cluster``.

    Parameters
    ----------
    algorithms : names, optional
    seed : int
        Passed to every algorithm.
    time_limit : float, optional
        Per-algorithm limit in seconds, passed to every algorithm.
    progress : bool
        Show a progress bar on the console.
    microbatches : int, optional
        Every algorithm places the step cut into this many micro-batches
        (:func:`~placer.algorithms.registry.place`); checked against the batch before anything runs.

    Returns
    -------
    Comparison
        An algorithm that finds no plan appears with its error; unknown names,
        no names and a bad seed or time limit raise OptionError before anything runs.
    """
    names = check_options(algorithms, seed=seed, time_limit=time_limit)
    if microbatches is not None:
        check_microbatches(graph, microbatches, "compare")
    entries: list[Entry] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
        transient=True,
    ) as bar:
        task = bar.add_task("placing", total=len(names))
        for name in names:
            bar.update(task, description=f"placing with {name}")
            try:
                plan = place(graph, cluster, name, seed=seed, time_limit=time_limit, microbatches=microbatches)
                entries.append(Entry(name, plan, simulate_plan(plan, graph, cluster)))
            except PlacerError as exc:
                entries.append(Entry(name, error=failure_message(name, exc)))
            except Exception as exc:  # noqa: BLE001  a bug in one algorithm must not lose the others' results
                entries.append(
                    Entry(name, error=f"{name}: internal error (please report): {type(exc).__name__}: {exc}")
                )
            raise_if_interrupted()  # Ctrl-C that a solver or a library caught (into an error or a result)
            bar.advance(task)
    return Comparison(graph, cluster, entries)
