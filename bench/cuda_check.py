"""Exercise the runtime's CUDA paths on a GPU machine and say what held.

1. Local executor, CUDA streams and events: plans over 2 and 4 devices (random
   and expert placements, and random placements of a graph with three
   operations split in two along the batch, or along their output channels)
   run with every plan device on its own GPU, or, with fewer GPUs, as separate
   streams of GPU 0. The placed step must equal
   the unplaced captured step run on GPU 0 bit for bit (same kernels, other
   streams; splits within 1e-5), the expert one also timed per operation and
   transfer with CUDA events, and is compared with eager ``torch.optim``
   training on GPU 0 (single-tensor path, as captured) in full float32, as
   ``placer run --verify`` trains; the unplaced step's difference from eager
   training under torch's default precision (TF32 convolutions) is printed
   first.
2. Distributed executor over NCCL, where there are at least two GPUs: the same
   plans with one process per GPU must equal the local placed run; and on any
   GPU machine one rank (a spawned process that gets the step by pickle) must
   equal the unplaced step.

Prints one line per case and the command that reproduces it; exits 1 if an
equality that must hold does not.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=. python bench/cuda_check.py [--steps 3] [--batch 8]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

MODEL = textwrap.dedent("""
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            # No bias: BatchNorm follows, and Adam would turn the rounding of its zero gradient into steps of lr.
            self.conv1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(32)
            self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
            self.head = nn.Linear(32 * 16 * 16, 10)

        def forward(self, x, y):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.relu(self.conv2(h))
            return nn.functional.cross_entropy(self.head(h.flatten(1)), y)


    def make(batch_size):
        torch.manual_seed(0)
        return Net(), (torch.randn(batch_size, 3, 16, 16), torch.randint(0, 10, (batch_size,)))
""")


def _max_diff(a: list, b: list) -> float:
    return max(
        (
            float((x.double() - y.double()).abs().max())
            for x, y in zip(a, b)
            if isinstance(x, torch.Tensor) and x.numel()
        ),
        default=0.0,
    )


def _random_plan(graph, cluster, seed, split: str | None = None):
    """Colocation units on random devices; with ``split`` (a dimension), the first three ops splittable along it
    cut in two first."""
    from placer.algorithms.common import placement_units
    from placer.plan import Plan
    from placer.transform.split import split_operation

    target, splits = graph, []
    if split:
        for name in [graph.ids[i] for i, s in enumerate(graph.splittable) if any(e["dim"] == split for e in s or [])][
            :3
        ]:
            target = split_operation(target, name, split, 2)
            splits.append({"node": name, "dim": split, "parts": 2})
    rng = np.random.default_rng(seed)
    unit_of, units = placement_units(target)
    return Plan.from_arrays(
        graph,
        cluster,
        rng.integers(0, cluster.num_devices, len(units))[unit_of],
        algorithm="random",
        placed_graph=target if split else None,
        splits=splits,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return 1
    from placer.algorithms import place
    from placer.capture.spec import capture_spec, load_model
    from placer.cluster import Cluster, load_cluster
    from placer.runtime.check import eager_optimizer
    from placer.runtime.distributed import float32_precision, run_distributed, set_float32_precision
    from placer.runtime.local import LocalExecutor
    from placer.runtime.program import compile_program, copy_to, value_spec

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, {gpus} x {torch.cuda.get_device_name(0)}")
    tmp = Path(tempfile.mkdtemp())
    (tmp / "net.py").write_text(MODEL)
    spec = f"{tmp / 'net.py'}:make"
    captured = capture_spec(spec, args.batch)
    model, inputs = load_model(spec, args.batch)
    gpu0 = torch.device("cuda", 0)
    model = model.to(gpu0)
    inputs = tuple(copy_to(x, gpu0) for x in inputs)
    start = [t.detach().clone() for t in captured.step_inputs(model, inputs)]

    def references():
        """The captured step unplaced on GPU 0, and eager torch.optim training there, after ``--steps`` steps."""
        flat = [t.clone() for t in start]
        for _ in range(args.steps):
            captured.gm(*flat)
        torch.cuda.synchronize()
        eager_model = copy.deepcopy(model)
        eager_opt = eager_optimizer(captured, eager_model.parameters())
        for _ in range(args.steps):
            eager_opt.zero_grad()
            eager_model(*inputs).backward()
            eager_opt.step()
        return flat, captured.step_inputs(eager_model, inputs, eager_opt)

    unplaced, eager_flat = references()
    print(
        f"torch's default float32 precision {float32_precision()}: unplaced captured step vs eager torch.optim "
        f"max diff {_max_diff(unplaced, eager_flat):.3g}"
    )
    # The placed runs, as `placer run --verify` trains: full float32, no TF32.
    set_float32_precision(("ieee", "ieee"))
    unplaced, eager_flat = references()
    print(
        f"full float32 {float32_precision()}: unplaced captured step vs eager torch.optim max diff "
        f"{_max_diff(unplaced, eager_flat):.3g}"
    )

    failures = 0
    for cluster_name in ("2xV100-nvlink", "4xV100-nvlink"):
        cluster = load_cluster(cluster_name)
        n = cluster.num_devices
        devices = [torch.device("cuda", j) for j in range(n)] if gpus >= n else [gpu0] * n
        where = "one GPU each" if gpus >= n else f"{n} streams on GPU 0"
        for how in ("random", "expert", "split", "channel split"):
            plan = (
                place(captured.graph, cluster, "expert")
                if how == "expert"
                else _random_plan(
                    captured.graph, cluster, n, split={"split": "batch", "channel split": "channel"}.get(how)
                )
            )
            program = compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
            executor = LocalExecutor(program, devices, profile=how == "expert")
            flat = [t.clone() for t in start]
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                executor.run(flat)
                times.append(time.perf_counter() - t0)
            vs_unplaced = _max_diff(flat, unplaced)
            vs_eager = _max_diff(flat, eager_flat)
            # Split parts multiply fewer rows, so they may round differently from the whole op.
            ok = vs_unplaced == 0.0 if "split" not in how else vs_unplaced <= 1e-5
            if executor.profile:
                tensors = sum(value_spec(x.node)[0] == "tensor" for x in program.transfers)  # scalars are not copied
                ok = (
                    ok
                    and len(executor.op_s) == len(program.graph_node) - len(program.placeholders)
                    and len(executor.transfer_s) == tensors
                )
                how += "+profile"
            failures += not ok
            print(
                f"local  {cluster_name:14s} {how:14s} ({where}, {len(program.transfers)} transfers): "
                f"{'OK' if ok else 'MISMATCH'} vs unplaced step (max diff {vs_unplaced:.3g}), "
                f"vs eager torch.optim max diff {vs_eager:.3g}; step {np.median(times[1:] or times) * 1e3:.2f} ms"
            )
            if gpus >= n:
                result = run_distributed(
                    captured.gm,
                    captured.graph,
                    plan,
                    cluster,
                    [t.cpu() for t in start],
                    steps=args.steps,
                    backend="nccl",
                    carrier=captured.carrier,
                    timeout_s=120,
                )
                got = [result.state.get(k, t.cpu()) for k, t in enumerate(start)]
                vs_local = _max_diff(got, [t.cpu() for t in flat])
                ok = vs_local == 0.0
                failures += not ok
                print(
                    f"nccl   {cluster_name:14s} {how:7s} ({n} ranks): {'OK' if ok else 'MISMATCH'} vs local placed "
                    f"run (max diff {vs_local:.3g}); step {np.median(result.step_s[1:]) * 1e3:.2f} ms"
                )
            else:
                print(f"nccl   {cluster_name:14s} {how:7s}: skipped, needs {n} GPUs ({gpus} here)")
    # One rank over NCCL: a spawned process that gets the step by pickle (PortableStep), on any GPU machine.
    one = Cluster("1xV100", [load_cluster("2xV100-nvlink").devices[0]], [])
    plan = place(captured.graph, one, "single")
    result = run_distributed(
        captured.gm,
        captured.graph,
        plan,
        one,
        [t.cpu() for t in start],
        steps=args.steps,
        backend="nccl",
        carrier=captured.carrier,
        timeout_s=120,
    )
    vs_unplaced = _max_diff([result.state.get(k, t.cpu()) for k, t in enumerate(start)], [t.cpu() for t in unplaced])
    ok = vs_unplaced == 0.0
    failures += not ok
    print(
        f"nccl   1xV100         single  (1 rank, spawned): {'OK' if ok else 'MISMATCH'} vs unplaced step "
        f"(max diff {vs_unplaced:.3g}); step {np.median(result.step_s[1:] or result.step_s) * 1e3:.2f} ms"
    )
    print(f"reproduce: PYTHONPATH=. python bench/cuda_check.py --steps {args.steps} --batch {args.batch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
