"""``placer run`` (train with a plan, optionally verified against eager PyTorch) and
``placer tune`` (FastT's loop: measure, refine the costs, replan, keep the faster plan)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import platform
import re
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..algorithms import place
from ..cluster import load_cluster
from ..cost.profile import apply_profile, load_profile
from ..errors import InvalidPlanError, OptionError
from ..harness.calibrate import load_calibration
from ..harness.feedback import measured_cluster, measured_graph, measured_profile, own_times, profile_kind
from ..io import check_output, same_file
from ..plan import Plan
from ..report.tables import working
from ..show import terminal
from ..sim.messages import MessageCost, simulate_with_messages, spread_over_gaps, without_after_message
from ..terminate import terminate_raises
from ..transform.bind import bind_plan
from ..transform.replicate import BUCKET_BYTES
from .capture import add_optimizer_option, add_optimizer_settings, optimizer_settings
from .common import add_microbatches_option, check_microbatches_flag, cluster_for_plan, naming_plan

__all__ = ["add_commands", "cmd_run", "cmd_tune", "Measurement", "measure_plan"]

#: Largest absolute difference ``placer run --verify`` accepts by default (``--tolerance``).
VERIFY_TOLERANCE = 1e-6
#: The same with ``--float64``, relative to each tensor's size (at least 1): a plan that computes what the
#: step does stays near 1e-13 of eager float64 training, where one float32 rounding in a partial sum shows.
FLOAT64_TOLERANCE = 1e-10


@dataclass
class Measurement:
    """A placed run's step times (all steps, warm-up first), per-node and per-transfer times, and (distributed)
    the last step's timeline and the step's end after its last operation
    (:attr:`placer.runtime.distributed.DistributedResult.timeline`, ``tail_s``)."""

    step_s: list[float]
    op_s: dict[str, float]
    predicted_s: float
    outputs: list
    state: dict[int, Any]
    transfer_s: list = field(default_factory=list)
    timeline: dict = field(default_factory=dict)
    op_message_s: dict[str, float] = field(default_factory=dict)
    message_s: list = field(default_factory=list)
    tail_s: float = 0.0


def measure_plan(
    captured: Any,
    plan: Any,
    cluster: Any,
    flat: list,
    *,
    steps: int,
    backend: str,
    threads: int = 1,
    timeout_s: float = 60.0,
    devices: list[str] | None = None,
    graph: Any = None,
) -> Measurement | None:
    """Train ``steps`` steps of ``captured`` as ``plan`` says; the local backend updates ``flat`` in place.

    ``backend`` is ``"local"`` (this process, :class:`LocalExecutor`) or
    ``"distributed"`` (one process per device, started here, or this process's
    rank under ``torchrun``; ``flat`` is left as it is and the new state is in
    the result, which only rank 0 of a ``torchrun`` launch gets: the others get None).
    ``graph`` (default the captured one) is the step's graph with the costs the
    prediction simulates: the captured graph with a profile's times.
    """

    from ..runtime.distributed import run_distributed, run_under_torchrun, under_torchrun  # deferred: imports torch
    from ..runtime.local import LocalExecutor  # deferred: imports torch
    from ..runtime.program import compile_program, message_bytes, value_spec  # deferred: imports torch
    from ..runtime.replicas import replica_steps  # deferred: imports torch

    steps_traced = replica_steps(captured, plan)
    graph = captured.graph if graph is None else graph
    if backend == "local":
        program = compile_program(
            captured.gm, graph, plan, cluster, carrier=captured.carrier, replica_steps=steps_traced
        )
        executor = LocalExecutor(program, devices, profile=True)
        step_s, outputs = [], []
        for _ in range(steps):
            t0 = time.perf_counter()
            outputs = executor.run(flat)
            step_s.append(time.perf_counter() - t0)
        written = {root for roots in program.writes.values() for root in roots}
        state = {
            program.feeds[i].flat: flat[program.feeds[i].flat]
            for i, p in enumerate(program.placeholders)
            if p in written and program.writes_caller(i)
        }
        # The last step's copies, as the distributed executor reports its messages (tune feeds them back).
        transfers = [
            (x.src, x.dst, message_bytes(value_spec(x.node, program.compact_views)), seconds)
            for x, seconds in executor.transfer_s
        ]
        return Measurement(step_s, dict(executor.op_s), program.predicted_s, outputs, state, transfers)
    if backend == "distributed":
        run = run_under_torchrun if under_torchrun() else run_distributed
        result = run(
            captured.gm,
            graph,
            plan,
            cluster,
            flat,
            steps=steps,
            backend="auto",
            timeout_s=timeout_s,
            carrier=captured.carrier,
            threads=threads,
            replica_steps=steps_traced,
        )
        if result is None:  # a rank other than 0 under torchrun: rank 0 reports
            return None
        return Measurement(
            result.step_s,
            result.op_s,
            result.predicted_s,
            result.outputs,
            result.state,
            result.transfer_s,
            result.timeline,
            result.op_message_s,
            result.message_s,
            result.tail_s,
        )
    raise OptionError(f"backend must be 'local' or 'distributed', got {backend!r}")


def _first_device(backend: str, devices: list[str] | None, num_devices: int) -> torch.device:
    """The torch device the plan's first device ran on, for ``backend`` and ``--devices``."""
    from ..runtime.distributed import resolve_backend  # deferred: imports torch
    from ..runtime.local import default_devices  # deferred: imports torch

    if backend == "local":
        return torch.device(devices[0]) if devices else default_devices(num_devices)[0]
    return torch.device("cuda", 0) if resolve_backend("auto", num_devices) == "nccl" else torch.device("cpu")


def _check_measured_outputs(args: argparse.Namespace, cluster: Any, devices, inputs=()) -> None:
    """Before the run: ``--profile-output`` and ``--cluster-output`` can be written (and are no input file, nor
    the command's other output), and ``devices`` (indices of the devices the run may use) are of one kind, as a
    profile file's times are."""

    if args.profile_output:
        check_output(args.profile_output, "profile file", inputs=inputs)
        profile_kind(cluster, devices)
    if args.cluster_output:
        check_output(args.cluster_output, "cluster file", inputs=inputs)
    outputs = [
        (option, path)
        for option, path in (
            ("--output", getattr(args, "output", None)),
            ("--profile-output", args.profile_output),
            ("--cluster-output", args.cluster_output),
            ("--trace", getattr(args, "trace", None)),
        )
        if path
    ]
    for k, (option, path) in enumerate(outputs):
        for other, other_path in outputs[k + 1 :]:
            if same_file(path, other_path):
                raise OptionError(f"{option} and {other} are both {path}: the second would replace the first")


def _write_measured(args: argparse.Namespace, m: Measurement, bound: Any, graph: Any, command: str) -> None:
    """Write the run ``m`` of the plan ``bound`` as ``--profile-output`` (each node's own time, as
    :func:`~placer.harness.feedback.measured_graph` takes it, a profile of the captured ``graph``) and
    ``--cluster-output`` (each link's latency from the run's transfers,
    :func:`~placer.harness.feedback.measured_cluster`)."""

    if args.profile_output:
        profile = measured_profile(
            bound,
            own_times(m.op_s, m.op_message_s),
            graph,
            source=command,
            backend=args.backend,
            steps=args.steps,
            timed="the last step" if args.backend == "local" else "median of the steps after the first",
            less="the host time of the node's own messages",
            threads=args.threads,
            torch=torch.__version__,
            host=platform.node(),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        profile.save(args.profile_output)
        print(
            f"measured times of {len(profile.node_seconds)} nodes on {profile.device_kind!r} devices -> "
            f"{args.profile_output} (placer cost GRAPH --profile {args.profile_output} applies them)"
        )
    if args.cluster_output:
        measured = measured_cluster(bound.cluster, m.transfer_s)
        measured.save(args.cluster_output)
        said = (
            f"links' latency from {len(m.transfer_s)} measured transfers"
            if measured is not bound.cluster
            else "no transfer measured: its links as given"
        )
        print(f"cluster {measured.name!r} ({said}) -> {args.cluster_output}")


def _batch(args: argparse.Namespace, graph_name: str) -> int:
    if args.batch is not None:
        return args.batch
    found = re.search(r"-bs(\d+)-", graph_name or "")
    if not found:
        raise OptionError("pass --batch (the plan's graph name does not say the batch size)")
    return int(found.group(1))


def _load(args: argparse.Namespace, batch: int):
    """The model and inputs ``args.spec`` names, an untouched copy, and the captured step.

    The step is captured as ``placer capture`` does (same graph name), so a plan
    made from that command's graph file applies.
    """
    from ..capture.spec import capture_spec, in_float64, load_model  # deferred: imports torch

    if args.threads < 1:
        raise OptionError(f"--threads must be >= 1, got {args.threads}")
    if not args.timeout >= 1:
        raise OptionError(f"--timeout must be at least 1 second (the ranks first meet within it), got {args.timeout}")
    torch.set_num_threads(args.threads)
    float64 = getattr(args, "float64", False)
    model, inputs = load_model(args.spec, batch)
    if float64:
        model, inputs = in_float64(model, inputs)
    reference = copy.deepcopy(model)
    captured = capture_spec(
        args.spec,
        batch,
        optimizer=args.optimizer,
        lr=args.lr,
        name=getattr(args, "name", None),
        settings=optimizer_settings(args),
        float64=float64,
    )
    return model, inputs, reference, captured


def cmd_run(args: argparse.Namespace) -> int:
    from ..runtime.check import exact_float32  # deferred: imports torch

    # A verified run trains both ways in full float32: the GPUs' default TF32 convolutions
    # would turn last-bit differences into 1e-3 (docs/benchmarks.md, "The CUDA paths").
    with exact_float32() if args.verify else contextlib.nullcontext():
        return _run(args)


def _check_torchrun(args: argparse.Namespace) -> None:
    """Refuse what a rank of a ``torchrun`` launch cannot do, before any work: the local backend (each
    rank would train the whole step alone) and a timeline across hosts (their clocks differ)."""
    from ..runtime.distributed import torchrun_world, under_torchrun  # deferred: imports torch

    if not under_torchrun():
        return
    if args.backend != "distributed":
        raise OptionError(
            "under torchrun, pass --backend distributed (with the local backend every rank would "
            "train the whole step by itself)"
        )
    world, local_world = torchrun_world()
    if args.trace and local_world != world:
        raise OptionError("--trace needs every rank on one host (the hosts' clocks differ); run without it")


def _check_devices(plan, path: str, cluster) -> None:
    """Before the model is loaded and captured: the plan's devices are the cluster's."""

    unknown = sorted(set(plan.placement.values()) - set(cluster.device_index))
    with naming_plan(path, plan, cluster):
        if unknown:
            raise InvalidPlanError(
                f"the plan places nodes on {', '.join(map(repr, unknown))}, which cluster {cluster.name!r} lacks"
            )


def _oracles(captured: Any, plan: Any) -> list[str]:
    """What ``--verify`` compares a plan's training with: eager training, and for a replicated plan
    PyTorch's DDP (with ZeroRedundancyOptimizer for a sharded optimizer) where the batch divides, eager
    training only where no operation couples the batch's samples (batch norm sees a replica's rows); for a
    micro-batched plan eager gradient accumulation over its micro-batches, and eager training on the whole
    batch where no operation couples the samples.

    Raises
    ------
    OptionError
        A replicated plan with neither: the batch does not divide and batch norm couples the samples.
    """
    from ..runtime.replicas import batch_coupled  # deferred: imports torch

    target = plan.rewritten_graph
    if target is not None and int((target.extra.get("microbatches") or {}).get("count", 1)) > 1:
        return ["accumulate"] + ([] if batch_coupled(captured.gm) else ["eager"])
    if target is None or "data_parallel" not in target.extra:
        return ["eager"]
    replicas = int(target.extra["data_parallel"]["replicas"])
    coupled = batch_coupled(captured.gm)
    oracles = (["ddp"] if captured.batch_size % replicas == 0 else []) + ([] if coupled else ["eager"])
    if not oracles:
        raise OptionError(
            f"--verify has no oracle for this plan: its {replicas} replicas share the batch of "
            f"{captured.batch_size} unevenly, which PyTorch's DDP cannot (it averages its replicas "
            f"equally), and {coupled[0]!r} couples the samples of a replica's rows (batch norm), so "
            f"eager training on the whole batch differs too; verify with a batch that divides by "
            f"{replicas}"
        )
    return oracles


def _train_ddp(captured: Any, plan: Any, model: Any, inputs: Any, args: argparse.Namespace) -> tuple:
    """Train a copy of ``model`` with DDP (and ZeroRedundancyOptimizer) as the replicated ``plan`` splits the
    batch; the trained model, its optimizer and what to call them."""
    from ..runtime.check import eager_optimizer  # deferred: imports torch
    from ..runtime.ddp import run_ddp  # deferred: imports torch

    info = plan.rewritten_graph.extra["data_parallel"]
    replicas, zero = int(info["replicas"]), bool(info["sharded_optimizer"])
    name = "DDP + ZeroRedundancyOptimizer" if zero else "DDP"
    with working(f"training {args.steps} steps with torch {name} on {replicas} ranks to compare ..."):
        result = run_ddp(
            model,
            inputs,
            captured.optimizer,
            replicas,
            steps=args.steps,
            zero=zero,
            bucket_bytes=int(info.get("bucket_bytes") or BUCKET_BYTES),
            timeout_s=args.timeout,
            threads=args.threads,
        )
    model.load_state_dict(result.model_state)
    optimizer = eager_optimizer(captured, model.parameters())
    optimizer.load_state_dict(result.optimizer_state)
    return model, optimizer, f"torch {name} on {replicas} ranks"


def _run(args: argparse.Namespace) -> int:

    from ..runtime.check import (  # deferred: imports torch
        eager_optimizer,
        refuse_random_ops,
        state_difference,
        step_times,
        train_accumulated,
        train_eager,
    )
    from ..runtime.program import copy_to  # deferred: imports torch
    from ..runtime.replicas import batch_coupled, replica_steps  # deferred: imports torch

    if args.steps < 1:
        raise OptionError(f"--steps must be >= 1, got {args.steps}")
    if args.tolerance is not None and not args.verify:
        raise OptionError(
            "--tolerance needs --verify (it is the largest difference --verify accepts; without "
            "--verify nothing is compared)"
        )
    if args.float64 and not args.verify:
        raise OptionError("--float64 needs --verify (it trains both ways in double precision to compare them)")
    tolerance = (
        args.tolerance if args.tolerance is not None else FLOAT64_TOLERANCE if args.float64 else VERIFY_TOLERANCE
    )
    if not tolerance >= 0:
        raise OptionError(f"--tolerance must be >= 0, got {tolerance}")
    if args.trace and args.backend != "distributed":
        raise OptionError("--trace needs --backend distributed (one process per device, each with its own timeline)")
    if args.trace:
        check_output(args.trace, "trace file", inputs=[args.plan, args.cluster, args.spec])
    _check_torchrun(args)
    if args.warmup < 0:
        raise OptionError(f"--warmup must be >= 0, got {args.warmup}")
    if args.devices and args.backend != "local":
        raise OptionError("--devices is for --backend local (a distributed run's ranks each take their own device)")
    optimizer_settings(args)  # before the plan, the model and the capture
    plan = Plan.load(args.plan)
    cluster = cluster_for_plan(plan, args.plan, load_cluster(args.cluster) if args.cluster else None, args.cluster)
    _check_devices(plan, args.plan, cluster)
    _check_measured_outputs(
        args,
        cluster,
        {cluster.device_index[d] for d in plan.placement.values()},
        inputs=[args.plan, args.cluster, args.spec, args.profile],
    )
    profile = None
    if args.profile:  # read and checked before the capture
        profile = load_profile(args.profile)
        profile.check_cluster(cluster)
    model, inputs, reference, captured = _load(args, _batch(args, plan.graph_name))
    graph = captured.graph if profile is None else apply_profile(captured.graph, profile)
    try:  # a plan for another batch size or optimizer: refused before "training ..."
        bound = bind_plan(plan, captured.graph, cluster)
    except InvalidPlanError as exc:
        # The same model, batch and optimizer by name (which carries settings other than torch's defaults).
        opt, named = captured.optimizer, captured.graph.name
        base = named[: len(named) - len(opt.label)] + opt.name if named.endswith(opt.label) else named
        if (
            plan.graph_digest
            and plan.graph_digest != captured.graph.digest()
            and plan.graph_name != named
            and (plan.graph_name == base or plan.graph_name.startswith(base + "-"))
        ):
            raise InvalidPlanError(
                f"{args.plan} was made for graph {plan.graph_name!r}, not {named!r} captured with "
                f"{captured.optimizer.describe()} (digest {plan.graph_digest}, not {captured.graph.digest()}): "
                f"optimizer settings that add operations or state (--momentum, --weight-decay, --nesterov) make "
                f"another graph; pass those the plan was made with"
            ) from None
        raise InvalidPlanError(f"{args.plan}: {exc}") from None
    if args.verify:
        refuse_random_ops(captured)  # random draws cannot equal eager training's: say so before training
    replica_steps(captured, plan)  # a batch the replicas cannot share: refused before training
    oracles = _oracles(captured, plan) if args.verify else []
    optimizer = captured.optimizer.eager(model.parameters())
    flat = captured.step_inputs(model, inputs, optimizer)
    devices = args.devices.split(",") if args.devices else None
    from ..runtime.distributed import under_torchrun  # deferred: imports torch

    # Under torchrun rank 0 speaks for the launch, as it reports the run (each rank said it was training).
    announce = not under_torchrun() or os.environ["RANK"] == "0"
    stopped = "placer: terminated: the run's processes were stopped and nothing was written"
    with (
        terminate_raises(stopped),
        (
            working(
                f"training {args.steps} steps of {captured.graph.name} as the plan places it ({args.backend}) ...",
                measuring=True,
            )
            if announce
            else contextlib.nullcontext()
        ),
    ):
        m = measure_plan(
            captured,
            plan,
            cluster,
            flat,
            steps=args.steps,
            backend=args.backend,
            threads=args.threads,
            timeout_s=args.timeout,
            devices=devices,
            graph=graph,
        )
    if m is None:
        return 0
    if args.backend == "distributed":
        captured.write_back([m.state.get(k, v) for k, v in enumerate(flat)], model, optimizer)
    times = step_times(m.step_s, args.warmup)
    loss = f"; last loss {float(m.outputs[0]):.6g}" if m.outputs and m.outputs[0] is not None else ""
    print(
        f"{terminal(captured.graph.name)} on {terminal(cluster.name)} ({args.backend}, {cluster.num_devices} devices): "
        f"{args.steps} steps, step {times.median_s * 1e3:.3f} ms (median of {len(times.counted)} after "
        f"{times.warmup} warm-up), simulator predicts {m.predicted_s * 1e3:.3f} ms "
        f"({'analytic costs' if profile is None else 'the times of ' + args.profile}){loss}"
    )
    if m.message_s:
        busy = sum(m.op_s.values())
        print(
            f"messages: {len(m.message_s) // max(1, args.steps - 1)} per step took the ranks "
            f"{sum(m.op_message_s.values()) / busy:.0%} of their busy time (host: packing, sending, posting "
            f"receives; the reference model charges them to no device); a step ended {m.tail_s * 1e3:.3f} ms "
            f"after its last operation (the last sends and the barrier between steps)"
        )
    if args.trace:
        from ..runtime.trace import write_run_trace  # deferred: imports torch

        write_run_trace(args.trace, m.timeline, cluster, step_s=m.step_s[-1], predicted_s=m.predicted_s)
        print(
            f"timeline of the last step -> {args.trace} (open in ui.perfetto.dev; the simulator's: "
            f"placer simulate GRAPH PLAN --trace FILE)"
        )
    _write_measured(args, m, bound, captured.graph, "placer run")
    if not args.verify:
        return 0
    home = _first_device(args.backend, devices, cluster.num_devices)
    pristine = copy.deepcopy(reference) if "ddp" in oracles else None
    failed = None
    for oracle in oracles:
        if oracle == "accumulate":
            info = plan.rewritten_graph.extra["microbatches"]
            trained = copy.deepcopy(reference).to(home)  # the eager oracle, if any, trains the original
            trained_optimizer = eager_optimizer(captured, trained.parameters())
            with working(f"training {args.steps} steps eagerly by gradient accumulation on {home} to compare ..."):
                train_accumulated(
                    trained, [copy_to(x, home) for x in inputs], trained_optimizer, args.steps, info["rows"]
                )
            what = f"eager gradient accumulation over the plan's {info['count']} micro-batches on {home}"
        elif oracle == "eager":
            # Eager training where the plan's first device ran: the same kernels (a GPU's, not the CPU's).
            trained = reference.to(home)
            trained_optimizer = eager_optimizer(captured, trained.parameters())
            with working(f"training {args.steps} steps eagerly on {home} to compare ..."):
                train_eager(trained, [copy_to(x, home) for x in inputs], trained_optimizer, args.steps)
            what = f"eager training on {home}"
        else:
            trained, trained_optimizer, what = _train_ddp(captured, plan, pristine, inputs, args)
        worst, where, count = state_difference(model, optimizer, trained, trained_optimizer, relative=args.float64)
        what += ", both in float64 (differences relative to each tensor's size, at least 1)" if args.float64 else ""
        if worst <= tolerance:
            print(
                f"verify: {count} tensors (parameters, buffers, optimizer state) equal {what} within "
                f"{tolerance:g} (largest difference {worst:.3g})"
            )
        else:
            print(f"verify: FAILED: {where} differs from {what} by {worst:.3g} (> --tolerance {tolerance:g})")
            failed = where
    if failed is None:
        return 0
    where = failed
    if not args.float64 and (plan.splits or batch_coupled(captured.gm)):
        print(
            "verify: batch norm over a few samples can grow float32 rounding (a split operation adds its partial "
            "sums in another order) past any tolerance within steps: --float64 tells such rounding from a fault"
        )
    if args.optimizer != "sgd":
        # Measured on an H100: 0.002 after 3 steps at lr 1e-3, from kernels that round differently.
        print(
            f"verify: {args.optimizer} moves every parameter by about --lr per step whatever its gradient's "
            f"size, so rounding differences between kernels (GPUs) can reach 2 x lr x steps: "
            f"verify with --optimizer sgd, or pass a --tolerance of that size"
        )
    elif where.endswith(":momentum_buffer"):
        # Measured on an H200: 1.3e-05 in conv1's after 5 steps, the parameters within 1e-6.
        print(
            "verify: a momentum buffer holds a running sum of gradients, not steps of --lr, so rounding "
            "differences between kernels (GPUs) show in it at the gradients' size: verify without --momentum, "
            "or pass a --tolerance of that size"
        )
    return 1


def cmd_tune(args: argparse.Namespace) -> int:
    from ..runtime.check import step_times  # deferred: imports torch

    if args.rounds < 1 or args.steps < 2:
        raise OptionError("--rounds must be >= 1 and --steps >= 2 (one warm-up step)")
    from ..runtime.distributed import under_torchrun  # deferred: imports torch

    if under_torchrun():
        raise OptionError("placer tune starts the ranks of each run itself: run it without torchrun, on one host")
    inputs = [args.cluster, args.profile, args.message_cost, args.spec]
    check_output(args.output, "plan file", inputs=inputs)
    cluster = load_cluster(args.cluster)
    _check_measured_outputs(args, cluster, range(cluster.num_devices), inputs=inputs)
    profile = None
    if args.profile:  # read and checked before the capture
        profile = load_profile(args.profile)
        profile.check_cluster(cluster)
    if args.batch is None:
        raise OptionError("pass --batch")
    check_microbatches_flag(args)
    calibrated = None
    if args.message_cost:
        calibrated = load_calibration(args.message_cost).message_cost
        if calibrated is None or not calibrated.by_gap:
            raise OptionError(
                f"calibration {args.message_cost} has no message cost by gap (`placer calibrate "
                f"--backend gloo` times one)"
            )
    model, inputs, _, captured = _load(args, args.batch)
    flat = captured.step_inputs(model, inputs, None)
    graph = captured.graph
    costs = "analytic costs"
    if profile is not None:
        graph = apply_profile(graph, profile)
        costs = f"the measured times of {args.profile}"

    def run(plan):
        with terminate_raises(
            f"placer: terminated: tuning stopped, its run's processes with it; no plan was written to {args.output}"
        ):
            m = measure_plan(
                captured,
                plan,
                cluster,
                [t.clone() for t in flat],
                steps=args.steps,
                backend=args.backend,
                threads=args.threads,
                timeout_s=args.timeout,
            )
        return step_times(m.step_s, 1).median_s, m

    def with_messages(plan, own: dict[str, float]) -> str:
        """The candidate's step with the host cost of its messages, fitted to the best run's, whose ops' own
        times are ``own``, and the best run's step end after its last operation (a richer mode)."""
        if not m.message_s:
            return ""
        cost = MessageCost.fit(m.message_s)
        if calibrated is not None:
            cost = spread_over_gaps(cost, calibrated, bind_plan(best, graph, given), own)
            own = without_after_message(own, bind_plan(best, graph, given), cost)
        step_s = simulate_with_messages(bind_plan(plan, graph, given), cost, own).makespan_s + m.tail_s
        return f", {step_s * 1e3:.3f} ms with its messages' host cost and the step's end"

    given = cluster  # its links as calibrated, not as a run's traffic made them
    plan = place(graph, cluster, args.algorithm, seed=0, microbatches=args.microbatches)
    best_s, m = run(plan)
    print(
        f"round 0: {args.algorithm} on {costs}: measured {best_s * 1e3:.3f} ms, "
        f"predicted {plan.predicted['makespan_s'] * 1e3:.3f} ms"
    )
    best = plan
    for r in range(1, args.rounds + 1):
        # The ops' own times: what the last plan's messages added to them another plan need not pay.
        own = own_times(m.op_s, m.op_message_s)
        graph = measured_graph(graph, bind_plan(best, graph, cluster), cluster, own)
        cluster = measured_cluster(given, m.transfer_s)
        if m.transfer_s and cluster.channels:
            ch = cluster.channels[0]
            print(
                f"round {r}: {len(m.op_s)} measured op times, {len(m.transfer_s)} measured transfers; "
                f"{ch.extra.get('link', ch.name)} link now {ch.latency_s * 1e6:.1f} us + "
                f"{ch.bandwidth_bytes_per_s / 1e9:.3g} GB/s"
            )
        candidate = place(graph, cluster, args.algorithm, seed=r, microbatches=args.microbatches)
        measured_s, m_new = run(candidate)
        kept = measured_s < best_s
        print(
            f"round {r}: replanned on measured costs: predicted {candidate.predicted['makespan_s'] * 1e3:.3f} ms"
            f"{with_messages(candidate, own)}, measured {measured_s * 1e3:.3f} ms -> "
            f"{'kept' if kept else 'rolled back'} "
            f"(best {min(best_s, measured_s) * 1e3:.3f} ms)"
        )
        if kept:
            best, best_s, m = candidate, measured_s, m_new
    best.extra["measured_step_s"] = best_s
    best.cluster_name, best.cluster_digest = given.name, given.digest()  # the cluster it runs on, not the measured
    best.save(args.output)
    print(f"best plan: measured {best_s * 1e3:.3f} ms per step -> {args.output}")
    _write_measured(args, m, bind_plan(best, captured.graph, given), captured.graph, "placer tune")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="zoo:NAME[?key=value&...] or path/to/file.py:FACTORY")
    p.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    p.add_argument(
        "--backend",
        choices=("local", "distributed"),
        default="local",
        help="local: one process, every device a CUDA stream or the CPU; distributed: one process "
        "per device over torch.distributed (gloo on CPU, NCCL on GPUs), started here, or "
        "the ranks of `torchrun --nproc-per-node N [--nnodes ...] -m placer run ...`",
    )
    add_optimizer_option(p, lr=True)
    add_optimizer_settings(p)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (per rank; default 1)")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a rank may wait for another before the run stops (default 60)",
    )


def _measurement_outputs(p: argparse.ArgumentParser, run: str) -> None:
    """``--profile-output`` and ``--cluster-output``: what ``run`` (the run they write) measured, as files."""
    p.add_argument(
        "--profile-output",
        metavar="FILE",
        help=f"write the per-node times measured in {run} (less their messages' host time) as a "
        f"placer.profile/1 file of its devices' kind, which `placer cost/plan --profile` applies",
    )
    p.add_argument(
        "--cluster-output",
        metavar="FILE",
        help=f"write the cluster with each link's latency as the transfers of {run} took it (placer.cluster/1)",
    )


def add_commands(subparsers) -> None:
    """Add ``placer run`` and ``placer tune``."""
    p = subparsers.add_parser("run", help="train a model with a plan (and check it against eager PyTorch)")
    _common(p)
    p.add_argument("--plan", required=True, help="placer.plan/1 file for the model's captured graph")
    p.add_argument("--batch", type=int, help="batch size (default: read from the plan's graph name, e.g. -bs8-)")
    p.add_argument(
        "--name",
        help="graph name of the captured step, as `placer capture --name` gave it (default NAME-bsBATCH-OPTIMIZER)",
    )
    p.add_argument("--cluster", help="preset or cluster file (default: the plan's)")
    p.add_argument("--warmup", type=int, default=1, help="steps left out of the timing (default 1)")
    p.add_argument(
        "--devices",
        help="local backend: torch device per plan device, comma-separated "
        "(default: cuda:j where there are enough GPUs, else cpu)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="compare every parameter, buffer and optimizer state with plain eager training; "
        "exit 1 unless equal within --tolerance (both train in full float32: no TF32 on GPUs)",
    )
    p.add_argument(
        "--float64",
        action="store_true",
        help="with --verify: train both ways in double precision (the model, its inputs and the captured step), "
        "to tell a fault from float32 rounding that batch norm over a few samples grows past any tolerance; "
        f"each difference is then relative to its tensor's size, at least 1 (default tolerance "
        f"{FLOAT64_TOLERANCE:g}); the step times are float64's",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        help=f"with --verify: the largest absolute difference it accepts (default {VERIFY_TOLERANCE:g})",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="placer.profile/1 file of the step whose times the prediction simulates instead of the analytic ones "
        "(the profile the plan was made from, e.g. `placer profile --small-batch B --ranks N`)",
    )
    p.add_argument("--trace", help="distributed: write the last step's measured timeline (Chrome trace JSON) here")
    _measurement_outputs(p, "the run")
    p.set_defaults(func=cmd_run)

    p = subparsers.add_parser("tune", help="FastT's loop: measure a plan, refine costs, replan, keep the faster")
    _common(p)
    p.add_argument("--cluster", required=True, help="preset or cluster file")
    p.add_argument("--batch", type=int, required=True, help="batch size")
    p.add_argument("--algorithm", default="expert", help="registered algorithm to (re)plan with (default expert)")
    add_microbatches_option(p)
    p.add_argument("--rounds", type=int, default=2, help="replanning rounds after the first plan (default 2)")
    p.add_argument("--output", "-o", required=True, help="plan file for the fastest measured plan")
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="placer.profile/1 file whose measured times the first plan uses instead of the analytic "
        "ones (e.g. an earlier run's `placer run/tune --profile-output`)",
    )
    _measurement_outputs(p, "the fastest plan's run")
    p.add_argument(
        "--message-cost",
        metavar="CAL",
        help="placer.calibration/1 file with a gloo message cost by gap (`placer calibrate`): the "
        "candidates' steps with their messages' host cost then give the best run's cost that shape",
    )
    # One process per device measures what a placement changes; the local backend on a CPU
    # runs every device's work in turn.
    p.set_defaults(func=cmd_tune, backend="distributed")
