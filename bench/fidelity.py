"""Does the simulator predict what a placed step takes when it runs?

For each model, plan and CPU preset (``2xcpu``, ``4xcpu``: processes over gloo):

1. calibrate: the gloo link's latency and bandwidth measured by
   :func:`placer.cost.calibrate.calibrate` (ping-pong between two processes);
   every operation's time measured alone, one thread, by
   :func:`placer.cost.profile.profile_module` (median of 5 runs);
2. plan on the calibrated graph and cluster; the reference simulator's
   makespan is the prediction;
3. run the plan with the distributed executor (one process per device,
   one intra-op thread each): the measured step is the median of the steps
   after two warm-ups (barrier to barrier);
4. also predict from the per-operation times the run itself measured (FastT's
   feedback, :func:`placer.runtime.feedback.measured_graph`), and from those
   with the links' latency set to the transfers the run measured
   (:func:`placer.runtime.feedback.measured_cluster`): what the simulator
   says once it knows the runtime's real costs.

Error = (predicted - measured) / measured. Prints a Markdown table and the
command to reproduce it.

With ``--record DIR``, what each run measured is kept there in full (the
profiled graph, the calibrated cluster, the plan, and the run's step,
operation and transfer times and last-step timeline), beside each run's last
measured step as a Chrome trace (:func:`placer.runtime.trace.run_trace`) and
the simulator's timeline of the plan with the run's own op times
(:func:`placer.sim.trace.chrome_trace`), to see where they part.
``--replay DIR_OR_ARCHIVE`` prints the table again from such a record, with
the cost model of the code at hand: how a change to the model would have
predicted runs measured on a quiet machine, without that machine
(``bench/data/fidelity-h200.tar.xz`` holds the runs of docs/benchmarks.md).

Usage::

    PYTHONPATH=. python bench/fidelity.py [--steps 8] [--models lenet,alexnet,vgg,resnet]
        [--clusters 2xcpu,4xcpu] [--plans expert,metis,round_robin] [--record DIR]
    PYTHONPATH=. python bench/fidelity.py --replay bench/data/fidelity-h200.tar.xz

Run it on a quiet machine with a core per rank: on a loaded one the ranks
wait for CPU time the simulator knows nothing about.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time

import torch

# name -> (spec, batch)
MODELS = {
    "lenet": ("zoo:lenet", 64),
    "alexnet": ("zoo:alexnet?image_size=64&width=16&hidden=256&classes=10", 32),
    "vgg": ("zoo:vgg19?image_size=32&width=8&hidden=64&classes=10", 32),
    "resnet": ("zoo:resnet50?depth=14&image_size=32&width=8&classes=10", 32),
}
PLANS = ("expert", "metis", "round_robin")
WARMUP_STEPS = 2


def predictions(graph, plan, cluster, step_s, op_s, transfer_s) -> tuple:
    """``(measured, run's op times, run's op and transfer times, simulated run)`` of one run, in seconds."""
    from placer.runtime.feedback import measured_cluster, measured_graph
    from placer.sim import simulate_plan

    measured = statistics.median(step_s[WARMUP_STEPS:] or step_s)
    fed = measured_graph(graph, plan.bind(graph, cluster), cluster, op_s)
    fed_run = simulate_plan(plan, fed, cluster)
    both = simulate_plan(plan, fed, measured_cluster(cluster, transfer_s)).makespan_s
    return measured, fed_run.makespan_s, both, fed_run


def table_row(name: str, cluster_name: str, algorithm: str, graph, plan, measured: float, fed: float,
              both: float) -> tuple:
    """One run's line of the table: the case, its calibrated prediction, what was measured, the other two."""
    return (name, graph.num_nodes, cluster_name, algorithm, len(set(plan.placement.values())),
            plan.predicted["makespan_s"], measured, fed, both)


def record_run(folder: str, name: str, cluster_name: str, algorithm: str, graph, cluster, plan, result,
               fed_run) -> None:
    """Keep what one run measured under ``folder`` (the layout :func:`replayed_rows` reads)."""
    from placer.io import write_json_atomic
    from placer.runtime.trace import write_run_trace
    from placer.sim.trace import write_trace

    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, f"{name}-{cluster_name}-{algorithm}")
    write_run_trace(stem + "-measured.json", result.timeline, cluster, step_s=result.step_s[-1],
                    predicted_s=plan.predicted["makespan_s"])
    write_trace(fed_run, stem + "-simulated.json")
    graph.save(os.path.join(folder, f"{name}-graph.json"))
    cluster.save(os.path.join(folder, f"{cluster_name}-cluster.json"))
    plan.save(stem + "-plan.json")
    write_json_atomic(stem + "-run.json", {
        "step_s": result.step_s, "op_s": result.op_s, "transfer_s": result.transfer_s,
        "timeline": {str(rank): ops for rank, ops in result.timeline.items()}})


def replayed_rows(source: str) -> list[tuple]:
    """The table's rows from a record (a folder, or a ``.tar.*`` archive of one)."""
    from placer.cluster import load_cluster
    from placer.graph import OpGraph
    from placer.plan import Plan

    with tempfile.TemporaryDirectory() as unpacked:
        if os.path.isfile(source):
            with tarfile.open(source) as archive:
                archive.extractall(unpacked, filter="data")
            found = glob.glob(os.path.join(unpacked, "**", "*-run.json"), recursive=True)
        else:
            found = glob.glob(os.path.join(source, "*-run.json"))
        if not found:
            sys.exit(f"fidelity: no *-run.json under {source}")
        rows = []
        for path in sorted(found):
            folder, stem = os.path.split(path[:-len("-run.json")])
            name, cluster_name, algorithm = stem.split("-", 2)
            graph = OpGraph.load(os.path.join(folder, f"{name}-graph.json"))
            cluster = load_cluster(os.path.join(folder, f"{cluster_name}-cluster.json"))
            plan = Plan.load(os.path.join(folder, f"{stem}-plan.json"))
            with open(path, encoding="utf-8") as f:
                run = json.load(f)
            measured, fed, both, _ = predictions(graph, plan, cluster, run["step_s"], run["op_s"],
                                                 [tuple(x) for x in run["transfer_s"]])
            rows.append(table_row(name, cluster_name, algorithm, graph, plan, measured, fed, both))
    return rows


def print_table(rows: list[tuple]) -> None:
    print("| model | nodes | cluster | plan | devices used | predicted (calibrated) | measured | error | "
          "predicted (run's op times) | error | predicted (run's op and transfer times) | error |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, cluster_name, algorithm, used, predicted, measured, fed, both in rows:
        print(f"| {name} | {n} | {cluster_name} | {algorithm} | {used} | {predicted * 1e3:.2f} ms | "
              f"{measured * 1e3:.2f} ms | {(predicted - measured) / measured:+.1%} | {fed * 1e3:.2f} ms | "
              f"{(fed - measured) / measured:+.1%} | {both * 1e3:.2f} ms | {(both - measured) / measured:+.1%} |")
    print()
    for label, kinds in (("all", None), ("expert and metis", ("expert", "metis")), ("round_robin", ("round_robin",))):
        chosen = [row for row in rows if kinds is None or row[3] in kinds]
        if chosen:
            means = [statistics.mean(abs(row[k] - row[6]) / row[6] for row in chosen) for k in (5, 7, 8)]
            print(f"mean |error| over {len(chosen)} runs ({label}): {means[0]:.1%} calibrated, {means[1]:.1%} "
                  f"with the run's own op times, {means[2]:.1%} with its op and transfer times")


def measure(args: argparse.Namespace) -> list[tuple]:
    from placer.algorithms import place
    from placer.capture.spec import capture_spec, load_model
    from placer.cluster import load_cluster
    from placer.cost.calibrate import apply_calibration, calibrate
    from placer.cost.profile import Profile, apply_profile, profile_module
    from placer.runtime.distributed import run_distributed

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    calibration = calibrate("gloo", ranks=2)
    link = calibration.links["gloo"]
    print(f"gloo link: latency {link.latency_s * 1e6:.1f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
          f"(R^2 {link.r2:.3f}), measured in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPU cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec, batch = MODELS[name]
        captured = capture_spec(spec, batch)
        model, inputs = load_model(spec, batch)
        flat = captured.step_inputs(model, inputs)
        graph = captured.graph
        seconds = profile_module(captured.gm, [t.clone() for t in flat], repeats=5, warmup=1,
                                 node_ids=set(graph.ids))
        graph = apply_profile(graph, Profile(graph.name, graph.digest(), "cpu", seconds))
        for cluster_name in args.clusters.split(","):
            cluster = apply_calibration(load_cluster(cluster_name), calibration)
            for algorithm in args.plans.split(","):
                try:
                    plan = place(graph, cluster, algorithm)
                except ImportError as exc:          # e.g. metis without pymetis installed
                    print(f"{name:8s} {cluster_name:6s} {algorithm:11s}: skipped ({exc})")
                    continue
                predicted = plan.predicted["makespan_s"]
                result = run_distributed(captured.gm, graph, plan, cluster, flat, steps=args.steps,
                                         carrier=captured.carrier, timeout_s=120)
                measured, fed, both, fed_run = predictions(graph, plan, cluster, result.step_s, result.op_s,
                                                           result.transfer_s)
                if args.record:
                    record_run(args.record, name, cluster_name, algorithm, graph, cluster, plan, result, fed_run)
                rows.append(table_row(name, cluster_name, algorithm, graph, plan, measured, fed, both))
                print(f"{name:8s} {cluster_name:6s} {algorithm:11s}: predicted {predicted * 1e3:8.2f} ms, measured "
                      f"{measured * 1e3:8.2f} ms ({(predicted - measured) / measured:+.1%}); with the run's own op "
                      f"times {fed * 1e3:8.2f} ms ({(fed - measured) / measured:+.1%}), and "
                      f"transfer times {both * 1e3:8.2f} ms ({(both - measured) / measured:+.1%})", flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help=f"steps per run (the first {WARMUP_STEPS} are warm-up)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--clusters", default="2xcpu,4xcpu", help="comma-separated cpu presets")
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated registered algorithms")
    parser.add_argument("--record", help="folder to keep what each run measured (and its traces) in")
    parser.add_argument("--replay", help="a --record folder or archive: predict its runs again, run nothing")
    args = parser.parse_args()

    if args.replay:
        print(f"replaying the runs recorded in {args.replay} with this code's cost model")
        print_table(replayed_rows(args.replay))
        print(f"reproduce: PYTHONPATH=. python bench/fidelity.py --replay {args.replay}")
        return 0
    rows = measure(args)
    print()
    print_table(rows)
    print(f"load average now {os.getloadavg()[0]:.1f}")
    print(f"reproduce: PYTHONPATH=. python bench/fidelity.py --steps {args.steps} --models {args.models} "
          f"--clusters {args.clusters} --plans {args.plans}" + (f" --record {args.record}" if args.record else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
