"""Simulator throughput: operations simulated per second on generated training graphs.

Goal (issue 2): a 100k-node step simulated in under 1 s on one core.

    ./run.sh bench bench/simulator.py            # or: python bench/simulator.py [--repeat 3]

Each case places a synthetic training graph (placer.generate.training_graph)
on 4xV100-nvlink with the expert split (so transfers and memory are exercised),
then times placer.simulate, without and with the plan's per-device order; a
"scattered" placement (node i on device i mod 4) adds a transfer on most edges.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from placer import load_cluster, place, simulate
from placer.generate import training_graph

CASES = {"1k": (62, 3), "10k": (715, 3), "100k": (7142, 3)}   # layers, branches -> ~1k, 10k, 100k nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (the best is reported)")
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
        runs = (("expert", device_of, {}), ("expert+order", device_of, {"order": order}),
                ("scattered", scattered, {}))
        for mode, placement, kwargs in runs:
            best, result = float("inf"), None
            for _ in range(args.repeat):
                began = time.perf_counter()
                result = simulate(graph, cluster, placement, check=False, **kwargs)
                best = min(best, time.perf_counter() - began)
            print(f"{label:>5} {graph.num_nodes:>7} {graph.num_edges:>7} {len(result.transfers):>9} {mode:>13} "
                  f"{best:>8.3f} {graph.num_nodes / best:>10.0f}")


if __name__ == "__main__":
    main()
