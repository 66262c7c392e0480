"""``placer demo``: the main job on the built-in default, with no GPU and no input.

It captures one training step of a zoo model that does not fit one GPU of
the default cluster (Inception-v3 at batch 192 with Adam: about 18 GiB
against 16 GiB V100s), compares every registered algorithm on it, prints the
table and writes the full report (tables, plans, Gantt and memory charts,
report.html) with the captured graph beside it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from .cluster import load_cluster
from .io import check_output
from .report.compare import check_options, compare

__all__ = ["run_demo", "DEFAULT_MODEL", "DEFAULT_BATCH", "DEFAULT_CLUSTER", "DEFAULT_TIME_LIMIT"]

DEFAULT_MODEL = "zoo:inception_v3"
DEFAULT_BATCH = 192
DEFAULT_CLUSTER = "4xV100-nvlink"
#: Per-algorithm search limit, so that the whole demo stays within a few minutes on 2 cores.
DEFAULT_TIME_LIMIT = 20.0


def run_demo(output: Path, *, model: str = DEFAULT_MODEL, batch: int = DEFAULT_BATCH,
             cluster: str = DEFAULT_CLUSTER, algorithms: list[str] | None = None,
             time_limit: float = DEFAULT_TIME_LIMIT, console: Console | None = None) -> int:
    """Capture ``model`` at ``batch``, compare ``algorithms`` on ``cluster``, write the report to ``output``.

    Returns the exit status: 0 when some algorithm found a plan that fits.
    """
    from .capture import capture_spec

    console = console or Console()
    check_options(algorithms, seed=0, time_limit=time_limit)     # before the capture, as the output folder
    check_output(output, "report folder", folder=True)
    target = load_cluster(cluster)
    began = time.perf_counter()
    with console.status(f"capturing one training step of {model} at batch {batch} (Adam) ..."):
        graph = capture_spec(model, batch, optimizer="adam", fake=True).graph
    total = (graph.param_bytes.sum() + graph.output_bytes.sum()) / 2**30
    console.print(f"[bold]{graph.name}[/]: {graph.num_nodes} ops captured in {time.perf_counter() - began:.1f} s, "
                  f"{total:.1f} GiB of training state and activations; cluster {target.name} "
                  f"({target.num_devices} x {target.devices[0].memory_bytes / 2**30:.0f} GiB)")
    comparison = compare(graph, target, algorithms, seed=0, time_limit=time_limit, console=console)
    comparison.print(console)
    paths = comparison.write(output)        # the report first: a failure there leaves no lone graph.json
    graph.save(output / "graph.json")
    best = comparison.best
    if best is None:
        console.print("no algorithm found a plan that fits")
        return 1
    console.print(f"best: {best.algorithm} ({best.makespan_s * 1e3:.2f} ms); report: {paths['html']}")
    return 0
