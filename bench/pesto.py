"""Pesto (CP-SAT on the coarsened graph) against the list schedulers, on bundled cases of 1k-8k operations.

Goal (issue 5): within a 60 s limit, a valid plan never slower than its warm start, with
the gap it proves, and a predicted makespan equal to the reference simulation.

    ./run.sh bench bench/pesto.py [--time-limit 60] [--cases synthetic-pcie,vgg19-nvlink4,...]

Cases are generated training graphs (placer.generate.training_graph) and zoo models
captured at their paper batch size (Adam, meta device; cached under --cache, shared with
bench/quality.py). Per case it prints the makespan of DPOS, m-ETF and HEFT, pesto's
makespan, its wall time, the coarse graph's size, the solver's proven gap on its coarse
model, the gap to the best valid lower bound, what it returned (the solver's plan or the
warm start) and whether the plan's predicted makespan equals a fresh reference simulation.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from placer import load_cluster, place
from placer.generate import training_graph
from placer.sim.simulator import simulate_plan

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph  # noqa: E402  (the zoo capture cache of bench/quality.py)

BASELINES = ("dpos", "m_etf", "heft")
CASES = {
    # name: (graph source, cluster)
    "synthetic-pcie": ("synthetic:100x3", "4xGPU-pcie"),
    "synthetic-nvlink": ("synthetic:200x2", "2xV100-nvlink"),
    "synthetic-2hosts": ("synthetic:60x4", "2x4xV100"),
    "vgg19-nvlink4": ("zoo:vgg19", "4xV100-nvlink"),
    "vgg19-pcie": ("zoo:vgg19", "4xGPU-pcie"),
    "resnet50-nvlink2": ("zoo:resnet50", "2xV100-nvlink"),
    "resnet50-pcie": ("zoo:resnet50", "4xGPU-pcie"),
    "inception_v3-nvlink4": ("zoo:inception_v3", "4xV100-nvlink"),
}


def load_graph(source: str, cache: Path):
    kind, spec = source.split(":")
    if kind == "synthetic":
        layers, branches = map(int, spec.split("x"))
        return training_graph(layers=layers, branches=branches, seed=0)
    return captured_graph(spec, None, cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=float, default=60.0, help="pesto's limit in seconds")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}; pesto time limit {args.time_limit:g} s")
    print("| case | ops | cluster | " + " | ".join(f"{b} (ms)" for b in BASELINES) +
          " | pesto (ms) | vs best list scheduler | time (s) | coarse nodes | solver gap | gap to bound | returned "
          "| predicted = simulated |")
    print("|---|---|---|" + "---|" * len(BASELINES) + "---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        source, cluster_name = CASES[name]
        graph = load_graph(source, Path(args.cache))
        cluster = load_cluster(cluster_name)
        spans = {}
        for b in BASELINES:
            try:
                spans[b] = place(graph, cluster, b).predicted["makespan_s"]
            except Exception as exc:  # a baseline that cannot place the case shows as "-"
                print(f"  {b} on {name}: {exc}", file=sys.stderr)
        began = time.perf_counter()
        plan = place(graph, cluster, "pesto", time_limit=args.time_limit)
        elapsed = time.perf_counter() - began
        report = plan.extra["pesto"]
        span = plan.predicted["makespan_s"]
        simulated = simulate_plan(plan, graph, cluster).makespan_s
        same = bool(np.isclose(span, simulated, rtol=1e-9, atol=0))
        best = min(spans.values(), default=float("nan"))
        cells = " | ".join(f"{spans[b] * 1e3:.2f}" if b in spans else "-" for b in BASELINES)
        solver_gap = report.get("solver_gap")
        print(f"| {name} | {graph.num_nodes} | {cluster_name} | {cells} | {span * 1e3:.2f} | {best / span:.3f}x "
              f"| {elapsed:.1f} | {report['coarse_nodes']} | "
              f"{'-' if solver_gap is None else f'{solver_gap:.1%}'} | {report['gap']:.1%} | "
              f"{report['returned']} ({report['warm_start']}) | {'yes' if same else 'NO'} |", flush=True)
    print(f"reproduce: ./run.sh bench bench/pesto.py --time-limit {args.time_limit:g} --cases {args.cases}")


if __name__ == "__main__":
    main()
