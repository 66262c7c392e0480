"""List scheduling: plan time against graph size, and FastT's comparisons on zoo models.

Goal (issue 4): DPOS and m-ETF plan a 30k-node graph in under 10 s.

    ./run.sh bench bench/scaling.py                  # both parts
    python bench/scaling.py --part sizes             # plan time at 1k / 10k / 30k / 100k nodes
                            [--algorithms dpos,data_parallel,dpos:refine=false]
                            [--sizes 30k --repeat 5]  # one size, the fastest and slowest of 5 runs
    python bench/scaling.py --part zoo               # OS-DPOS vs DPOS and data parallelism
                            [--zoo-clusters 4xGPU-pcie,2x4xV100]

``sizes`` times ``placer.place`` (the algorithm, then the plan's validation
by the reference simulator) for every list-scheduling algorithm on generated
training graphs (``placer.generate.training_graph``, 3 parallel branches per
block, small tensors so that every size fits) on ``4xV100-nvlink``; an
algorithm that takes longer than ``--budget`` seconds at one size is not run
at the larger ones. ``name:option=value`` runs an algorithm with an option
(``heft:refine=false``: HEFT's one pass, without the refinement). A call on a
tiny graph first takes the process's one-time imports (scipy's solvers, which
``placer.place`` loads outside any time limit) off the clock.

``zoo`` captures convolutional zoo models (``placer.capture``, SGD), costs
them with the analytic roofline (``placer.cost.analytic.annotate``), and
compares on one V100 and each of ``--zoo-clusters`` (2 and 4 V100s with NVLink by
default) with the global batch fixed (strong scaling):
one device, DPOS, data parallelism, OS-DPOS (from the data-parallel graph,
as the paper) and OS-DPOS started from the model's own graph.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time

import numpy as np

from placer import load_cluster, place
from placer.cluster import Cluster
from placer.errors import InfeasibleError
from placer.generate import training_graph

SIZES = {"1k": 67, "10k": 667, "30k": 2000, "100k": 6667}  # blocks of 3 branches: 15 nodes each
ALGORITHMS = ["m_topo", "m_etf", "m_sct", "heft", "dpos", "data_parallel", "sharded_data_parallel", "os_dpos"]
ZOO = [("vgg19", 64), ("resnet50", 32), ("inception_v3", 32)]


def sizes(budget: float, algorithms: list[str], labels: list[str], repeat: int) -> None:
    cluster = load_cluster("4xV100-nvlink")
    print(f"plan time (placer.place: algorithm + validation), {cluster.name}; load average {os.getloadavg()[0]:.1f}")
    width = 17 if repeat == 1 else 22
    print(f"{'nodes':>7} {'edges':>7} " + " ".join(f"{name[:width]:>{width}}" for name in algorithms))
    slow: set[str] = set()

    def generated(label: str):
        return training_graph(layers=SIZES[label], branches=3, seed=0, param_mib=0.2, activation_mib=0.2)

    # A process's first place() imports scipy's graphs and solvers (about a second here): setup, not plan time.
    place(training_graph(layers=1), cluster, "single")

    for label in labels:
        graph = generated(label)
        unused = [graph]  # the first run takes it; every other builds its own
        cells = []
        for spec in algorithms:
            if spec in slow:
                cells.append("skipped")
                continue
            name, options = _algorithm(spec)
            # os_dpos searches for splits until its time limit; the graphs here have none to split.
            if name in ("m_sct", "os_dpos"):
                options["time_limit"] = budget
            cpu_s, wall_s = [], []
            try:
                for _ in range(repeat):
                    # A graph of its own each run: schedulers keep tables per graph, which a user's one call builds.
                    fresh = unused.pop() if unused else generated(label)
                    began, cpu = time.perf_counter(), time.process_time()
                    plan = place(fresh, cluster, name, **options)
                    cpu_s.append(time.process_time() - cpu)
                    wall_s.append(time.perf_counter() - began)
                spread = f"-{max(wall_s):.1f}" if repeat > 1 else ""
                cell = f"{min(cpu_s):.1f}/{min(wall_s):.1f}{spread} ({plan.predicted['makespan_s'] * 1e3:.0f}ms)"
            except InfeasibleError:
                cell, wall_s = "infeasible", [time.perf_counter() - began]
            if min(wall_s) > budget:
                slow.add(spec)
            cells.append(cell)
        print(f"{graph.num_nodes:>7} {graph.num_edges:>7} " + " ".join(f"{c:>{width}}" for c in cells), flush=True)
    print(
        "cells: CPU seconds / wall seconds to plan"
        + (f", the fastest of {repeat} runs - the slowest" if repeat > 1 else "")
        + " (the plan's simulated step time); 'skipped': over the budget at a smaller size"
    )


def _algorithm(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:option=value`` -> (name, options); true/false and numbers are parsed."""
    name, _, option = spec.partition(":")
    if not option:
        return name, {}
    key, _, text = option.partition("=")
    value = {"true": True, "false": False}.get(text.lower())
    return name, {key: value if value is not None else float(text)}


def zoo(time_limit: float, clusters: list[str]) -> None:
    from placer.capture import capture_spec
    from placer.cost.analytic import annotate

    two = load_cluster("2xV100-nvlink")
    one_v100 = Cluster("1xV100", two.devices[:1], [])
    rows = [
        ("single", {}),
        ("dpos", {}),
        ("data_parallel", {}),
        ("os_dpos", {"time_limit": time_limit}),
        ("os_dpos", {"time_limit": time_limit, "data_parallel_start": False}),
    ]
    labels = ["single", "dpos", "data_parallel", "os_dpos", "os_dpos(own)"]
    print("simulated step time in ms (splits made by OS-DPOS); global batch fixed (strong scaling)")
    print(
        f"{'model':>22} {'cluster':>14} "
        + " ".join(f"{label:>14}" for label in labels)
        + f" {'os_dpos vs dpos':>16} {'vs data_par.':>13}"
    )
    for model, batch in ZOO:
        graph = annotate(capture_spec(f"zoo:{model}", batch, optimizer="sgd", fake=True).graph)
        for cluster in [one_v100] + [load_cluster(name) for name in clusters]:
            cells, spans = [], {}
            for label, (name, options) in zip(labels, rows):
                try:
                    plan = place(graph, cluster, name, **options)
                except InfeasibleError:
                    cells.append("infeasible")
                    continue
                spans[label] = plan.predicted["makespan_s"]
                extra = f"({len(plan.splits)})" if name == "os_dpos" else ""
                cells.append(f"{spans[label] * 1e3:.1f}{extra}")

            def gain(other):
                return (
                    f"{(1 - spans['os_dpos'] / spans[other]) * 100:+.1f}%"
                    if "os_dpos" in spans and other in spans
                    else "-"
                )

            print(
                f"{graph.name:>22} {cluster.name:>14} "
                + " ".join(f"{c:>14}" for c in cells)
                + f" {gain('dpos'):>16} {gain('data_parallel'):>13}",
                flush=True,
            )
    print("gain columns: how much faster OS-DPOS's step is than DPOS's and than data parallelism's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("sizes", "zoo", "all"), default="all")
    parser.add_argument(
        "--budget",
        type=float,
        default=120.0,
        help="seconds an algorithm may take at one size before larger sizes are skipped",
    )
    parser.add_argument("--time-limit", type=float, default=20.0, help="OS-DPOS's search time on the zoo models")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated, for the sizes part")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each cell of the sizes part: the fastest is shown, and the slowest beside it",
    )
    parser.add_argument(
        "--zoo-clusters",
        default="2xV100-nvlink,4xV100-nvlink",
        help="comma-separated presets or cluster files, for the zoo part (one V100 is always first)",
    )
    args = parser.parse_args()
    labels = args.sizes.split(",")
    unknown = [label for label in labels if label not in SIZES]
    if unknown or args.repeat < 1:
        parser.error(
            f"--sizes must name some of {', '.join(SIZES)}, got {', '.join(unknown)}"
            if unknown
            else f"--repeat must be at least 1, got {args.repeat}"
        )
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    if args.part in ("sizes", "all"):
        sizes(args.budget, args.algorithms.split(","), labels, args.repeat)
    if args.part in ("zoo", "all"):
        zoo(args.time_limit, args.zoo_clusters.split(","))
    print(f"reproduce: ./run.sh bench bench/scaling.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
