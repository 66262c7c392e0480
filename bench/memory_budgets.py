"""What each memory budget gives a list scheduler: the ground the memory retries' search covers.

For each case, each way of scheduling (the graph's nodes, or its layers
colocated; by rank, or by earliest start for HEFT and DPOS) and each memory
ratio on a grid from the liveness ratio up by factors of 1.15 to 1: the
schedule's simulated step, or whether it overflows (``!``) or found no room for
some node (``-``). No refinement, no time limit: first schedules only. Ends
with each case's fastest fitting schedule, beside the plan ``placer.place``
returns for the scheduler.

    ./run.sh bench bench/memory_budgets.py [--scheduler heft] [--cases resnet50/2xcpu,inception_v3/4xcpu]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from placer import load_cluster, place
from placer.algorithms.common import liveness_ratio
from placer.algorithms.fastt import dpos_schedule
from placer.algorithms.heft import heft_schedule
from placer.errors import InfeasibleError
from placer.sim import simulate
from placer.transform.colocate import colocate_layers

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph  # noqa: E402  (the zoo capture cache of bench/quality.py)

SCHEDULERS = {"heft": heft_schedule, "dpos": dpos_schedule}
CASES = ",".join(
    f"{m}/{c}"
    for m in ("vgg19", "resnet50", "resnet101", "resnet152", "resnet200", "inception_v3")
    for c in ("2xcpu", "4xcpu")
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheduler", choices=sorted(SCHEDULERS), default="heft")
    parser.add_argument("--cases", default=CASES, help="MODEL/CLUSTER,... (zoo models at their paper batch)")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    schedule = SCHEDULERS[args.scheduler]
    print(
        f"{args.scheduler}: simulated step of the first schedule in ms per memory ratio "
        f"('!' overflows, '-' no room for some node)"
    )
    for case in args.cases.split(","):
        model, cluster_name = case.split("/")
        graph = captured_graph(model, None, Path(args.cache))
        cluster = load_cluster(cluster_name)
        low = liveness_ratio(graph, cluster)
        ratios = [r for r in low * 1.15 ** np.arange(12) if r < 1.0] + [1.0]
        began = time.perf_counter()
        best: tuple[float, str] = (math.inf, "none")
        print(
            f"\n{graph.name}/{cluster_name}: liveness ratio {low:.3f}; ratios " + " ".join(f"{r:.2f}" for r in ratios)
        )
        for stage_name, stage in (("nodes", graph), ("layers", colocate_layers(graph))):
            if stage is None:
                continue
            for order in ("rank", "earliest start"):
                cells = []
                for ratio in ratios:
                    try:
                        sched = schedule(stage, cluster, float(ratio), earliest_first=order != "rank")
                    except InfeasibleError:
                        cells.append("-")
                        continue
                    result = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
                    cells.append(f"{result.makespan_s * 1e3:.1f}{'' if result.fits else '!'}")
                    if result.fits and result.makespan_s < best[0]:
                        best = (result.makespan_s, f"{stage_name}, by {order}, ratio {ratio:.2f}")
                print(f"  {stage_name:6s} by {order:14s} " + " ".join(f"{c:>8s}" for c in cells))
        try:
            plan = f"{place(graph, cluster, args.scheduler).predicted['makespan_s'] * 1e3:.1f} ms"
        except InfeasibleError:
            plan = "none"
        print(
            f"  fastest fitting: {best[0] * 1e3:.1f} ms ({best[1]}); placer.place's plan: {plan}; "
            f"{time.perf_counter() - began:.1f} s",
            flush=True,
        )
    print(f"\nreproduce: ./run.sh bench bench/memory_budgets.py --scheduler {args.scheduler} --cases {args.cases}")


if __name__ == "__main__":
    main()
