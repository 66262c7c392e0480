"""Every algorithm on every bundled case: the zoo models x the cluster presets.

Goal (issue 4): on every bundled case each algorithm returns a valid plan; where the
model does not fit one device, the memory-aware algorithms find a fitting plan whenever
one of them can.

    ./run.sh bench bench/presets.py [--models vgg19,gnmt] [--clusters 2xcpu,4xGPU-pcie]
                                    [--algorithms m_etf,dpos,m_etf:coplace=true] [--time-limit 10]

Each zoo model is captured once at its paper batch size (Adam, meta device; cached under
--cache, shared with bench/quality.py) and placed on each preset by each algorithm through
:func:`placer.place`, which validates the plan under the reference model (placement,
order, colocation, device kinds, memory). Outcomes are stored in ``--results`` as they
come, so an interrupted run resumes. An algorithm given as ``NAME:KEY=VALUE`` runs
with that option (the value parsed as JSON), stored under that spelling. The searching algorithms (auto, os_dpos, pesto,
placeto) are left out by default: they start from these and bench/quality.py measures them.

Per case it prints every algorithm's simulated step in ms, or ``-`` where it found no
plan that fits (``InfeasibleError``), or ``t`` where it had none when its time limit ran out
(``TimeLimitError``); any other exception is a bug and is printed in full;
then the cases where some algorithm fitted and others did not.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from placer import available_algorithms, load_cluster, place
from placer.capture.zoo import ZOO
from placer.cluster import PRESETS
from placer.errors import InfeasibleError
from placer.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph, reproduce_line  # noqa: E402  (bench/quality.py's zoo capture cache)

SEARCHING = {"auto", "os_dpos", "pesto", "placeto"}
#: How a TimeLimitError's message reads (placer.algorithms.registry.place).
TIME_LIMIT_MESSAGE = "found no plan within its time limit"


def run_one(graph, cluster, spec: str, time_limit: float) -> dict:
    """``spec``: an algorithm's name, or ``NAME:KEY=VALUE`` to run it with that option."""
    name, _, option = spec.partition(":")
    key, _, value = option.partition("=")
    options = {key: json.loads(value)} if option else {}
    began = time.perf_counter()
    try:
        plan = place(graph, cluster, name, seed=0, time_limit=time_limit, **options)
    except InfeasibleError as exc:
        return {"makespan_s": math.inf, "wall_s": time.perf_counter() - began, "error": str(exc)[:300]}
    except Exception:  # noqa: BLE001 - a bug to report, not a result
        return {"makespan_s": math.inf, "wall_s": time.perf_counter() - began, "bug": traceback.format_exc()}
    return {"makespan_s": plan.predicted["makespan_s"], "wall_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--clusters", default=",".join(PRESETS))
    parser.add_argument("--algorithms", help="comma-separated (default: every registered one but the searching ones)")
    parser.add_argument("--time-limit", type=float, default=10.0, help="per-algorithm limit in seconds")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    parser.add_argument(
        "--results",
        default="bench/.cache/presets-results.json",
        help="outcomes so far (reused; delete to start afresh)",
    )
    parser.add_argument(
        "--pair",
        default="sharded_data_parallel,data_parallel",
        help="two algorithms to set side by side over every stored case where both ran",
    )
    args = parser.parse_args()
    names = args.algorithms.split(",") if args.algorithms else [n for n in available_algorithms() if n not in SEARCHING]
    results_path = Path(args.results)
    store = json.loads(results_path.read_text()) if results_path.exists() else {}
    print(f"python {platform.python_version()}, {platform.machine()}; time limit {args.time_limit:g} s per algorithm")
    print(f"{'case':>40} {'1 dev':>5} " + " ".join(f"{n[:9]:>9}" for n in names) + "   wall s")
    partial, bugs, cases, valid, runs, timeouts = [], [], 0, 0, 0, 0
    seen: list[str] = []
    for model in args.models.split(","):
        graph = captured_graph(model, None, Path(args.cache))
        for cluster_name in args.clusters.split(","):
            cluster = load_cluster(cluster_name)
            case = f"{graph.name}/{cluster_name}"
            done = store.setdefault(case, {})
            seen.append(case)
            for name in names:
                if name not in done:
                    done[name] = run_one(graph, cluster, name, args.time_limit)
                    results_path.parent.mkdir(parents=True, exist_ok=True)
                    results_path.write_text(json.dumps(store, indent=1))
            biggest = np.full(graph.num_nodes, int(np.argmax(cluster.memory)))
            one_device = bool(simulate(graph, cluster, biggest, None, check=False).fits)
            span = {n: done[n]["makespan_s"] for n in names}
            fitted = [n for n in names if math.isfinite(span[n])]
            cases += 1
            runs += len(names)
            valid += len(fitted)
            if fitted and len(fitted) < len(names):
                partial.append((case, one_device, [n for n in names if n not in fitted]))
            bugs += [(case, n, done[n]["bug"]) for n in names if "bug" in done[n]]
            timed_out = [n for n in names if TIME_LIMIT_MESSAGE in done[n].get("error", "")]
            timeouts += len(timed_out)
            cells = [
                f"{span[n] * 1e3:9.1f}" if math.isfinite(span[n]) else f"{'t' if n in timed_out else '-':>9}"
                for n in names
            ]
            wall = sum(done[n]["wall_s"] for n in names)
            print(f"{case:>40} {'yes' if one_device else 'no':>5} " + " ".join(cells) + f" {wall:8.1f}", flush=True)
    print(f"\n{valid}/{runs} runs returned a valid, fitting plan on {cases} cases; {timeouts} ran out of time (t)")
    print("cases where some algorithms fitted and others did not (does the step fit one device? who did not):")
    for case, one_device, missing in partial:
        print(f"  {case} (one device: {'yes' if one_device else 'no'}): {', '.join(missing)}")
    print_per_algorithm({case: store[case] for case in seen}, names)
    # Where auto ran on a case (``--algorithms auto``), against everything else measured there.
    judged = {case: rec for case, rec in store.items() if "auto" in rec and len(rec) > 1}
    if judged:
        slower, fits, gains = [], 0, []
        for case, rec in judged.items():
            best, best_name = min((r["makespan_s"], n) for n, r in rec.items() if n != "auto")
            auto = rec["auto"]["makespan_s"]
            fits += math.isfinite(auto) or not math.isfinite(best)
            if math.isfinite(auto) and math.isfinite(best):
                gains.append(best / auto)
            if not auto <= best * (1 + 1e-9):
                slower.append(f"{case} ({auto * 1e3:.1f} ms, {best_name} {best * 1e3:.1f} ms)")
        walls = [rec["auto"]["wall_s"] for rec in judged.values()]
        print(
            f"auto as fast as the best other algorithm stored for the case on {len(judged) - len(slower)}/"
            f"{len(judged)} cases; fits wherever one of them fits on {fits}/{len(judged)}"
        )
        if gains:
            print(
                f"where both have a plan ({len(gains)} cases): the best other's step / auto's, geomean "
                f"{math.exp(np.mean(np.log(gains))):.3f}, largest {max(gains):.3f}; auto strictly faster on "
                f"{sum(g > 1 + 1e-9 for g in gains)}; auto's wall time mean {np.mean(walls):.1f} s, "
                f"largest {max(walls):.1f} s"
            )
        for line in slower:
            print(f"  slower: {line}")
    print_pair(store, *args.pair.split(","))
    for case, name, text in bugs:
        print(f"\nBUG {name} on {case}:\n{text}")
    print(reproduce_line("presets.py", parser, args))


def print_per_algorithm(store: dict, names: list[str]) -> None:
    """Per algorithm over ``store``'s cases: fitting plans, time-outs and the wall time of its runs."""
    print(f"{'algorithm':>22} {'fits':>9} {'time-outs':>9} {'wall s: median':>14} {'largest':>8}")
    for name in names:
        runs = [rec[name] for rec in store.values() if name in rec]
        if not runs:
            continue
        walls = [r["wall_s"] for r in runs]
        fits = sum(math.isfinite(r["makespan_s"]) for r in runs)
        timeouts = sum(TIME_LIMIT_MESSAGE in r.get("error", "") for r in runs)
        print(f"{name:>22} {f'{fits}/{len(runs)}':>9} {timeouts:>9} {np.median(walls):>14.1f} {max(walls):>8.1f}")


def print_pair(store: dict, first: str, second: str) -> None:
    """``first`` against ``second`` on every stored case where both ran."""
    both = {
        case: (rec[first]["makespan_s"], rec[second]["makespan_s"])
        for case, rec in store.items()
        if first in rec and second in rec
    }
    if not both:
        return
    ratios = {case: b / a for case, (a, b) in both.items() if math.isfinite(a) and math.isfinite(b)}
    fastest = sum(
        min(r["makespan_s"] for n, r in store[case].items() if n != "auto") == a and math.isfinite(a)
        for case, (a, _) in both.items()
    )
    print(
        f"{first} against {second} on {len(both)} cases: both fit on {len(ratios)}, {first} faster on "
        f"{sum(x > 1 + 1e-9 for x in ratios.values())}, slower on {sum(x < 1 - 1e-9 for x in ratios.values())}"
    )
    if ratios:
        best, worst = max(ratios, key=ratios.get), min(ratios, key=ratios.get)
        print(
            f"  {second}'s step / {first}'s: geomean {math.exp(np.mean(np.log(list(ratios.values())))):.3f}, "
            f"largest {ratios[best]:.3f} ({best}), smallest {ratios[worst]:.3f} ({worst})"
        )
    for a, b, (x, y) in ((first, second, (0, 1)), (second, first, (1, 0))):
        only = [case for case, spans in both.items() if math.isfinite(spans[x]) and not math.isfinite(spans[y])]
        print(f"  {a} fits where {b} does not: {', '.join(only) or 'none'}")
    print(f"  {first} is the fastest of every algorithm stored (auto aside) on {fastest} cases")


if __name__ == "__main__":
    main()
