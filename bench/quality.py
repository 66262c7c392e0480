"""Plan quality: every algorithm on the zoo models x the cluster presets.

Goal (issue 9): ``auto`` at least as fast as the best other algorithm on every case,
fitting whenever any algorithm fits, with a geomean within 10% of the lower bound.

    ./run.sh bench bench/quality.py [--models vgg19,resnet50,inception_v3] [--time-limit 20]

Each zoo model is captured once at its paper batch size (Adam, meta device; the
graph is cached under --cache) and placed on each cluster by each registered
algorithm through :func:`placer.place` (which checks the plan under the
reference model). Every outcome is stored in ``--results`` as soon as it is
known, so an interrupted run resumes where it stopped and ``--rerun auto``
measures a changed algorithm again without re-running the others (delete the
file after changing any other algorithm).

Per case it prints every algorithm's makespan / lower bound ("-" where it
found no fitting plan); the summary per algorithm gives the geometric means of
makespan / lower bound, of the speed-up over the expert split and over the best
paper algorithm on the same case, the fit rate and the mean wall time (plan
plus placer's check). Plans that split ops (data_parallel, os_dpos, auto when
it picks one of those) run a rewritten graph, which the critical-path term of
the original graph's bound does not cover: they are judged by the bound that
holds for them (total work / devices, ``lower_bound(..., splits=True)``). The
row ``auto_unsplit`` runs auto with a portfolio of the algorithms that only
place (no data_parallel, no os_dpos), and is compared with the best of those.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import time
from pathlib import Path

from placer import OpGraph, available_algorithms, load_cluster, place
from placer.algorithms.auto import default_portfolio
from placer.errors import PlacerError
from placer.sim.bounds import lower_bound

CLUSTERS = ["2xV100-nvlink", "4xV100-nvlink", "8xV100-nvlink", "4xGPU-pcie", "2x4xV100"]
#: The papers' own algorithms: "speed-up over the best paper algorithm" compares against these.
PAPER_ALGORITHMS = [
    "m_topo",
    "m_etf",
    "m_sct",
    "heft",
    "dpos",
    "os_dpos",
    "pesto",
    "order_place",
    "celeritas",
    "placeto",
]
#: Algorithms whose plans split ops (a rewritten graph): left out of ``auto_unsplit``.
SPLITTING = {"data_parallel", "sharded_data_parallel", "os_dpos"}


def _capture_digest() -> str:
    """A fingerprint of placer's capture code and zoo: graphs cached before a change to them are not reused."""
    import placer.capture

    sources = sorted(Path(placer.capture.__file__).parent.rglob("*.py"))
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:10]


def captured_graph(model: str, batch: int | None, cache: Path) -> OpGraph:
    """The zoo model's training step at ``batch`` (default: its paper batch), captured once and cached."""
    from placer.capture import capture_spec
    from placer.capture.zoo import ZOO

    batch = batch or ZOO[model].paper_batch
    path = cache / f"{model}-bs{batch}-{_capture_digest()}.json"  # a change to capture makes a new one
    if path.exists():
        return OpGraph.load(path)
    began = time.perf_counter()
    graph = capture_spec(f"zoo:{model}", batch, optimizer="adam", fake=True).graph
    print(f"captured {model} at batch {batch}: {graph.num_nodes} ops in {time.perf_counter() - began:.1f} s")
    cache.mkdir(parents=True, exist_ok=True)
    graph.save(path)
    return graph


def reproduce_line(script: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The command that measures again what ``args`` asked for: every option given a value (the cache's
    and results' folders only where not the default)."""
    options = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if value in (None, False, "") or not action.option_strings or action.dest == "help":
            continue
        if action.dest not in ("cache", "results") or value != action.default:
            flag = action.option_strings[-1]
            options.append(
                flag if value is True else f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"
            )
    return " ".join([f"reproduce: ./run.sh bench bench/{script}", *options])


def geomean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def run_one(graph: OpGraph, cluster, name: str, time_limit: float) -> dict:
    """One algorithm on one case: its makespan (inf where it found no fitting plan) and wall time."""
    began = time.perf_counter()
    options = {}
    if name == "auto_unsplit":
        name, options = "auto", {"portfolio": ",".join(n for n in default_portfolio(time_limit) if n not in SPLITTING)}
    try:
        plan = place(graph, cluster, name, seed=0, time_limit=time_limit, **options)
    except PlacerError as exc:
        return {"makespan_s": math.inf, "wall_s": time.perf_counter() - began, "error": str(exc)[:200]}
    record = {
        "makespan_s": plan.predicted["makespan_s"],
        "wall_s": time.perf_counter() - began,
        "split": plan.rewritten_graph is not None,
    }
    if "auto" in plan.extra:
        record["auto"] = plan.extra["auto"]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg19,resnet50,inception_v3")
    parser.add_argument("--batch", type=int, help="batch size for every model (default: each one's paper batch)")
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--algorithms", help="comma-separated (default: every registered algorithm)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="per-algorithm limit in seconds")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    parser.add_argument(
        "--results",
        default="bench/.cache/quality-results.json",
        help="outcomes so far (reused; delete to start afresh)",
    )
    parser.add_argument("--rerun", default="", help="comma-separated algorithms to measure again")
    args = parser.parse_args()
    names = args.algorithms.split(",") if args.algorithms else available_algorithms() + ["auto_unsplit"]
    rerun = set(filter(None, args.rerun.split(",")))
    results_path = Path(args.results)
    store = json.loads(results_path.read_text()) if results_path.exists() else {}
    print(f"python {platform.python_version()}, {platform.machine()}; time limit {args.time_limit:g} s per algorithm")
    stats: dict[str, dict[str, list]] = {
        n: {"ratio": [], "vs_expert": [], "vs_paper": [], "fits": [], "time": []} for n in names
    }
    auto_ok, auto_fits_ok, unsplit_ok, cases = 0, 0, 0, 0
    for model in args.models.split(","):
        graph = captured_graph(model, args.batch, Path(args.cache))
        for cluster_name in args.clusters.split(","):
            cluster = load_cluster(cluster_name)
            bound = lower_bound(graph, cluster)
            split_bound = lower_bound(graph, cluster, splits=True)
            case = f"{graph.name}/{cluster_name}/{args.time_limit:g}"
            done = store.setdefault(case, {})
            for name in names:
                if name not in done or name in rerun:
                    done[name] = run_one(graph, cluster, name, args.time_limit)
                    results_path.parent.mkdir(parents=True, exist_ok=True)
                    results_path.write_text(json.dumps(store, indent=1))
            span = {n: done[n]["makespan_s"] for n in names}
            best_paper = min((span[n] for n in PAPER_ALGORITHMS if n in span), default=math.inf)
            best_other = min((s for n, s in span.items() if not n.startswith("auto")), default=math.inf)
            best_unsplit = min(
                (s for n, s in span.items() if not n.startswith("auto") and n not in SPLITTING), default=math.inf
            )
            cases += 1
            if "auto" in span:
                auto_ok += span["auto"] <= best_other * (1 + 1e-9)
                auto_fits_ok += math.isfinite(span["auto"]) or not math.isfinite(best_other)
            if "auto_unsplit" in span:
                unsplit_ok += span["auto_unsplit"] <= best_unsplit * (1 + 1e-9)
            cells = []
            for name in names:
                s, record = stats[name], done[name]
                planned = math.isfinite(span[name])
                s["fits"].append(planned)
                s["time"].append(record["wall_s"])
                ratio = span[name] / (split_bound if record.get("split") else bound)
                if planned:
                    s["ratio"].append(ratio)
                    s["vs_expert"].append(span.get("expert", math.inf) / span[name])
                    s["vs_paper"].append(best_paper / span[name])
                cells.append(f"{name}={ratio:.2f}" if planned else f"{name}=-")
            note = ""
            for name in ("auto", "auto_unsplit"):
                if name in names and "auto" in done[name]:
                    info = done[name]["auto"]
                    note += f" [{name}: from {info['start']}, local search -{info['local_search_gain']:.1%}]"
            print(
                f"{graph.name} on {cluster_name} (lower bound {bound * 1e3:.1f} ms): " + " ".join(cells) + note,
                flush=True,
            )
    print()
    print(
        "| algorithm | geomean makespan / lower bound | speed-up over expert | speed-up over best paper "
        "algorithm | fit rate | mean wall time (s) |"
    )
    print("|---|---|---|---|---|---|")
    for name in names:
        s = stats[name]
        fit = sum(s["fits"]) / len(s["fits"]) if s["fits"] else 0.0
        mean_time = sum(s["time"]) / len(s["time"]) if s["time"] else float("nan")
        print(
            f"| {name} | {geomean(s['ratio']):.3f} | {geomean(s['vs_expert']):.3f} | {geomean(s['vs_paper']):.3f} "
            f"| {fit:.0%} | {mean_time:.1f} |"
        )
    if "auto" in names:
        print(
            f"\nauto as fast as the best other algorithm on {auto_ok}/{cases} cases; "
            f"fits wherever any algorithm fits on {auto_fits_ok}/{cases}"
        )
    if "auto_unsplit" in names:
        print(f"auto_unsplit as fast as the best other algorithm that does not split ops on {unsplit_ok}/{cases} cases")
    print(reproduce_line("quality.py", parser, args))


if __name__ == "__main__":
    main()
