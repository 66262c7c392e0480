"""Simulator throughput: operations simulated per second on generated training graphs.

Goal (issue 2): a 100k-node step simulated in under 1 s on one core.

    ./run.sh bench bench/simulator.py            # or: python bench/simulator.py [--repeat 3]

Each case places a synthetic training graph (placer.generate.training_graph)
on 4xV100-nvlink with the expert split (so transfers and memory are exercised),
then times placer.simulate, without and with the plan's per-device order; a
"scattered" placement (node i on device i mod 4) adds a transfer on most edges.
Then a graph the size auto meets on the bundled cases (unless ``--no-zoo``):
the zoo's NASNet step (batch 32, Adam) as sharded data parallelism builds it
over 8xH100-nvswitch (234k nodes), simulated after capturing and placing it,
as ``auto`` and ``placer.place``'s check do, with the heap those leave.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from placer import load_cluster, place, simulate
from placer.generate import training_graph

CASES = {"1k": (62, 3), "10k": (715, 3), "100k": (7142, 3)}  # layers, branches -> ~1k, 10k, 100k nodes
ROW = "{:>5} {:>7} {:>7} {:>9} {:>13} {:>8.3f} {:>10.0f}"


def best_of(repeat: int, graph, cluster, placement, **kwargs):
    """The fastest of ``repeat`` simulations, in seconds, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        began = time.perf_counter()
        result = simulate(graph, cluster, placement, check=False, **kwargs)
        best = min(best, time.perf_counter() - began)
    return best, result


def zoo_case(repeat: int, cache: Path) -> None:
    """NASNet's step as sharded data parallelism builds it over 8 H100s, with and without the plan's order."""
    sys.path.insert(0, str(Path(__file__).parent))
    from quality import captured_graph  # the zoo capture cache of bench/quality.py

    cluster = load_cluster("8xH100-nvswitch")
    graph = captured_graph("nasnet", 32, cache)
    plan = place(graph, cluster, "sharded_data_parallel")
    bound = plan.bind(graph, cluster)
    for mode, kwargs in (("sharded DP", {}), ("+order", {"order": bound.order})):
        best, result = best_of(repeat, bound.graph, cluster, bound.device_of, **kwargs)
        print(
            ROW.format(
                "nasnet",
                bound.graph.num_nodes,
                bound.graph.num_edges,
                len(result.transfers),
                mode,
                best,
                bound.graph.num_nodes / best,
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (the best is reported)")
    parser.add_argument("--no-zoo", action="store_true", help="only the generated graphs")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs (bench/quality.py's)")
    args = parser.parse_args()
    cluster = load_cluster("4xV100-nvlink")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}; best of {args.repeat}")
    print(f"{'case':>5} {'nodes':>7} {'edges':>7} {'transfers':>9} {'placement':>13} {'seconds':>8} {'ops/s':>10}")
    for label, (layers, branches) in CASES.items():
        graph = training_graph(layers=layers, branches=branches, seed=0, param_mib=1, activation_mib=1)
        plan = place(graph, cluster, "expert")
        device_of = np.array([cluster.device_index[plan.placement[i]] for i in graph.ids])
        order = [np.array([graph.index[i] for i in plan.order[d.name]]) for d in cluster.devices]
        scattered = np.arange(graph.num_nodes) % cluster.num_devices
        runs = (("expert", device_of, {}), ("expert+order", device_of, {"order": order}), ("scattered", scattered, {}))
        for mode, placement, kwargs in runs:
            best, result = best_of(args.repeat, graph, cluster, placement, **kwargs)
            print(
                ROW.format(
                    label, graph.num_nodes, graph.num_edges, len(result.transfers), mode, best, graph.num_nodes / best
                )
            )
    if not args.no_zoo:
        zoo_case(args.repeat, Path(args.cache))
    print(f"reproduce: ./run.sh bench bench/simulator.py --repeat {args.repeat}" + (" --no-zoo" if args.no_zoo else ""))


if __name__ == "__main__":
    main()
