"""``placer demo``: the main job on the built-in default, with no GPU and no input.

It builds a training step that does not fit one GPU of the default cluster,
compares every registered algorithm on it, prints the table and writes the
full report (tables, plans, Gantt and memory charts, report.html).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .cluster import load_cluster
from .generate import training_graph
from .report.compare import compare

__all__ = ["run_demo", "DEFAULT_CLUSTER"]

DEFAULT_CLUSTER = "4xV100-nvlink"


def run_demo(output: Path, console: Console | None = None) -> int:
    console = console or Console()
    cluster = load_cluster(DEFAULT_CLUSTER)
    graph = training_graph(layers=24, branches=3, batch=64, param_mib=240, activation_mib=48, seed=0,
                           name="demo-24x3-bs64")
    total = (graph.param_bytes.sum() + graph.output_bytes.sum()) / 2**30
    console.print(f"[bold]{graph.name}[/]: {graph.num_nodes} ops, {total:.1f} GiB of parameters and activations; "
                  f"cluster {cluster.name} ({cluster.num_devices} x {cluster.devices[0].memory_bytes / 2**30:.0f} GiB)")
    comparison = compare(graph, cluster, seed=0, console=console)
    comparison.print(console)
    output.mkdir(parents=True, exist_ok=True)
    graph.save(output / "graph.json")
    paths = comparison.write(output)
    best = comparison.best
    if best is None:
        console.print("no algorithm found a plan that fits")
        return 1
    console.print(f"best: {best.algorithm} ({best.makespan_s * 1e3:.2f} ms); report: {paths['html']}")
    return 0
