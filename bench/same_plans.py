"""Whether a change kept every plan: a hash of each deterministic algorithm's plan on a fixed set of cases.

A refactoring must not move a single node. This records, for zoo models at
small sizes on a few cluster presets, each deterministic algorithm's
placement, per-device orders, splits and simulated step (to the
nanosecond), hashed per case, and compares two such records:

    ./run.sh bench bench/same_plans.py -o before.json            # on the tree before the change
    ./run.sh bench bench/same_plans.py -o after.json --compare before.json

It exits 1 where a plan differs (naming the case), 0 where all are equal.
The algorithms run without a time limit, so their plans do not depend on
the machine's speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

from placer import load_cluster, place
from placer.capture.spec import capture_spec
from placer.capture.zoo import ZOO
from placer.errors import InfeasibleError

#: Models at sizes that plan in seconds, and the batch they are captured at (Adam, meta device).
MODELS = {"lenet": 64, "resnet50": 32, "inception_v3": 16, "rnnlm": 16, "transformer": 8, "gpt2": 8}
CLUSTERS = ("2xcpu", "4xV100-nvlink", "4xGPU-pcie", "2x4xV100")
ALGORITHMS = (
    "single",
    "round_robin",
    "expert",
    "metis",
    "m_topo",
    "m_etf",
    "m_sct",
    "heft",
    "dpos",
    "data_parallel",
    "sharded_data_parallel",
    "data_parallel:collective=direct",
)


def plan_hash(plan) -> str:
    """A hash of what a plan decides: placement, each device's order, splits, and its simulated step."""
    record = {
        "placement": sorted(plan.placement.items()),
        "order": plan.order,
        "splits": plan.splits,
        "makespan_ns": round(plan.predicted.get("makespan_s", 0.0) * 1e9),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run(models: list[str], clusters: list[str], algorithms: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in models:
        spec = f"zoo:{name}?" + "&".join(f"{k}={v}" for k, v in ZOO[name].tiny.items())
        graph = capture_spec(spec, MODELS.get(name, 8), optimizer="adam", fake=True).graph
        for cluster_name in clusters:
            cluster = load_cluster(cluster_name)
            for algorithm in algorithms:
                base, _, option = algorithm.partition(":")
                options = dict([option.split("=", 1)]) if option else {}
                key = f"{name}/{cluster_name}/{algorithm}"
                began = time.perf_counter()
                try:
                    out[key] = plan_hash(place(graph, cluster, base, **options))
                except InfeasibleError:
                    out[key] = "infeasible"
                print(f"{key}: {out[key]} ({time.perf_counter() - began:.1f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="JSON file of case -> plan hash to write")
    parser.add_argument("--compare", help="an earlier record: print the cases whose plan differs, exit 1 if any")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    args = parser.parse_args(argv)
    hashes = run(args.models.split(","), args.clusters.split(","), args.algorithms.split(","))
    with open(args.output, "w") as f:
        json.dump(hashes, f, indent=1, sort_keys=True)
    if not args.compare:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    differ = [key for key in hashes if key in before and before[key] != hashes[key]]
    missing = sorted(set(before) ^ set(hashes))
    for key in differ:
        print(f"differs: {key} ({before[key]} -> {hashes[key]})")
    if missing:
        print(f"in one record only: {', '.join(missing)}")
    print(f"{len(hashes) - len(differ)} of {len(hashes)} plans equal")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
