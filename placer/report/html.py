"""One self-contained HTML report of a comparison: tables and charts inline, no network needed."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING

from .tables import figure

if TYPE_CHECKING:
    from .compare import Comparison

__all__ = ["html_report"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.best { background: #e8f5e9; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #a00; text-align: left; }
"""


def _png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def html_report(comparison: "Comparison", charts: dict[str, tuple[Path, Path]]) -> str:
    """The report as an HTML string; ``charts`` maps algorithm -> (Gantt PNG, memory PNG)."""
    c = comparison
    best = c.best
    esc = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>placer: {esc(c.graph.name)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{esc(c.graph.name)} on {esc(c.cluster.name)}</h1>",
        f"<p>{c.graph.num_nodes} operations, {c.graph.num_edges} edges; {c.cluster.num_devices} devices. "
        f"Lower bound {c.lower_bound_s * 1e3:.3f} ms ({c.split_lower_bound_s * 1e3:.3f} ms for plans that split "
        f"operations, whose gap is to that bound). Every figure is the reference simulator's.</p>",
        "<table><tr><th>algorithm</th><th>makespan ms</th><th>gap to lower bound</th><th>speedup over expert</th>"
        "<th>speedup over single</th><th>max peak GiB</th><th>fits</th><th>plan time s</th></tr>",
    ]
    for row in c.rows():
        if row["makespan_ms"] is None:
            parts.append(
                f"<tr><td>{esc(row['algorithm'])}</td><td class='note' colspan='7'>no plan: "
                f"{esc(row['note'] or '')}</td></tr>"
            )
            continue
        cls = " class='best'" if best is not None and row["algorithm"] == best.algorithm else ""
        cell = c._cell
        parts.append(
            f"<tr{cls}><td>{esc(row['algorithm'])}</td><td>{row['makespan_ms']:.3f}</td>"
            f"<td>{c._percent(row['gap_to_lower_bound'])}</td><td>{cell(row['speedup_over_expert'])}</td>"
            f"<td>{cell(row['speedup_over_single'])}</td><td>{figure(row['max_peak_memory_gib'], 2)}</td>"
            f"<td>{cell(row['fits'])}</td><td>{row['plan_time_s']:.2f}</td></tr>"
        )
    parts.append("</table>")
    parts.append(
        "<h2>Peak memory per device (GiB)</h2><table><tr><th>algorithm</th>"
        + "".join(f"<th>{esc(d.name)}</th>" for d in c.cluster.devices)
        + "</tr>"
    )
    for e in c.entries:
        if e.result is not None:
            parts.append(
                f"<tr><td>{esc(e.algorithm)}</td>"
                + "".join(f"<td>{figure(p / 2**30, 2)}</td>" for p in e.result.peak_memory_bytes)
                + "</tr>"
            )
    parts.append(
        "<tr><td>capacity</td>"
        + "".join(f"<td>{figure(d.memory_bytes / 2**30, 2)}</td>" for d in c.cluster.devices)
        + "</tr></table>"
    )
    for e in c.entries:
        if e.algorithm in charts:
            gantt, memory = charts[e.algorithm]
            parts.append(f"<h2 id='{esc(e.algorithm)}'>{esc(e.algorithm)}: {e.makespan_s * 1e3:.3f} ms</h2>")
            parts.append(f"<img alt='timeline of {esc(e.algorithm)}' src='{_png(gantt)}'>")
            parts.append(f"<img alt='memory of {esc(e.algorithm)}' src='{_png(memory)}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
