"""Placeto's shipped policy on held-out graphs: zero-shot and fine-tuned, against the registered baselines.

Run::

    ./run.sh bench bench/placeto.py                      # 8 test graphs per family, fine-tune 2 per family
    ./run.sh bench bench/placeto.py --per-family 16 --fine-tune-per-family 16 --fine-tune-episodes 20

For each graph of the test split of the three families (placer.learn.families,
never seen in training) it places the graph with every registered
comparison algorithm (HEFT and DPOS when registered) and with ``placeto``
zero-shot (one greedy walk of the shipped policy), then fine-tuned
(``fine_tune_episodes`` REINFORCE episodes on that graph, seed 0), and prints
the makespans (reference simulator) and the geometric means of placeto's
makespan over each baseline's, per family and overall. It also prints how
the shipped policy was trained (from the policy file's metadata).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time

import numpy as np

from placer.algorithms import available_algorithms, place
from placer.algorithms.placeto import load_policy
from placer.cluster import load_cluster
from placer.learn.families import FAMILIES, dataset

BASELINES = ("single", "round_robin", "expert", "metis", "heft", "dpos")


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", default="4xV100-nvlink")
    parser.add_argument("--per-family", type=int, default=8, help="test graphs per family (of 16)")
    parser.add_argument("--fine-tune-per-family", type=int, default=2, help="of those, how many to fine-tune on")
    parser.add_argument("--fine-tune-episodes", type=int, default=10)
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args()

    cluster = load_cluster(args.cluster)
    baselines = [b for b in BASELINES if b in available_algorithms()]
    missing = [b for b in BASELINES if b not in baselines]
    policy = load_policy()
    trained = policy.metadata.get("train_config", {})
    curve = policy.metadata.get("curve", {})
    print(f"python {platform.python_version()}, {platform.machine()}; cluster {args.cluster}")
    if curve:
        k = max(1, len(curve["return"]) // 10)
        print(
            f"shipped policy: {trained.get('episodes')} episodes, {len(curve['return'])} updates, "
            f"{trained.get('workers')} worker processes, {curve['seconds'][-1]:.0f} s of training; "
            f"mean episode return {np.mean(curve['return'][:k]):+.3f} (first tenth) -> "
            f"{np.mean(curve['return'][-k:]):+.3f} (last tenth)"
        )
    if missing:
        print(f"not registered on this branch (not compared): {', '.join(missing)}")
    rows = []
    for family in FAMILIES:
        for n, graph in enumerate(dataset(family, "test", count=args.per_family)):
            row = {"graph": graph.name, "family": family, "nodes": graph.num_nodes}
            for name in baselines:
                plan = place(graph, cluster, name)
                row[name] = plan.predicted["makespan_s"]
            began = time.perf_counter()
            plan = place(graph, cluster, "placeto")
            row["placeto"] = plan.predicted["makespan_s"]
            row["placeto_s"] = time.perf_counter() - began
            if n < args.fine_tune_per_family:
                began = time.perf_counter()
                plan = place(graph, cluster, "placeto", fine_tune_episodes=args.fine_tune_episodes, seed=0)
                row["fine_tuned"] = plan.predicted["makespan_s"]
                row["fine_tune_s"] = time.perf_counter() - began
            rows.append(row)
            shown = "  ".join(f"{name} {row[name] * 1e3:8.3f}" for name in baselines)
            tuned = f"  fine-tuned {row['fine_tuned'] * 1e3:8.3f}" if "fine_tuned" in row else ""
            print(
                f"{graph.name:9s} {graph.num_nodes:4d} nodes  {shown}  placeto {row['placeto'] * 1e3:8.3f}{tuned} ms"
                f"  ({row['placeto_s']:.1f} s)",
                flush=True,
            )
    print()
    print("geometric mean of placeto's makespan over each baseline's (< 1: placeto is faster)")
    header = f"{'':20s}" + "".join(f"{name:>12s}" for name in baselines)
    print(header)
    for label, subset in [(f, [r for r in rows if r["family"] == f]) for f in FAMILIES] + [("all", rows)]:
        print(
            f"zero-shot {label:10s}"
            + "".join(f"{geomean([r['placeto'] / r[b] for r in subset]):12.3f}" for b in baselines)
        )
    tuned = [r for r in rows if "fine_tuned" in r]
    if tuned:
        print(f"fine-tuned ({len(tuned)} graphs, {args.fine_tune_episodes} episodes each)")
        print(
            f"{'  zero-shot':20s}"
            + "".join(f"{geomean([r['placeto'] / r[b] for r in tuned]):12.3f}" for b in baselines)
        )
        print(
            f"{'  fine-tuned':20s}"
            + "".join(f"{geomean([r['fine_tuned'] / r[b] for r in tuned]):12.3f}" for b in baselines)
        )
        print(
            f"fine-tuned over zero-shot: {geomean([r['fine_tuned'] / r['placeto'] for r in tuned]):.3f}; "
            f"mean fine-tuning time {np.mean([r['fine_tune_s'] for r in tuned]):.1f} s"
        )
    print(f"mean zero-shot planning time {np.mean([r['placeto_s'] for r in rows]):.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"reproduce: ./run.sh bench bench/placeto.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
