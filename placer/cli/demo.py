"""``placer demo``: the main job on the built-in default, with no GPU and no input.

It captures one training step of a zoo model that does not fit one GPU of
the default cluster (Inception-v3 at batch 192 with Adam: about 18 GiB
against 16 GiB V100s), compares every registered algorithm on it, prints the
table and writes the full report (tables, plans, Gantt and memory charts,
report.html) with the captured graph beside it.

Then it trains a recommended plan for real (:func:`train_recommended`): a
small model, profiled on this machine's CPU, planned by ``auto`` over two
CPU ranks, trained a few steps with ``placer run --verify`` (against
PyTorch's DDP and eager training), the step the simulator predicted beside
the one measured.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ..algorithms import place
from ..cluster import load_cluster
from ..cost.profile import apply_profile, fixed_part
from ..harness.contention import measure_contention, under_contention
from ..harness.profiling import profile_spec
from ..io import check_output
from ..report.compare import check_options, compare
from ..show import terminal

__all__ = [
    "run_demo",
    "train_recommended",
    "DEFAULT_MODEL",
    "DEFAULT_BATCH",
    "DEFAULT_CLUSTER",
    "DEFAULT_TIME_LIMIT",
    "TRAIN_MODEL",
    "TRAIN_BATCH",
    "TRAIN_CLUSTER",
    "TRAIN_STEPS",
]

DEFAULT_MODEL = "zoo:inception_v3"
DEFAULT_BATCH = 192
DEFAULT_CLUSTER = "4xV100-nvlink"
#: Per-algorithm search limit, so that the whole demo stays within a few minutes on 2 cores.
DEFAULT_TIME_LIMIT = 20.0
#: What the demo trains: a model small enough to train in seconds on two CPU ranks, and big enough that
#: a data-parallel plan beats one process.
TRAIN_MODEL, TRAIN_BATCH, TRAIN_CLUSTER, TRAIN_STEPS = "zoo:lenet", 256, "2xcpu", 6
#: Seconds each process trains in each round while the demo times the ranks' contention (a few steps of the
#: small model; three rounds).
CONTENTION_SECONDS = 0.5


def run_demo(
    output: Path,
    *,
    model: str = DEFAULT_MODEL,
    batch: int = DEFAULT_BATCH,
    cluster: str = DEFAULT_CLUSTER,
    algorithms: list[str] | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    console: Console | None = None,
    train: bool = True,
) -> int:
    """Capture ``model`` at ``batch``, compare ``algorithms`` on ``cluster``, write the report to ``output``;
    then, with ``train``, :func:`train_recommended`.

    Returns the exit status: 0 when some algorithm found a plan that fits (and the trained plan verified).
    """
    from ..capture import capture_spec  # deferred: imports torch

    console = console or Console()
    check_options(algorithms, seed=0, time_limit=time_limit)  # before the capture, as the output folder
    check_output(output, "report folder", folder=True)
    target = load_cluster(cluster)
    began = time.perf_counter()
    with console.status(f"capturing one training step of {model} at batch {batch} (Adam) ..."):
        graph = capture_spec(model, batch, optimizer="adam", fake=True).graph
    total = (graph.param_bytes.sum() + graph.output_bytes.sum()) / 2**30
    console.print(
        f"[bold]{escape(terminal(graph.name))}[/]: {graph.num_nodes} ops captured in "
        f"{time.perf_counter() - began:.1f} s, {total:.1f} GiB of training state and activations; cluster "
        f"{escape(terminal(target.name))} "
        f"({target.num_devices} x {target.devices[0].memory_bytes / 2**30:.0f} GiB)"
    )
    comparison = compare(graph, target, algorithms, seed=0, time_limit=time_limit, console=console)
    comparison.print(console)
    paths = comparison.write(output)  # the report first: a failure there leaves no lone graph.json
    graph.save(output / "graph.json")
    best = comparison.best
    if best is None:
        console.print("no algorithm found a plan that fits")
        return 1
    console.print(f"best: {best.algorithm} ({best.makespan_s * 1e3:.2f} ms); report: {paths['html']}")
    return train_recommended(output, console=console) if train else 0


def train_recommended(
    output: Path,
    *,
    model: str = TRAIN_MODEL,
    batch: int = TRAIN_BATCH,
    cluster: str = TRAIN_CLUSTER,
    steps: int = TRAIN_STEPS,
    time_limit: float = 5.0,
    console: Console | None = None,
) -> int:
    """Profile ``model`` on this CPU, plan it with ``auto`` on ``cluster``'s CPU ranks, and train that plan.

    The plan (``output/train-plan.json``) is made from the profile
    (``output/train-profile.json``, which the run's prediction uses too), as
    ``placer profile --small-batch --ranks`` makes it (each operation's fixed
    part fitted against a rank's share of the batch, every time scaled by the
    contention of as many processes at once), so the simulator predicts the
    step from times measured here; ``placer run
    --backend distributed --verify`` then trains it with SGD, one process per
    device, prints the measured step beside the prediction, and compares the
    trained model with PyTorch's DDP and eager training. Returns ``placer
    run``'s exit status.
    """
    import torch  # deferred: imports torch

    from . import run  # deferred: imports torch

    console = console or Console()
    ranks = load_cluster(cluster)
    small_batch = max(1, batch // ranks.num_devices)

    with console.status(
        f"profiling {model} at batch {batch} and {small_batch} on this CPU, timing {ranks.num_devices} processes "
        f"at once, and planning it with auto on {cluster} ..."
    ):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # each rank runs one thread, as the profile does
        try:
            captured, profile = profile_spec(model, batch, optimizer="sgd")
            if small_batch < batch:
                profile = fixed_part(profile, profile_spec(model, small_batch, optimizer="sgd")[1], batch, small_batch)
        finally:
            torch.set_num_threads(threads)
        contention = measure_contention(model, batch, ranks.num_devices, optimizer="sgd", seconds=CONTENTION_SECONDS)
        profile = under_contention(profile, contention)
        graph = apply_profile(captured.graph, profile)
        plan = place(graph, ranks, "auto", time_limit=time_limit)
    path, profiled = output / "train-plan.json", output / "train-profile.json"
    plan.save(path)
    profile.save(profiled)
    start = plan.extra.get("auto", {}).get("start", "auto") if isinstance(plan.extra.get("auto"), dict) else "auto"
    console.print(
        f"[bold]training auto's plan[/] of {graph.name} (built on {start}) on {cluster}: {steps} steps, "
        f"one process per device -> {path}"
    )
    parser = argparse.ArgumentParser(prog="placer")
    run.add_commands(parser.add_subparsers())
    args = parser.parse_args(
        [
            "run",
            model,
            "--batch",
            str(batch),
            "--optimizer",
            "sgd",
            "--plan",
            str(path),
            "--profile",
            str(profiled),
            "--backend",
            "distributed",
            "--steps",
            str(steps),
            "--verify",
        ]
    )
    return args.func(args)
