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
   with the links refitted to the transfers the run measured
   (:func:`placer.runtime.feedback.measured_cluster`): what the simulator
   says once it knows the runtime's real costs.

Error = (predicted - measured) / measured. Prints a Markdown table and the
command to reproduce it. With ``--traces DIR``, each run's last measured step
(:func:`placer.runtime.trace.run_trace`) and the simulator's timeline of the
plan with the run's own op times (:func:`placer.sim.trace.chrome_trace`) are
written there side by side, to see where they part, with what the run measured
in full (the profiled graph, the calibrated cluster, the plan, and the run's
step, operation and transfer times and timeline) to test other cost models
against later.

Usage::

    PYTHONPATH=. python bench/fidelity.py [--steps 8] [--models lenet,alexnet,vgg,resnet]
        [--clusters 2xcpu,4xcpu] [--plans expert,metis,round_robin] [--traces DIR]

Run it on a quiet machine with a core per rank: on a loaded one the ranks
wait for CPU time the simulator knows nothing about.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first two are warm-up)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--clusters", default="2xcpu,4xcpu", help="comma-separated cpu presets")
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated registered algorithms")
    parser.add_argument("--traces", help="folder for each run's measured and simulated timelines")
    args = parser.parse_args()

    from placer.algorithms import place
    from placer.capture.spec import capture_spec, load_model
    from placer.cluster import load_cluster
    from placer.cost.calibrate import apply_calibration, calibrate
    from placer.cost.profile import Profile, apply_profile, profile_module
    from placer.io import write_json_atomic
    from placer.runtime.distributed import run_distributed
    from placer.runtime.feedback import measured_cluster, measured_graph
    from placer.runtime.trace import write_run_trace
    from placer.sim import simulate_plan
    from placer.sim.trace import write_trace

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    calibration = calibrate("gloo", ranks=2)
    link = calibration.links["gloo"]
    load = os.getloadavg()[0]
    print(f"gloo link: latency {link.latency_s * 1e6:.1f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
          f"(R^2 {link.r2:.3f}), measured in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPU cores, "
          f"load average {load:.1f}")

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
                measured = statistics.median(result.step_s[2:] or result.step_s)
                fed = measured_graph(graph, plan.bind(graph, cluster), cluster, result.op_s)
                fed_run = simulate_plan(plan, fed, cluster)
                fed_predicted = fed_run.makespan_s
                if args.traces:
                    os.makedirs(args.traces, exist_ok=True)
                    stem = os.path.join(args.traces, f"{name}-{cluster_name}-{algorithm}")
                    write_run_trace(stem + "-measured.json", result.timeline, cluster, step_s=result.step_s[-1],
                                    predicted_s=predicted)
                    write_trace(fed_run, stem + "-simulated.json")
                    # What the run measured, in full, to test other cost models against it later.
                    graph.save(os.path.join(args.traces, f"{name}-graph.json"))
                    cluster.save(os.path.join(args.traces, f"{cluster_name}-cluster.json"))
                    plan.save(stem + "-plan.json")
                    write_json_atomic(stem + "-run.json", {
                        "step_s": result.step_s, "op_s": result.op_s, "transfer_s": result.transfer_s,
                        "timeline": {str(rank): ops for rank, ops in result.timeline.items()}})
                both = simulate_plan(plan, fed, measured_cluster(cluster, result.transfer_s)).makespan_s
                rows.append((name, graph.num_nodes, cluster_name, algorithm, len(set(plan.placement.values())),
                             predicted, measured, fed_predicted, both))
                print(f"{name:8s} {cluster_name:6s} {algorithm:11s}: predicted {predicted * 1e3:8.2f} ms, measured "
                      f"{measured * 1e3:8.2f} ms ({(predicted - measured) / measured:+.1%}); with the run's own op "
                      f"times {fed_predicted * 1e3:8.2f} ms ({(fed_predicted - measured) / measured:+.1%}), and "
                      f"transfer times {both * 1e3:8.2f} ms ({(both - measured) / measured:+.1%})", flush=True)

    print()
    print("| model | nodes | cluster | plan | devices used | predicted (calibrated) | measured | error | "
          "predicted (run's op times) | error | predicted (run's op and transfer times) | error |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, cluster_name, algorithm, used, predicted, measured, fed, both in rows:
        print(f"| {name} | {n} | {cluster_name} | {algorithm} | {used} | {predicted * 1e3:.2f} ms | "
              f"{measured * 1e3:.2f} ms | {(predicted - measured) / measured:+.1%} | {fed * 1e3:.2f} ms | "
              f"{(fed - measured) / measured:+.1%} | {both * 1e3:.2f} ms | {(both - measured) / measured:+.1%} |")
    errors = [[abs(p - row[6]) / row[6] for p in (row[5], row[7], row[8])] for row in rows]
    means = [statistics.mean(e[k] for e in errors) for k in range(3)]
    print(f"\nmean |error| over {len(rows)} runs: {means[0]:.1%} calibrated, {means[1]:.1%} with the run's own op "
          f"times, {means[2]:.1%} with its op and transfer times; load average now {os.getloadavg()[0]:.1f}")
    print(f"reproduce: PYTHONPATH=. python bench/fidelity.py --steps {args.steps} --models {args.models} "
          f"--clusters {args.clusters} --plans {args.plans}" + (f" --traces {args.traces}" if args.traces else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
