"""Time limits: how long each registered algorithm takes when given ``time_limit``.

Goal (issue 10): ``--time-limit`` honoured within 10%, i.e. no algorithm's wall
time (including placer's own validation of the plan) exceeds 1.1 x the limit.

    ./run.sh bench bench/time_limits.py [--model inception_v3 --batch 192 | --nodes 10000]
                                        [--limits 2,10] [--algorithms auto,...]

Each algorithm runs through :func:`placer.place` on a graph that does not fit
one device of 4xV100-nvlink, so memory-aware search has work to do: by
default the demo's, Inception-v3's Adam training step at batch 192 (9,207
captured ops, 18.1 GiB; cached under bench/.cache like bench/quality.py), or
with ``--nodes`` a generated training graph (placer.generate.training_graph)
whose parameters fill 1.5 devices. Algorithms that finish early are within
their limit by definition; the column that matters is ``wall/limit`` for the
searching ones (auto, os_dpos, pesto, placeto).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from placer import available_algorithms, load_cluster, place
from placer.cli.demo import DEFAULT_BATCH
from placer.errors import PlacerError
from placer.generate import training_graph

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph, reproduce_line  # noqa: E402  (bench/quality.py's zoo capture cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="inception_v3", help="zoo model (Adam; the default case)")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="the zoo model's batch size (the demo's)")
    parser.add_argument("--nodes", type=int, help="a generated graph of about this many nodes instead")
    parser.add_argument("--limits", default="2,10", help="comma-separated time limits in seconds")
    parser.add_argument("--algorithms", help="comma-separated names (default: every registered algorithm)")
    parser.add_argument("--cluster", default="4xV100-nvlink")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    if args.nodes:
        layers = max(1, args.nodes // 14)  # training_graph with 3 branches has ~14 nodes per layer
        param_mib = 1.5 * cluster.memory.max() / 2**20 / (3 * layers)
        graph = training_graph(layers=layers, branches=3, seed=0, param_mib=param_mib, activation_mib=param_mib / 5)
    else:
        graph = captured_graph(args.model, args.batch, Path(args.cache))
    names = args.algorithms.split(",") if args.algorithms else available_algorithms()
    limits = [float(x) for x in args.limits.split(",")]
    print(f"graph: {graph.num_nodes} nodes, {graph.num_edges} edges; cluster {cluster.name}")
    print(f"{'algorithm':>14} {'limit_s':>8} {'wall_s':>8} {'wall/limit':>10}  outcome")
    worst = 0.0
    for name in names:
        for limit in limits:
            began = time.perf_counter()
            try:
                plan = place(graph, cluster, name, time_limit=limit)
                outcome = f"makespan {plan.predicted['makespan_s'] * 1e3:.2f} ms"
            except PlacerError as exc:
                outcome = f"no plan: {str(exc)[:60]}"
            wall = time.perf_counter() - began
            worst = max(worst, wall / limit)
            flag = "  OVER" if wall > 1.1 * limit else ""
            print(f"{name:>14} {limit:>8.1f} {wall:>8.2f} {wall / limit:>10.2f}  {outcome}{flag}")
    print(f"worst wall/limit: {worst:.2f} (goal <= 1.10)")
    if args.nodes:  # no model is captured
        args.model = args.batch = None
    print(reproduce_line("time_limits.py", parser, args))


if __name__ == "__main__":
    main()
