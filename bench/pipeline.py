"""Micro-batches and pipelines, simulated: what cutting the step into micro-batches buys on zoo models.

For each model, batch and cluster preset, the simulated step (the reference
model, ms) of

- the best op-level plan without micro-batches (the fastest of ``--op-level``,
  list schedulers that place every operation of one step),
- data parallelism (a replica per device, where one fits): on NCCL's ring, and
  with the optimizer sharded on the faster collective (as ``auto`` runs it),
- ``gpipe`` and ``1f1b`` with ``--microbatches`` micro-batches, and the same in
  ``--groups`` replica groups (data parallelism over pipelines: ``replicas`` of
  :func:`placer.algorithms.pipeline.pipeline_plan`; 1 leaves them out),
- the best op-level scheduler placing the micro-batched step
  (``place(..., microbatches=M)``, every algorithm pipelining by itself),
- ``auto`` within ``--time-limit`` seconds, which runs the pipelines in its
  portfolio and searches their micro-batch count where micro-batches can win
  (``--no-auto`` leaves it out),

and, per case, whether the whole step fits one device (its one-device peak
against the device's memory). After the table, the goal's figures: where a
data-parallel replica does not fit one device, ``auto``'s step against the
best plan without micro-batches (geometric mean), and the cases where it is
slower than ``gpipe`` or ``1f1b``. ``-`` marks an algorithm that found no plan
that fits, with its reason in the JSON record. Graphs are captured once on
the meta device (Adam) and cached under ``--cache``, as
``bench/quality.py`` does.

    ./run.sh bench bench/pipeline.py [--models gpt2,resnet152] [--clusters 4xV100-nvlink] [--time-limit 120]
        [--groups 2] [-o results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

from placer import load_cluster, place
from placer.errors import InfeasibleError, OptionError, TimeLimitError
from placer.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph  # noqa: E402  (the zoo capture cache of bench/quality.py)

#: Batches per model: the zoo's paper batch (GPT-2's 512 at context 1024 holds an attention operation of
#: 98 GiB, more than any device: batch 8 instead), and four times it, where a replica outgrows a V100.
BATCHES = {
    "gpt2": (8, 32),
    "bert_large": (16, 64),
    "gnmt": (128, 512),
    "resnet152": (32, 128),
    "inception_v3": (64, 256),
}
CLUSTERS = ("4xV100-nvlink", "2x4xV100")
OP_LEVEL = ("heft", "m_etf")
#: The sharded optimizer's data parallelism on the faster collective, as auto runs it: a plan without micro-batches.
SHARDED = "sharded_data_parallel:best"


def _plan(graph, cluster, algorithm: str, **options) -> tuple[float | None, str, float]:
    """The plan's simulated step (s) or None, what it was (or why none), and the seconds it took."""
    began = time.perf_counter()
    try:
        plan = place(graph, cluster, algorithm, **options)
    except (InfeasibleError, OptionError, TimeLimitError) as exc:
        return None, str(exc).splitlines()[0][:200], time.perf_counter() - began
    what = algorithm
    if "auto" in plan.extra:  # the member it started from, a pipeline with its micro-batch count
        what = plan.extra["auto"]["start"]
    if "stages" in plan.extra:
        what += f" ({len(plan.extra['stages'])} stages)"
    return plan.predicted["makespan_s"], what, time.perf_counter() - began


def run_case(
    model: str,
    batch: int,
    cluster_name: str,
    microbatches: int,
    cache: Path,
    max_microbatched_nodes: int,
    time_limit: float | None = None,
    groups: int = 1,
) -> dict:
    graph = captured_graph(model, batch, cache)
    cluster = load_cluster(cluster_name)
    solo = simulate(graph, cluster, np.zeros(graph.num_nodes, dtype=np.int64), check=False)
    record: dict = {
        "model": model,
        "batch": batch,
        "cluster": cluster_name,
        "nodes": graph.num_nodes,
        "one_device_peak_gib": float(solo.peak_memory_bytes[0]) / 2**30,
        "fits_one_device": bool(solo.fits),
        "plans": {},
    }
    best = None
    for name in OP_LEVEL:
        step, what, seconds = _plan(graph, cluster, name)
        record["plans"][name] = {"step_s": step, "what": what, "seconds": seconds}
        if step is not None and (best is None or step < best[0]):
            best = (step, name)
    record["best_op_level"] = None if best is None else {"step_s": best[0], "algorithm": best[1]}
    for name in ("data_parallel",):
        step, what, seconds = _plan(graph, cluster, name)
        record["plans"][name] = {"step_s": step, "what": what, "seconds": seconds}
    step, what, seconds = _plan(graph, cluster, "sharded_data_parallel", collective="best")  # as auto runs it
    record["plans"][SHARDED] = {"step_s": step, "what": what, "seconds": seconds}
    for name in ("gpipe", "1f1b"):
        step, what, seconds = _plan(graph, cluster, name, microbatches=microbatches)
        record["plans"][name] = {"step_s": step, "what": what, "seconds": seconds}
        if groups > 1:
            step, what, seconds = _plan(graph, cluster, name, microbatches=microbatches, replicas=groups)
            record["plans"][f"{name}x{groups}"] = {"step_s": step, "what": what, "seconds": seconds}
    if graph.num_nodes * microbatches <= max_microbatched_nodes:
        step, what, seconds = _plan(graph, cluster, OP_LEVEL[0], microbatches=microbatches)
    else:
        step, what, seconds = None, f"skipped: {graph.num_nodes * microbatches} nodes micro-batched", 0.0
    record["plans"][f"{OP_LEVEL[0]}+mb"] = {"step_s": step, "what": what, "seconds": seconds}
    if time_limit is not None:
        step, what, seconds = _plan(graph, cluster, "auto", time_limit=time_limit)
        record["plans"]["auto"] = {"step_s": step, "what": what, "seconds": seconds}
    return record


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def _without(record: dict) -> float | None:
    """The best plan's step without micro-batches: the op-level schedulers' and data parallelism's (both)."""
    best, p = record["best_op_level"], record["plans"]
    replicas = [p[name]["step_s"] for name in ("data_parallel", SHARDED) if name in p]
    steps = [x for x in ([best["step_s"]] if best else []) + replicas if x is not None]
    return min(steps, default=None)


def _grouped(records: list[dict]) -> list[str]:
    """The replica-group plans the records hold (``1f1bx2``, ...)."""
    return sorted({k for r in records for k in r["plans"] if k.startswith(("gpipex", "1f1bx"))})


def table(records: list[dict], microbatches: int) -> str:
    with_auto = any("auto" in r["plans"] for r in records)
    grouped = _grouped(records)
    sharded = any(SHARDED in r["plans"] for r in records)
    head = (
        "| model | batch | cluster | fits one device | best op-level, no micro-batches | data parallel | "
        + ("sharded data parallel, best collective | " if sharded else "")
        + f"gpipe (M={microbatches}) | 1f1b (M={microbatches}) | {OP_LEVEL[0]}, M={microbatches} | "
        "best with micro-batches: vs best op-level | vs best without (data parallel too) |"
    )
    rule = "|---|---:|---|---|---:|---:|" + ("---:|" if sharded else "") + "---:|---:|---:|---:|---:|"
    for name in grouped:
        schedule, groups = name.split("x")
        head += f" {schedule} in {groups} groups (M={microbatches}) |"
        rule += "---:|"
    if with_auto:
        head += " auto | auto vs best without | auto's plan |"
        rule += "---:|---:|---|"
    lines = [head, rule]
    for r in records:
        p = r["plans"]
        best = r["best_op_level"]
        with_mb = [p[k]["step_s"] for k in ("gpipe", "1f1b", f"{OP_LEVEL[0]}+mb") if p[k]["step_s"] is not None]
        without = _without(r)
        ratio = f"{without / min(with_mb):.2f}x" if with_mb and without else "-"
        op_ratio = f"{best['step_s'] / min(with_mb):.2f}x" if with_mb and best else "-"
        best_cell = "-" if best is None else f"{best['step_s'] * 1e3:.0f} ({best['algorithm']})"
        peak = f"{'yes' if r['fits_one_device'] else 'no'} ({r['one_device_peak_gib']:.1f} GiB)"
        line = (
            f"| {r['model']} | {r['batch']} | {r['cluster']} | {peak} | {best_cell} | "
            f"{_ms(p['data_parallel']['step_s'])} | "
            + (f"{_ms(p.get(SHARDED, {}).get('step_s'))} | " if sharded else "")
            + f"{_ms(p['gpipe']['step_s'])} | {_ms(p['1f1b']['step_s'])} "
            f"| {_ms(p[OP_LEVEL[0] + '+mb']['step_s'])} | {op_ratio} | {ratio} |"
        )
        line += "".join(f" {_ms(p.get(name, {}).get('step_s'))} |" for name in grouped)
        if with_auto:
            auto = p.get("auto", {}).get("step_s")
            vs = f"{without / auto:.2f}x" if auto and without else "-"
            what = p.get("auto", {}).get("what", "") if auto else ""
            line += f" {_ms(auto)} | {vs} | {what} |"
        lines.append(line)
    return "\n".join(lines)


def goal(records: list[dict]) -> str:
    """The goal's figures for ``auto``: against the best plan without micro-batches where a replica does not fit
    one device (geometric mean; a case with no plan without micro-batches is counted apart), and against the
    pipelines everywhere."""
    cases = [r for r in records if "auto" in r["plans"]]
    if not cases:
        return "auto not run"
    out = []
    for title, chosen in (
        (
            "a data-parallel replica does not fit one device",
            [r for r in cases if all(r["plans"].get(k, {}).get("step_s") is None for k in ("data_parallel", SHARDED))],
        ),
        ("the whole step does not fit one device", [r for r in cases if not r["fits_one_device"]]),
        ("every case", cases),
    ):
        ratios, only = [], 0
        for r in chosen:
            auto, without = r["plans"]["auto"]["step_s"], _without(r)
            if auto is not None and without is not None:
                ratios.append(without / auto)
            elif auto is not None:
                only += 1
        mean = f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x" if ratios else "-"
        out.append(
            f"{title}: {len(chosen)} cases; auto vs best plan without micro-batches, geomean {mean} over "
            f"{len(ratios)}; {only} where only auto's micro-batched plan fits"
        )
    slower = [
        f"{r['model']} bs{r['batch']} {r['cluster']} ({name} {_ms(r['plans'][name]['step_s'])} < auto {_ms(r['plans']['auto']['step_s'])})"
        for r in cases
        for name in ("gpipe", "1f1b")
        if r["plans"][name]["step_s"] is not None
        and (
            r["plans"]["auto"]["step_s"] is None
            or r["plans"]["auto"]["step_s"] > r["plans"][name]["step_s"] * (1 + 1e-9)
        )
    ]
    out.append(f"auto slower than gpipe or 1f1b: {len(slower)} cases" + (": " + "; ".join(slower) if slower else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BATCHES))
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--sizes", default="paper,large", help="which batches: paper, large, or both")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--groups", type=int, default=2, help="replica groups of the grouped pipelines (1: none)")
    parser.add_argument(
        "--max-microbatched-nodes",
        type=int,
        default=120_000,
        help="skip the op-level scheduler on micro-batched steps larger than this",
    )
    parser.add_argument("--time-limit", type=float, default=120.0, help="auto's time limit in seconds (default 120)")
    parser.add_argument("--no-auto", action="store_true", help="leave auto out")
    parser.add_argument("--cache", type=Path, default=Path(__file__).parent / ".cache")
    parser.add_argument("-o", "--output", type=Path, help="JSON file of the records (rewritten after each case)")
    parser.add_argument(
        "--table",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="print the table of earlier runs' records (-o files) instead of running",
    )
    args = parser.parse_args(argv)
    if args.table:
        docs = [json.loads(path.read_text()) for path in args.table]
        records = [r for doc in docs for r in doc["records"]]
        print(table(records, docs[0]["microbatches"]))
        print()
        print(goal(records))
        return 0
    sizes = args.sizes.split(",")
    records = []
    began = time.perf_counter()
    for model in args.models.split(","):
        for size in sizes:
            batch = BATCHES[model][("paper", "large").index(size)]
            for cluster in args.clusters.split(","):
                t = time.perf_counter()
                record = run_case(
                    model,
                    batch,
                    cluster,
                    args.microbatches,
                    args.cache,
                    args.max_microbatched_nodes,
                    None if args.no_auto else args.time_limit,
                    args.groups,
                )
                records.append(record)
                summary = ", ".join(f"{k} {_ms(v['step_s'])}" for k, v in record["plans"].items())
                print(f"{model} bs{batch} {cluster}: {summary} ({time.perf_counter() - t:.0f} s)", flush=True)
                if args.output:
                    args.output.write_text(
                        json.dumps(
                            {
                                "records": records,
                                "microbatches": args.microbatches,
                                "auto_time_limit_s": None if args.no_auto else args.time_limit,
                                "date": date.today().isoformat(),
                                "python": platform.python_version(),
                            },
                            indent=1,
                        )
                    )
    print()
    print(table(records, args.microbatches))
    print()
    print(goal(records))
    print(f"\n{len(records)} cases in {time.perf_counter() - began:.0f} s, {date.today().isoformat()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
