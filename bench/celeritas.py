"""Celeritas: fusion (the paper's Table 2 columns) and plan time, against Order-Place and the expert split.

    ./run.sh bench bench/celeritas.py              # or: python bench/celeritas.py [--sizes 1k,10k,30k,100k]

For each graph: nodes and CCR before and after Optimal Operation Fusion
(R = 200, M = 0.25 of a device's memory; CCR = summed transfer time over
summed compute, Equation 1, on the cluster's mean link), the fusion time,
then the wall time of a whole ``place()`` call (fusion, placement, the
reference-model checks) and the simulated step time of the plan, for
``celeritas``, ``order_place`` and ``expert`` on 4xV100-nvlink.

Graphs: synthetic training steps (placer.generate.training_graph, 3 parallel
branches per block) whose parameters (about 24 GiB in all) and activations
(about 6 GiB) do not fit one 16 GiB V100, at about 1k, 10k, 30k and 100k
operations; and every model of the zoo (placer.capture.zoo) that captures
here, when that package is present.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from placer import load_cluster, place
from placer.errors import PlacerError
from placer.generate import training_graph
from placer.graph import OpGraph
from placer.transform.fusion import fuse

SIZES = {"1k": 71, "10k": 715, "30k": 2143, "100k": 7142}   # blocks of 3 branches -> ~1k .. ~100k nodes
ALGORITHMS = ("celeritas", "order_place", "expert")


def generated(blocks: int) -> OpGraph:
    """A training step with ~24 GiB of parameters and ~6 GiB of activations over ``blocks`` blocks."""
    branch_ops = 3 * blocks
    return training_graph(layers=blocks, branches=3, seed=0, param_mib=24 * 1024 / branch_ops,
                          activation_mib=6 * 1024 / branch_ops, name=f"synthetic-{blocks}x3")


def zoo_graphs() -> list[OpGraph]:
    """The zoo's models captured at their paper batch size, where the capture package exists."""
    try:
        from placer.capture import capture_spec
        from placer.capture.zoo import ZOO
    except ImportError:
        return []
    graphs = []
    for name, entry in ZOO.items():
        try:
            graphs.append(capture_spec(f"zoo:{name}", entry.paper_batch, fake=True).graph)
        except Exception as exc:  # a model that does not capture here is reported, not fatal
            print(f"zoo:{name}: not captured ({exc})")
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(SIZES), help="generated sizes to run, from " + ",".join(SIZES))
    parser.add_argument("--no-zoo", action="store_true", help="skip the zoo models")
    args = parser.parse_args()
    cluster = load_cluster("4xV100-nvlink")
    graphs = [generated(SIZES[s]) for s in args.sizes.split(",") if s]
    if not args.no_zoo:
        graphs += zoo_graphs()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}; cluster {cluster.name}")
    print(f"{'graph':>22} {'nodes':>7} {'CCR':>7} {'fused':>6} {'CCR':>6} {'fuse s':>7} | "
          + " | ".join(f"{a:>11} s  step s" for a in ALGORITHMS))
    for graph in graphs:
        began = time.perf_counter()
        fused = fuse(graph, cluster)
        fuse_s = time.perf_counter() - began
        cells = []
        for algorithm in ALGORITHMS:
            began = time.perf_counter()
            try:
                plan = place(graph, cluster, algorithm)
                step = f"{plan.predicted['makespan_s']:8.4f}"
            except PlacerError as exc:
                step = f"{'failed':>8}"
                print(f"  {algorithm} on {graph.name}: {exc}")
            cells.append(f"{time.perf_counter() - began:13.2f} {step}")
        print(f"{graph.name:>22} {graph.num_nodes:>7} {fused.ccr_before:>7.3f} {fused.num_clusters:>6} "
              f"{fused.ccr_after:>6.3f} {fuse_s:>7.2f} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
