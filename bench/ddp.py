"""Placer's replicated plans against the engine PyTorch users pick instead: DDP and ZeRO.

For each model and CPU preset (``2xcpu``, ``4xcpu``: one gloo process per
rank, one intra-op thread each), with the same model, global batch, ranks,
optimizer and 25 MiB gradient buckets on every side:

1. ``eager``: one process, no parallelism: ``loss = model(*inputs);
   loss.backward(); opt.step()`` with ``torch.set_num_threads(1)``;
2. ``ddp``: ``torch.nn.parallel.DistributedDataParallel``
   (:func:`placer.runtime.ddp.run_ddp`, ``bucket_cap_mb=25``);
3. ``zero``: the same with ``torch.distributed.optim.ZeroRedundancyOptimizer``;
4. ``dp``: placer's ``data_parallel`` plan, run by the distributed executor
   (:func:`placer.runtime.distributed.run_distributed`, its replicas traced by
   :func:`placer.runtime.replicas.replica_steps`);
5. ``sdp``: its ``sharded_data_parallel`` plan (ZeRO stage 1), the same way;
6. ``auto``: ``auto``'s plan (whichever member won, named), the same way.

Every engine runs once per round (``--rounds``), in turn, so that the
machine's speed, which moves over seconds, weighs on all alike; a measured
step is the median of every round's steps after the warm-up, barrier to
barrier for the ranks (the eager step: its own wall time). Each placer plan
is made, before any run, on the step's graph profiled on this CPU
(:func:`placer.harness.profiling.profile_step`, one thread; a node's time the
median of ``--profiles`` profiles), every node's time scaled by how much
slower an eager step runs in as many processes at once as the cluster has
ranks (:func:`placer.harness.contention.measure_contention`, as ``placer
profile --ranks N`` scales it; ``--no-contention``: not scaled), and the preset with
its gloo link and ``torch.distributed``'s collectives calibrated on as many
ranks (:func:`placer.harness.calibrate.calibrate`, as ``placer profile`` and
``placer calibrate`` make them; the plans cost each bucket by the measured
collective): the plan's simulated step
(``DistributedResult.predicted_s``) is the prediction. The record also keeps
the prediction with each message's host cost and the calibrated barrier
that ends a step (``placer simulate --message-cost``), and each placer plan's
busy time on its busiest rank (operations' own time and their messages'
host time, ``DistributedResult.op_s``) beside the rest of the step (waiting
and the step's end).

Goals: placer's ``data_parallel`` step at most 1.10x DDP's, ``auto``'s at
most DDP's, and the prediction of every placer plan within 15% of its
measured step. Prints a Markdown table and writes it, with the numbers, to
``--output``::

    ./run.sh bench bench/ddp.py [--models resnet,lenet,transformer] [--clusters 2xcpu,4xcpu]
        [--steps 10] [--warmup 2] [--rounds 4] [--profiles 3] [--optimizer sgd] [--time-limit 20]
        [--no-contention] [--output bench/data/ddp-cpu.json]

``bench/data/ddp-cpu.json`` is the record of the defaults on a 2-core
machine (about ten minutes), where ``4xcpu``'s four ranks share two cores:
the contention measured before the runs is what tells the simulator so.
Run it on a quiet machine: another job's load during the runs, and not
during the measurement of contention, is what no prediction sees.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

# name -> (spec, batch): steps of tens to hundreds of milliseconds on one core, whose gradients fit
# one or two 25 MiB buckets. Dropout off: a replica draws its own numbers.
MODELS = {
    "resnet": ("zoo:resnet50?depth=14&image_size=32&width=16&classes=10", 32),
    "lenet": ("zoo:lenet", 256),
    "transformer": ("zoo:transformer?layers=2&hidden=256&heads=4&ff=1024&vocab=2000&seq_len=32&dropout=0", 16),
    "rnnlm": ("zoo:rnnlm?layers=2&hidden=256&vocab=2000&seq_len=16&dropout=0", 32),
}
DEFAULT_MODELS = "resnet,lenet,transformer"
PLANS = ("data_parallel", "sharded_data_parallel", "auto")
SHORT = {"data_parallel": "dp", "sharded_data_parallel": "sdp", "auto": "auto"}
BUCKET_BYTES = 25 << 20  # placer.transform.replicate.BUCKET_BYTES, DDP's bucket_cap_mb=25
#: The goals, as ratios.
DP_OVER_DDP = 1.10
AUTO_OVER_DDP = 1.00
PREDICTION_ERROR = 0.15


def median_after(step_s: list[float], warmup: int) -> float:
    return statistics.median(step_s[warmup:] or step_s)


def eager_steps(model, inputs, optimizer_spec, steps: int, warmup: int) -> list[float]:
    """Every eager step after the warm-up, one process, one thread, on a copy of ``model``."""
    model = copy.deepcopy(model)
    optimizer = optimizer_spec.eager(model.parameters())
    step_s = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = model(*inputs)
        loss.backward()
        optimizer.step()
        step_s.append(time.perf_counter() - t0)
    return step_s[warmup:]


def busy_split(result, plan, cluster, step_s: float) -> dict[str, Any]:
    """The busiest rank of a run: its operations' own time, their messages' host time, and the rest of the
    step (waiting for other ranks, the step's end)."""
    rank_of = {device.name: j for j, device in enumerate(cluster.devices)}
    own = [0.0] * cluster.num_devices
    messages = [0.0] * cluster.num_devices
    for node, seconds in result.op_s.items():
        if node not in plan.placement:
            continue
        j = rank_of[plan.placement[node]]
        sent = result.op_message_s.get(node, 0.0)
        own[j] += seconds - sent
        messages[j] += sent
    j = max(range(cluster.num_devices), key=lambda k: own[k] + messages[k])
    return {
        "rank": j,
        "ops_s": own[j],
        "messages_s": messages[j],
        "rest_s": step_s - own[j] - messages[j],
        "tail_s": result.tail_s,
    }


def with_messages_s(plan, graph, cluster, calibration) -> float | None:
    """The plan's step with its messages' host cost and the barrier that ends a step (``placer simulate
    --message-cost``'s richer prediction)."""
    from placer.sim.messages import simulate_with_messages

    if calibration.message_cost is None:
        return None
    bound = plan.bind(graph, cluster)
    return simulate_with_messages(bound, calibration.message_cost).makespan_s + (calibration.barrier_s or 0.0)


def measure_case(name: str, clusters: dict, args: argparse.Namespace, began: float) -> list[dict]:
    from placer.algorithms import place
    from placer.capture import capture
    from placer.capture.spec import load_model
    from placer.runtime.ddp import run_ddp
    from placer.runtime.distributed import run_distributed
    from placer.runtime.replicas import replica_steps

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {name:11s} {text}", flush=True)

    spec, batch = MODELS[name]
    model, inputs = load_model(spec, batch)
    captured = capture(copy.deepcopy(model), inputs, optimizer=args.optimizer, lr=0.01)
    optimizer = captured.optimizer.eager(model.parameters())
    flat = captured.step_inputs(model, inputs, optimizer)
    params = sum(p.numel() for p in model.parameters())
    steps = args.warmup + args.steps
    # The profile and the plans come before any run, as `placer profile` and `placer plan` would.
    ranks = max(cluster.num_devices for cluster, _ in clusters.values())
    profile, profiles = step_profile(spec, batch, captured, model, inputs, args, max(1, batch // ranks))
    say(
        f"batch {batch}, {params / 1e6:.2f} M parameters, {captured.graph.num_nodes} operations; profiled: "
        f"{profile.total_s * 1e3:.1f} ms of operations (profiles: "
        + ", ".join(f"{p.total_s * 1e3:.1f}" for p in profiles)
        + " ms)"
        + fixed_share(profile)
    )
    graphs, contentions = contended_graphs(spec, batch, captured.graph, profile, clusters, args, say)
    plans = {}
    for cluster_name, (cluster, calibration) in clusters.items():
        graph = graphs[cluster_name]
        for algorithm in PLANS:
            options = {"time_limit": args.time_limit} if algorithm == "auto" else {}
            t0 = time.perf_counter()
            plan = place(graph, cluster, algorithm, **options)
            plans[cluster_name, algorithm] = plan
            chosen = f" ({plan.extra['auto']['start']})" if algorithm == "auto" else ""
            say(
                f"{cluster_name} {SHORT[algorithm]}{chosen}: planned in {time.perf_counter() - t0:.1f} s, predicted "
                f"{plan.predicted['makespan_s'] * 1e3:.1f} ms"
            )
    # Every engine runs once per round, in turn, so that the machine's speed, which moves over seconds,
    # weighs on all alike: a step is the median of every round's steps after the warm-up.
    rounds: dict[tuple[str, str], list[list[float]]] = {}  # (cluster, engine) -> each round's steps
    splits: dict[tuple[str, str], list[dict]] = {}
    predicted: dict[tuple[str, str], float] = {}

    def took(key: tuple[str, str], step_s: list[float]) -> str:
        rounds.setdefault(key, []).append(step_s)
        return f"{key[0]} {key[1]}{said}: {statistics.median(step_s) * 1e3:.1f} ms".lstrip()

    for round_ in range(args.rounds):
        said = f" (round {round_ + 1} of {args.rounds})" if args.rounds > 1 else ""
        say(took(("", "eager"), eager_steps(model, inputs, captured.optimizer, args.steps, args.warmup)))
        for cluster_name, (cluster, calibration) in clusters.items():
            for engine, zero in (("ddp", False), ("zero", True)):
                result = run_ddp(
                    model,
                    inputs,
                    captured.optimizer,
                    cluster.num_devices,
                    steps=steps,
                    zero=zero,
                    bucket_bytes=BUCKET_BYTES,
                )
                say(took((cluster_name, engine), result.step_s[args.warmup :]))
            for algorithm in PLANS:
                plan, short = plans[cluster_name, algorithm], SHORT[algorithm]
                result = run_distributed(
                    captured.gm,
                    graphs[cluster_name],
                    plan,
                    cluster,
                    flat,
                    steps=steps,
                    carrier=captured.carrier,
                    threads=1,
                    replica_steps=replica_steps(captured, plan),
                )
                measured = median_after(result.step_s, args.warmup)
                splits.setdefault((cluster_name, short), []).append(busy_split(result, plan, cluster, measured))
                predicted[cluster_name, short] = result.predicted_s
                error = (result.predicted_s - measured) / measured
                say(
                    took((cluster_name, short), result.step_s[args.warmup :])
                    + f", predicted {result.predicted_s * 1e3:.1f} ms ({error:+.1%})"
                )

    def step_s(key: tuple[str, str]) -> float:
        return statistics.median(s for steps_ in rounds[key] for s in steps_)

    def round_s(key: tuple[str, str]) -> list[float]:
        return [statistics.median(steps_) for steps_ in rounds[key]]

    cases = []
    for cluster_name, (cluster, calibration) in clusters.items():
        case: dict[str, Any] = {
            "model": name,
            "spec": spec,
            "batch": batch,
            "parameters": params,
            "cluster": cluster_name,
            "ranks": cluster.num_devices,
            "profiled_s": profile.total_s,
            "contention": contentions[cluster_name].to_dict() if cluster_name in contentions else None,
            "eager_s": step_s(("", "eager")),
            "eager_rounds_s": round_s(("", "eager")),
        }
        for engine in ("ddp", "zero"):
            case[f"{engine}_s"] = step_s((cluster_name, engine))
            case[f"{engine}_rounds_s"] = round_s((cluster_name, engine))
        for algorithm in PLANS:
            plan, short = plans[cluster_name, algorithm], SHORT[algorithm]
            split = splits[cluster_name, short]
            entry = {
                "measured_s": step_s((cluster_name, short)),
                "rounds_s": round_s((cluster_name, short)),
                "predicted_s": predicted[cluster_name, short],
                "predicted_messages_s": with_messages_s(plan, graphs[cluster_name], cluster, calibration),
                # The busiest rank's time by what it did, the median over the rounds.
                "busiest": {key: statistics.median(one[key] for one in split) for key in split[0] if key != "rank"},
            }
            if algorithm == "auto":
                entry["start"] = plan.extra["auto"]["start"]
                entry["replicas"] = plan.extra.get("replicas")
            case[short] = entry
        case["dp_over_ddp"] = case["dp"]["measured_s"] / case["ddp_s"]
        case["auto_over_ddp"] = case["auto"]["measured_s"] / case["ddp_s"]
        cases.append(case)
    return cases


def step_profile(spec: str, batch: int, captured, model, inputs, args: argparse.Namespace, small_batch: int) -> tuple:
    """The step's profile on this CPU and the profiles it came from, as ``placer profile --small-batch`` makes it.

    A node's time is its median over ``--profiles`` profiles (each the median of 5 runs): the machine's speed
    moves over seconds, and one profile can catch it slow or fast as a whole. Unless ``--no-fixed-part``, each
    node's fixed part is fitted against as many profiles of the step at ``small_batch`` samples (the smallest
    piece of the batch a run gives a rank: a replica's, a micro-batch's), which the micro-batches and replicas
    of the plans then pay whole (:func:`placer.cost.profile.fixed_part`).
    """
    from placer.capture import capture
    from placer.capture.spec import load_model
    from placer.cost.profile import Profile, fixed_part
    from placer.harness.profiling import profile_step

    def median_profile(step, model, inputs) -> tuple:
        profiles = [profile_step(step, model, inputs, device="cpu") for _ in range(args.profiles)]
        seconds = {node: statistics.median(p.node_seconds[node] for p in profiles) for node in step.graph.ids}
        return Profile(step.graph.name, step.graph.digest(), "cpu", seconds), profiles

    profile, profiles = median_profile(captured, model, inputs)
    if args.no_fixed_part or small_batch >= batch:
        return profile, profiles
    torch.manual_seed(0)
    small_model, small_inputs = load_model(spec, small_batch)
    small_step = capture(copy.deepcopy(small_model), small_inputs, optimizer=args.optimizer, lr=0.01)
    small, _ = median_profile(small_step, small_model, small_inputs)
    return fixed_part(profile, small, batch, small_batch), profiles


def fixed_share(profile) -> str:
    """How much of ``profile``'s time is fixed, as the benches report it ('' where it has no fixed parts)."""
    if not profile.fixed_seconds:
        return ""
    batch = profile.meta["fixed_part"]["small_batch"]
    return f"; {sum(profile.fixed_seconds.values()) / profile.total_s:.0%} of it fixed (fitted at batch {batch})"


def contended_graphs(spec: str, batch: int, graph, profile, clusters: dict, args: argparse.Namespace, say) -> tuple:
    """Each cluster's graph: ``graph`` with ``profile``'s times scaled by how much slower an eager step of ``spec``
    runs in as many processes at once as the cluster has ranks (they share this machine), and each measurement
    (:func:`placer.harness.contention.measure_contention`); with ``--no-contention``, the profile's times."""
    from placer.cost.profile import apply_profile
    from placer.harness.contention import measure_contention, under_contention

    graphs, contentions = {}, {}
    for name, (cluster, _) in clusters.items():
        if args.no_contention:
            graphs[name] = apply_profile(graph, profile)
            continue
        contention = measure_contention(spec, batch, cluster.num_devices, optimizer=args.optimizer, lr=0.01)
        contentions[name] = contention
        graphs[name] = apply_profile(graph, under_contention(profile, contention))
        say(
            f"{name}: {cluster.num_devices} processes at once take {contention.slowdown:.2f}x as long for an "
            f"eager step ({contention.together_s * 1e3:.1f} against {contention.alone_s * 1e3:.1f} ms alone)"
        )
    return graphs, contentions


def calibrated_clusters(names: list[str], began: float) -> dict:
    """Each preset with its gloo link calibrated on as many ranks as it has devices."""
    from placer.cluster import load_cluster
    from placer.harness.calibrate import apply_calibration, calibrate

    clusters = {}
    for name in names:
        preset = load_cluster(name)
        calibration = calibrate("gloo", ranks=preset.num_devices)
        link = calibration.links["gloo"]
        clusters[name] = (apply_calibration(preset, calibration), calibration)
        print(
            f"[{time.perf_counter() - began:6.0f} s] calibrated {name}: gloo latency {link.latency_s * 1e6:.1f} us "
            f"idle, {(calibration.loaded_latency_s or 0.0) * 1e6:.1f} us while the ranks compute (the channels'), "
            f"bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s, barrier "
            f"{(calibration.barrier_s or 0.0) * 1e6:.1f} us",
            flush=True,
        )
    return clusters


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def table(cases: list[dict]) -> str:
    """The Markdown table: measured steps (predictions in brackets), the goals' ratios."""
    lines = [
        (
            "| model | ranks | eager | DDP | DDP+ZeRO | dp (pred) | sdp (pred) | auto (pred) | dp/DDP | "
            "auto/DDP | error dp, sdp, auto |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        plans = [c[SHORT[a]] for a in PLANS]
        cells = [f"{ms(p['measured_s'])} ({ms(p['predicted_s'])})" for p in plans]
        errors = ", ".join(f"{abs(p['predicted_s'] - p['measured_s']) / p['measured_s']:.0%}" for p in plans)
        lines.append(
            f"| {c['model']} | {c['ranks']} | {ms(c['eager_s'])} | {ms(c['ddp_s'])} | {ms(c['zero_s'])} | "
            + " | ".join(cells)
            + f" | {c['dp_over_ddp']:.2f} | {c['auto_over_ddp']:.2f} | {errors} |"
        )
    return "\n".join(lines)


def breakdown(cases: list[dict]) -> str:
    """Where each placer plan's step went on its busiest rank: operations, their messages, the rest."""
    lines = [
        "| model | ranks | " + " | ".join(f"{SHORT[a]}: ops + messages + rest" for a in PLANS) + " |",
        "|---|---:|" + "---:|" * len(PLANS),
    ]
    for c in cases:
        cells = [
            " + ".join(ms(c[SHORT[a]]["busiest"][key]) for key in ("ops_s", "messages_s", "rest_s")) for a in PLANS
        ]
        lines.append(f"| {c['model']} | {c['ranks']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(cases: list[dict]) -> list[str]:
    """What each goal says over the cases."""
    said = []
    for key, goal, what in (("dp_over_ddp", DP_OVER_DDP, "dp / DDP"), ("auto_over_ddp", AUTO_OVER_DDP, "auto / DDP")):
        met = sum(c[key] <= goal for c in cases)
        said.append(f"{what} <= {goal:.2f}: {met} of {len(cases)} cases (worst {max(c[key] for c in cases):.2f})")
    errors = [
        abs(c[SHORT[a]]["predicted_s"] - c[SHORT[a]]["measured_s"]) / c[SHORT[a]]["measured_s"]
        for c in cases
        for a in PLANS
    ]
    said.append(
        f"|predicted - measured| / measured <= {PREDICTION_ERROR:.2f}: "
        f"{sum(e <= PREDICTION_ERROR for e in errors)} of {len(errors)} runs "
        f"(mean {statistics.mean(errors):.1%}, worst {max(errors):.1%})"
    )
    return said


def rounded(value: Any) -> Any:
    """Seconds to 0.1 us, other floats to 4 significant digits: a small record."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if abs(value) >= 1 else round(value, 7)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def add_run_options(parser: argparse.ArgumentParser, steps: int, rounds: int) -> None:
    """The options of a measured run shared by the benches that time engines in turn on gloo ranks."""
    parser.add_argument("--steps", type=int, default=steps, help="measured steps, after the warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="steps before those measured, in every run")
    parser.add_argument("--rounds", type=int, default=rounds, help="runs of every engine, in turn")
    parser.add_argument(
        "--profiles", type=int, default=3, help="profiles of each step; a node's time is its median over them"
    )
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument(
        "--no-fixed-part",
        action="store_true",
        help="profile at the run's batch only: every operation's time shrinks with the rows of a micro-batch or "
        "replica, none of it fixed",
    )
    parser.add_argument(
        "--no-contention",
        action="store_true",
        help="plan and predict from the profile alone, not scaled by how much slower a step runs in as many "
        "processes at once as the cluster has ranks",
    )


def calibration_record(clusters: dict) -> dict:
    """Each preset's calibration (:func:`calibrated_clusters`) as a record keeps it: the gloo link, the barrier,
    the collectives' fits and a message's host cost, the figures the predictions came from."""
    return {
        name: {
            "latency_s": cal.links["gloo"].latency_s,
            "loaded_latency_s": cal.loaded_latency_s,
            "bandwidth_bytes_per_s": cal.links["gloo"].bandwidth_bytes_per_s,
            "barrier_s": cal.barrier_s,
            "collectives": {
                kind: {"latency_s": fit.latency_s, "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s}
                for kind, fit in cal.collectives.items()
            },
            "message_cost": None if cal.message_cost is None else cal.message_cost.to_dict(),
        }
        for name, (_, cal) in clusters.items()
    }


def write_record(path: str, record: dict) -> None:
    """``record``, its figures :func:`rounded`, as indented JSON at ``path``; says where it went."""
    with open(path, "w") as f:
        json.dump(rounded(record), f, indent=1)
        f.write("\n")
    print(f"record -> {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)}")
    parser.add_argument("--clusters", default="2xcpu,4xcpu", help="CPU presets (gloo ranks)")
    add_run_options(parser, steps=10, rounds=4)
    parser.add_argument("--time-limit", type=float, default=20.0, help="auto's, seconds")
    parser.add_argument("--output", default="bench/data/ddp-cpu.json", help="the record ('' for none)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}: one of {', '.join(MODELS)}")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1 or args.profiles < 1:
        parser.error("--steps, --rounds and --profiles must be >= 1, --warmup >= 0")
    torch.set_num_threads(1)
    command = (
        f"./run.sh bench bench/ddp.py --models {','.join(models)} --clusters {args.clusters} "
        f"--steps {args.steps} --warmup {args.warmup} --rounds {args.rounds} --profiles {args.profiles} "
        f"--optimizer {args.optimizer} --time-limit {args.time_limit:g}"
        + (" --no-contention" if args.no_contention else "")
        + (" --no-fixed-part" if args.no_fixed_part else "")
        + (f" --output {args.output}" if args.output else "")
    )
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}; {args.optimizer}, {args.steps} steps after {args.warmup}",
        flush=True,
    )
    began = time.perf_counter()
    clusters = calibrated_clusters([c.strip() for c in args.clusters.split(",") if c.strip()], began)
    cases = []
    for name in models:
        cases.extend(measure_case(name, clusters, args, began))
    elapsed = time.perf_counter() - began
    text = table(cases)
    print()
    print(
        f"Steps in ms (median of {args.rounds} x {args.steps} after {args.warmup} each); pred: the simulator's "
        f"step for the plan, profiled and calibrated before the runs; {args.optimizer}, 25 MiB buckets; "
        f"{os.cpu_count()} CPU cores"
    )
    print()
    print(text)
    print()
    for line in goals(cases):
        print(line)
    print()
    print(
        "The busiest rank of each placer plan, ms: its operations' own time, their messages' host time, and the "
        "rest of the step (waiting for other ranks, the step's end); medians over the rounds"
    )
    print()
    print(breakdown(cases))
    print()
    print(f"{elapsed:.0f} s in all")
    print(f"reproduce: {command}")
    if args.output:
        record = {
            "what": "placer's replicated plans against torch DDP and ZeroRedundancyOptimizer (bench/ddp.py)",
            "command": command,
            "torch": torch.__version__,
            "cpu_cores": os.cpu_count(),
            "optimizer": args.optimizer,
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "profiles": args.profiles,
            "bucket_bytes": BUCKET_BYTES,
            "auto_time_limit_s": args.time_limit,
            "calibration": calibration_record(clusters),
            "seconds": elapsed,
            "cases": cases,
            "table": text,
            "goals": goals(cases),
        }
        write_record(args.output, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
