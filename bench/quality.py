"""Plan quality: every algorithm on the zoo models x the cluster presets.

Goal (issue 9): ``auto`` at least as fast as the best other algorithm on every case,
fitting whenever any algorithm fits, with a geomean within 10% of the lower bound.

    ./run.sh bench bench/quality.py [--models inception_v3,vgg19,resnet50] [--time-limit 20]

Each zoo model is captured once at its paper batch size (Adam, meta device; the
graph is cached under --cache) and placed on each cluster by each registered
algorithm through :func:`placer.compare`. Per case it prints every algorithm's
makespan / lower bound; the summary per algorithm gives the geometric means of
makespan / lower bound, of the speed-up over the expert split and over the
best paper algorithm on the same case, the fit rate and the mean plan time.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

from placer import OpGraph, available_algorithms, load_cluster
from placer.report.compare import compare

CLUSTERS = ["2xV100-nvlink", "4xV100-nvlink", "8xV100-nvlink", "4xGPU-pcie", "2x4xV100"]
#: The papers' own algorithms: "speed-up over the best paper algorithm" compares against these.
PAPER_ALGORITHMS = ["m_topo", "m_etf", "m_sct", "heft", "dpos", "os_dpos", "pesto", "order_place", "celeritas",
                    "placeto"]


def captured_graph(model: str, batch: int | None, cache: Path) -> OpGraph:
    """The zoo model's training step at ``batch`` (default: its paper batch), captured once and cached."""
    from placer.capture import capture_spec
    from placer.capture.zoo import ZOO

    batch = batch or ZOO[model].paper_batch
    path = cache / f"{model}-bs{batch}.json"
    if path.exists():
        return OpGraph.load(path)
    began = time.perf_counter()
    graph = capture_spec(f"zoo:{model}", batch, optimizer="adam", fake=True).graph
    print(f"captured {model} at batch {batch}: {graph.num_nodes} ops in {time.perf_counter() - began:.1f} s")
    cache.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph


def geomean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="inception_v3,vgg19,resnet50")
    parser.add_argument("--batch", type=int, help="batch size for every model (default: each one's paper batch)")
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--algorithms", help="comma-separated (default: every registered algorithm)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="per-algorithm limit in seconds")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    names = args.algorithms.split(",") if args.algorithms else available_algorithms()
    print(f"python {platform.python_version()}, {platform.machine()}; time limit {args.time_limit:g} s per algorithm")
    stats: dict[str, dict[str, list]] = {n: {"ratio": [], "vs_expert": [], "vs_paper": [], "fits": [], "time": []}
                                         for n in names}
    auto_ok, cases = 0, 0
    for model in args.models.split(","):
        graph = captured_graph(model, args.batch, Path(args.cache))
        for cluster_name in args.clusters.split(","):
            cluster = load_cluster(cluster_name)
            comparison = compare(graph, cluster, names, seed=0, time_limit=args.time_limit, progress=False)
            bound = comparison.lower_bound_s
            span = {e.algorithm: e.makespan_s for e in comparison.entries}
            best_paper = min((span[n] for n in PAPER_ALGORITHMS if n in span), default=math.inf)
            best_other = min((s for n, s in span.items() if n != "auto"), default=math.inf)
            cases += 1
            if "auto" in span:
                auto_ok += span["auto"] <= best_other * (1 + 1e-9)
            cells = []
            for entry in comparison.entries:
                s = stats[entry.algorithm]
                planned = entry.result is not None
                s["fits"].append(planned)
                if planned:
                    s["ratio"].append(entry.makespan_s / bound)
                    s["vs_expert"].append(span.get("expert", math.inf) / entry.makespan_s)
                    s["vs_paper"].append(best_paper / entry.makespan_s)
                    s["time"].append(entry.plan.search_time_s or 0.0)
                cells.append(f"{entry.algorithm}={entry.makespan_s / bound:.2f}" if planned else f"{entry.algorithm}=-")
            print(f"{graph.name} on {cluster_name} (lower bound {bound * 1e3:.1f} ms): " + " ".join(cells))
    print()
    print("| algorithm | geomean makespan / lower bound | speed-up over expert | speed-up over best paper "
          "algorithm | fit rate | mean plan time (s) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        s = stats[name]
        fit = sum(s["fits"]) / len(s["fits"]) if s["fits"] else 0.0
        mean_time = sum(s["time"]) / len(s["time"]) if s["time"] else float("nan")
        print(f"| {name} | {geomean(s['ratio']):.3f} | {geomean(s['vs_expert']):.3f} | {geomean(s['vs_paper']):.3f} "
              f"| {fit:.0%} | {mean_time:.2f} |")
    if "auto" in names:
        print(f"\nauto as fast as the best other algorithm on {auto_ok}/{cases} cases")
    print(f"reproduce: ./run.sh bench bench/quality.py --models {args.models} --clusters {args.clusters} "
          f"--time-limit {args.time_limit:g}")


if __name__ == "__main__":
    main()
