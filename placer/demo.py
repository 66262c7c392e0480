"""``placer demo``: the main job on the built-in default, with no GPU and no input.

It builds a training step that does not fit one GPU of the default cluster,
places it with every registered algorithm, prints the comparison and writes
each plan and the best plan's timeline.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from .algorithms import available_algorithms, place
from .cluster import load_cluster
from .errors import PlacerError
from .generate import training_graph
from .report.tables import print_rows
from .sim import lower_bound, simulate_plan
from .sim.trace import write_trace

__all__ = ["run_demo", "DEFAULT_CLUSTER"]

DEFAULT_CLUSTER = "4xV100-nvlink"


def run_demo(output: Path, console: Console | None = None) -> int:
    console = console or Console()
    cluster = load_cluster(DEFAULT_CLUSTER)
    graph = training_graph(layers=24, branches=3, batch=64, param_mib=240, activation_mib=48, seed=0,
                           name="demo-24x3-bs64")
    output.mkdir(parents=True, exist_ok=True)
    graph.save(output / "graph.json")
    total = (graph.param_bytes.sum() + graph.output_bytes.sum()) / 2**30
    console.print(f"[bold]{graph.name}[/]: {graph.num_nodes} ops, {total:.1f} GiB of parameters and activations; "
                  f"cluster {cluster.name} ({cluster.num_devices} x {cluster.devices[0].memory_bytes / 2**30:.0f} GiB)")
    bound = lower_bound(graph, cluster)
    rows, best = [], None
    for name in available_algorithms():
        try:
            plan = place(graph, cluster, name, seed=0)
        except PlacerError as exc:
            rows.append([name, "-", "-", "-", f"no plan: {exc}"])
            continue
        plan.save(output / f"plan-{name}.json")
        span = plan.predicted["makespan_s"]
        peak = max(plan.predicted["peak_memory_bytes"].values()) / 2**30
        rows.append([name, f"{span * 1e3:.2f}", f"{span / bound:.2f}", f"{peak:.2f}", f"{plan.search_time_s:.2f} s"])
        if best is None or span < best[1].predicted["makespan_s"]:
            best = (name, plan)
    print_rows(["algorithm", "makespan ms", "/ lower bound", "max peak GiB", "plan time"], rows,
               title=f"{graph.name} on {cluster.name} (lower bound {bound * 1e3:.2f} ms)", console=console)
    if best is None:
        console.print("no algorithm found a plan that fits")
        return 1
    trace = output / f"trace-{best[0]}.json"
    write_trace(simulate_plan(best[1], graph, cluster), trace)
    console.print(f"best: {best[0]}; plans and graph in {output}/, timeline of the best in {trace} "
                  f"(open in ui.perfetto.dev)")
    return 0
