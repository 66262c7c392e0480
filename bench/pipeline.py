"""Micro-batches and pipelines, simulated: what cutting the step into micro-batches buys on zoo models.

For each model, batch and cluster preset, the simulated step (the reference
model, ms) of

- the best op-level plan without micro-batches (the fastest of ``--op-level``,
  list schedulers that place every operation of one step),
- data parallelism (a replica per device, where one fits),
- ``gpipe`` and ``1f1b`` with ``--microbatches`` micro-batches,
- the best op-level scheduler placing the micro-batched step
  (``place(..., microbatches=M)``, every algorithm pipelining by itself),

and, per case, whether the whole step fits one device (its one-device peak
against the device's memory). ``-`` marks an algorithm that found no plan
that fits, with its reason in the JSON record. Graphs are captured once on
the meta device (Adam) and cached under ``--cache``, as
``bench/quality.py`` does.

    ./run.sh bench bench/pipeline.py [--models gpt2,resnet152] [--clusters 4xV100-nvlink] [-o results.json]
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
from placer.errors import InfeasibleError, OptionError
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


def _plan(graph, cluster, algorithm: str, **options) -> tuple[float | None, str, float]:
    """The plan's simulated step (s) or None, what it was (or why none), and the seconds it took."""
    began = time.perf_counter()
    try:
        plan = place(graph, cluster, algorithm, **options)
    except (InfeasibleError, OptionError) as exc:
        return None, str(exc).splitlines()[0][:200], time.perf_counter() - began
    what = algorithm
    if "stages" in plan.extra:
        what += f" ({len(plan.extra['stages'])} stages)"
    return plan.predicted["makespan_s"], what, time.perf_counter() - began


def run_case(
    model: str, batch: int, cluster_name: str, microbatches: int, cache: Path, max_microbatched_nodes: int
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
    for name in ("gpipe", "1f1b"):
        step, what, seconds = _plan(graph, cluster, name, microbatches=microbatches)
        record["plans"][name] = {"step_s": step, "what": what, "seconds": seconds}
    if graph.num_nodes * microbatches <= max_microbatched_nodes:
        step, what, seconds = _plan(graph, cluster, OP_LEVEL[0], microbatches=microbatches)
    else:
        step, what, seconds = None, f"skipped: {graph.num_nodes * microbatches} nodes micro-batched", 0.0
    record["plans"][f"{OP_LEVEL[0]}+mb"] = {"step_s": step, "what": what, "seconds": seconds}
    return record


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f}"


def table(records: list[dict], microbatches: int) -> str:
    head = (
        "| model | batch | cluster | fits one device | best op-level, no micro-batches | data parallel | "
        f"gpipe (M={microbatches}) | 1f1b (M={microbatches}) | {OP_LEVEL[0]}, M={microbatches} | "
        "best with micro-batches: vs best op-level | vs best without (data parallel too) |"
    )
    lines = [head, "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        p = r["plans"]
        best = r["best_op_level"]
        with_mb = [p[k]["step_s"] for k in ("gpipe", "1f1b", f"{OP_LEVEL[0]}+mb") if p[k]["step_s"] is not None]
        without = [x for x in ([best["step_s"]] if best else []) + [p["data_parallel"]["step_s"]] if x is not None]
        ratio = f"{min(without) / min(with_mb):.2f}x" if with_mb and without else "-"
        op_ratio = f"{best['step_s'] / min(with_mb):.2f}x" if with_mb and best else "-"
        best_cell = "-" if best is None else f"{best['step_s'] * 1e3:.0f} ({best['algorithm']})"
        peak = f"{'yes' if r['fits_one_device'] else 'no'} ({r['one_device_peak_gib']:.1f} GiB)"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['cluster']} | {peak} | {best_cell} | "
            f"{_ms(p['data_parallel']['step_s'])} | {_ms(p['gpipe']['step_s'])} | {_ms(p['1f1b']['step_s'])} "
            f"| {_ms(p[OP_LEVEL[0] + '+mb']['step_s'])} | {op_ratio} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(BATCHES))
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--sizes", default="paper,large", help="which batches: paper, large, or both")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument(
        "--max-microbatched-nodes",
        type=int,
        default=120_000,
        help="skip the op-level scheduler on micro-batched steps larger than this",
    )
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
        print(table([r for doc in docs for r in doc["records"]], docs[0]["microbatches"]))
        return 0
    sizes = args.sizes.split(",")
    records = []
    began = time.perf_counter()
    for model in args.models.split(","):
        for size in sizes:
            batch = BATCHES[model][("paper", "large").index(size)]
            for cluster in args.clusters.split(","):
                t = time.perf_counter()
                record = run_case(model, batch, cluster, args.microbatches, args.cache, args.max_microbatched_nodes)
                records.append(record)
                summary = ", ".join(f"{k} {_ms(v['step_s'])}" for k, v in record["plans"].items())
                print(f"{model} bs{batch} {cluster}: {summary} ({time.perf_counter() - t:.0f} s)", flush=True)
                if args.output:
                    args.output.write_text(
                        json.dumps(
                            {
                                "records": records,
                                "microbatches": args.microbatches,
                                "date": date.today().isoformat(),
                                "python": platform.python_version(),
                            },
                            indent=1,
                        )
                    )
    print()
    print(table(records, args.microbatches))
    print(f"\n{len(records)} cases in {time.perf_counter() - began:.0f} s, {date.today().isoformat()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
