"""Pesto against the expert split, m-SCT (the paper's Baechi) and every other algorithm, on the paper's setups.

Pesto (Hafeez et al., Middleware 2021, Section 5) reports per-step times 15.5% under the expert
split on average: about 18% on RNNLM, 21% on NMT, 8% on Transformer, and 16% under Baechi on
NASNet. This runs the paper's models from placer's zoo at the paper's batches (RNNLM 2x2048 and
4x2048 and NMT/GNMT 2- and 4-layer at 128, Transformer and NASNet at 32) over two clusters:

    ./run.sh bench bench/pesto.py [--time-limit 60] [--long-limit 600] [--cases rnnlm2-nvlink2,...]

Per case it prints the predicted makespan (reference simulator) of the expert split, of m-SCT,
of the best registered algorithm except ``auto`` and pesto (expert and m-SCT included; each
given the same time limit as pesto), of the best of those that keep the graph as it is (no
operation split, no replica: what pesto places), of pesto at ``--time-limit`` (and at ``--long-limit`` when given), and the valid lower
bound pesto reports (on the plans of the graph it searched); then pesto against expert and
against the best other algorithm, the rounds of its search, the graph it searched (the model's
own, or the one its best warm start rewrote), where its plan came from, and whether the wall
clock cut it. The last
lines give the means the goals are stated in: the mean reduction under expert and the geomean
speed-up over the best other algorithm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from placer import OpGraph, load_cluster, place
from placer.algorithms import available_algorithms
from placer.sim.simulator import simulate_plan

sys.path.insert(0, str(Path(__file__).parent))
from quality import _capture_digest  # noqa: E402  (the capture fingerprint bench/quality.py keys its cache by)

#: model label: (zoo spec, batch). The paper's variants where the zoo has the sizes; see ``NOTES``.
MODELS = {
    "rnnlm2": ("zoo:rnnlm", 128),
    "rnnlm4": ("zoo:rnnlm?layers=4", 128),
    "gnmt2": ("zoo:gnmt?layers=2", 128),
    "gnmt4": ("zoo:gnmt", 128),
    "transformer": ("zoo:transformer", 32),
    "nasnet4": ("zoo:nasnet?cells=4&filters=212", 32),
}
CLUSTERS = {"nvlink2": "2xV100-nvlink", "pcie4": "4xGPU-pcie"}
CASES = {f"{m}-{c}": (m, cluster) for m in MODELS for c, cluster in CLUSTERS.items()}
NOTES = (
    "Transformer is the zoo's base model (6+6 layers, d_model 512, 8 heads), not the paper's "
    "10- and 12-layer 1024-unit variants; NASNet is 4 cells of 212 filters (one of the paper's three)."
)
#: Not compared: ``auto`` (a portfolio of the others, pesto included) and pesto itself.
EXCLUDED = ("auto", "pesto")
#: Algorithms that may change the graph (split operations, replicate the model, cut the step into
#: micro-batches): the "best placement" column leaves them out. Pesto searches the graph its best warm
#: start places, which may be one of these rewrites (its "searched" column).
REWRITING = ("os_dpos", "data_parallel", "sharded_data_parallel", "gpipe", "1f1b")


def load_graph(model: str, cache: Path) -> OpGraph:
    """The model's training step (Adam, meta device) at its batch, captured once and cached."""
    from placer.capture import capture_spec

    spec, batch = MODELS[model]
    path = cache / f"pesto-{model}-bs{batch}-{_capture_digest()}.json"
    if path.exists():
        return OpGraph.load(path)
    graph = capture_spec(spec, batch, optimizer="adam", fake=True).graph
    cache.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph


def others(graph: OpGraph, cluster, limit: float, name: str, cache: Path) -> dict[str, float]:
    """Makespan of every registered algorithm but ``EXCLUDED`` (those that fail are left out).

    Kept in ``cache`` per case, limit and source of the algorithms (placer/ but pesto's files), so
    that a change to pesto alone does not run them again.
    """
    path = cache / f"pesto-others-{name}-{limit:g}s-{_others_digest()}.json"
    if path.exists():
        return json.loads(path.read_text())
    spans = {}
    for algorithm in available_algorithms():
        if algorithm in EXCLUDED:
            continue
        try:
            plan = place(graph, cluster, algorithm, time_limit=limit)
        except Exception as exc:  # noqa: BLE001  (an algorithm that cannot place the case shows as missing)
            print(f"  {algorithm} on {name}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
            continue
        if plan.predicted.get("fits", True):
            spans[algorithm] = plan.predicted["makespan_s"]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spans))
    return spans


def _others_digest() -> str:
    """A fingerprint of placer's sources other than pesto's own modules."""
    import placer

    root = Path(placer.__file__).parent
    sources = sorted(p for p in root.rglob("*.py") if not p.name.startswith("pesto"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:10]


def run_pesto(graph: OpGraph, cluster, limit: float, seed: int):
    began = time.perf_counter()
    plan = place(graph, cluster, "pesto", time_limit=limit, seed=seed)
    elapsed = time.perf_counter() - began
    simulated = simulate_plan(plan, graph, cluster).makespan_s
    assert np.isclose(plan.predicted["makespan_s"], simulated, rtol=1e-9, atol=0), "predicted != simulated"
    return plan, elapsed


def _rounds(report: dict) -> str:
    """Rounds of pesto's search, run/planned (improving ones in parentheses for window rounds)."""
    if "window_rounds_planned" in report:
        return f"{report['window_rounds']}/{report['window_rounds_planned']} ({report['window_improved']} better)"
    return f"{report.get('lns_rounds', 0)}/{report.get('lns_rounds_planned', 0)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=float, default=60.0, help="pesto's (and every algorithm's) limit, s")
    parser.add_argument("--long-limit", type=float, default=0.0, help="also run pesto with this limit (0: not)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, {platform.machine()}; time limit {args.time_limit:g} s; "
        f"{time.strftime('%Y-%m-%d')}"
    )
    long_col = f" pesto {args.long_limit:g} s |" if args.long_limit else ""
    print(
        f"| case | ops | expert | m_sct | best other | best placement | pesto {args.time_limit:g} s |{long_col} "
        "lower bound | pesto vs expert | best other / pesto | best placement / pesto | rounds | searched "
        "| returned | wall clock cut |"
    )
    print("|---|---|---|---|---|---|---|" + ("---|" if args.long_limit else "") + "---|---|---|---|---|---|---|---|")
    under_expert, over_best, over_placement = [], [], []
    for name in args.cases.split(","):
        model, cluster_name = CASES[name]
        graph = load_graph(model, Path(args.cache))
        cluster = load_cluster(cluster_name)
        spans = others(graph, cluster, args.time_limit, name, Path(args.cache))
        plan, _ = run_pesto(graph, cluster, args.time_limit, args.seed)
        report = plan.extra["pesto"]
        span = plan.predicted["makespan_s"]
        long_cell = ""
        if args.long_limit:
            long_plan, _ = run_pesto(graph, cluster, args.long_limit, args.seed)
            long_cell = f" {long_plan.predicted['makespan_s'] * 1e3:.1f} |"
        best_name = min(spans, key=spans.get) if spans else None
        placing = {k: v for k, v in spans.items() if k not in REWRITING}
        placement_name = min(placing, key=placing.get) if placing else None

        def cell(key: str | None) -> str:
            return "-" if key is None or key not in spans else f"{spans[key] * 1e3:.1f}"

        if "expert" in spans:
            under_expert.append(1 - span / spans["expert"])
        if best_name is not None:
            over_best.append(spans[best_name] / span)
        if placement_name is not None:
            over_placement.append(spans[placement_name] / span)
        print(
            f"| {name} | {graph.num_nodes} | {cell('expert')} | {cell('m_sct')} | "
            f"{cell(best_name)} ({best_name}) | {cell(placement_name)} ({placement_name}) | "
            f"{span * 1e3:.1f} |{long_cell} {report['lower_bound_s'] * 1e3:.1f} | "
            f"{'-' if 'expert' not in spans else format(1 - span / spans['expert'], '+.1%')} | "
            f"{'-' if best_name is None else f'{spans[best_name] / span:.3f}x'} | "
            f"{'-' if placement_name is None else f'{spans[placement_name] / span:.3f}x'} | "
            f"{_rounds(report)} | "
            f"{report.get('searched_graph', 'original')} | {report['returned']} | "
            f"{'yes: ' + ', '.join(report['wall_clock_cuts']) if report['cut_by_wall_clock'] else 'no'} |",
            flush=True,
        )
    if under_expert:
        print(f"mean reduction under expert: {np.mean(under_expert):.1%} over {len(under_expert)} cases")
    if over_best:
        print(
            f"geomean speed-up over the best other algorithm: {np.exp(np.mean(np.log(over_best))):.3f}x "
            f"over {len(over_best)} cases"
        )
    if over_placement:
        print(
            f"geomean speed-up over the best algorithm that keeps the graph: "
            f"{np.exp(np.mean(np.log(over_placement))):.3f}x over {len(over_placement)} cases"
        )
    print(NOTES)
    long_opt = f" --long-limit {args.long_limit:g}" if args.long_limit else ""
    print(
        f"reproduce: ./run.sh bench bench/pesto.py --time-limit {args.time_limit:g}{long_opt} --seed {args.seed} "
        f"--cases {args.cases}"
    )


if __name__ == "__main__":
    main()
