"""Capture time and size of every zoo model, and the analytic cost model against measured profiles.

    ./run.sh bench bench/capture.py                        # or: python bench/capture.py
    python bench/capture.py --models lenet,resnet50 --repeats 5
    python bench/capture.py --device cuda:0                # on a GPU machine: analytic vs measured there
    python bench/capture.py --skip-paper --skip-cost       # capture times alone, batch 4

Part 1 captures each zoo model at its default (paper) size on the meta device, at batch 4 and at
its paper batch size, and reports nodes, edges and capture seconds.

Part 2 builds each model at batch 4 for real (its default size when the step is at most
``--max-gflop`` GFLOP, else its ``tiny`` configuration), times every node on the
device (``placer.cost.profile``: one thread and thread CPU time on the CPU; on a GPU the CUDA
kernels each node launches, or synchronised wall time with ``--gpu-timing wall``), and compares
with the analytic roofline of that device kind (``placer.cost.analytic``): the sum over nodes
(the step) predicted and measured, and the median over nodes of |predicted - measured| / measured
(nodes that take time: placeholders excluded). On a GPU it also times the captured step run
whole (its GraphModule, synchronised, median of ``--repeats``): what the sum of kernels claims
to predict when the host keeps ahead of the GPU.

Part 3 (CPU only) re-measures the single-thread figures the ``cpu`` device spec is built from.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time

import numpy as np
import torch

from placer.capture import capture
from placer.capture.zoo import ZOO
from placer.cost.analytic import DEVICE_SPECS, annotate
from placer.cost.profile import device_kind_of
from placer.harness.profiling import profile_step, step_arguments


def capture_table(names: list[str], skip_paper: bool) -> list[list[str]]:
    rows = []
    for name in names:
        entry = ZOO[name]
        for batch in [4] if skip_paper else [4, entry.paper_batch]:
            try:
                with torch.device("meta"):
                    model, inputs = entry.factory(batch)
                started = time.perf_counter()
                step = capture(model, inputs, name=f"{name}-bs{batch}")
                seconds = time.perf_counter() - started
                g = step.graph
                _GFLOP[name, batch] = float(np.nansum(g.flops)) / 1e9
                rows.append(
                    [
                        name,
                        str(batch),
                        str(g.num_nodes),
                        str(g.num_edges),
                        f"{g.param_bytes.sum() / 2**20:.0f}",
                        f"{np.nansum(g.flops) / 1e9:.1f}",
                        f"{seconds:.2f}",
                    ]
                )
            except Exception as exc:  # noqa: BLE001 - a benchmark reports failures and goes on
                rows.append([name, str(batch), "-", "-", "-", "-", f"failed: {type(exc).__name__}: {exc}"[:80]])
            print(" | ".join(rows[-1]), flush=True)
    return rows


_GFLOP: dict[tuple[str, int], float] = {}  # (model, batch) -> step GFLOP at the default size, from part 1


def step_gflop(name: str, batch: int) -> float:
    if (name, batch) in _GFLOP:
        return _GFLOP[name, batch]
    with torch.device("meta"):
        model, inputs = ZOO[name].factory(batch)
    return float(np.nansum(capture(model, inputs).graph.flops)) / 1e9


def cost_table(
    names: list[str],
    device: str,
    repeats: int,
    batch: int,
    max_gflop: float,
    gpu_timing: str,
    analytic_kind: str | None,
) -> list[list[str]]:
    rows = []
    for name in names:
        entry = ZOO[name]
        try:
            default = step_gflop(name, batch) <= max_gflop
            model, inputs = entry.factory(batch, **({} if default else entry.tiny))
            if device != "cpu":
                model = model.to(device)
                inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
            step = capture(model, inputs, name=f"{name}-bs{batch}")
            profile = profile_step(step, model, inputs, device=device, repeats=repeats, gpu_timing=gpu_timing)
            g = step.graph
            measured = np.array([profile.node_seconds[i] for i in g.ids])
            timed = np.array([op != "placeholder" for op in g.op]) & (measured > 0)
            row = [
                name,
                "default" if default else "tiny",
                str(g.num_nodes),
                f"{np.nansum(g.flops) / 1e9:.2f}",
                f"{measured.sum() * 1e3:.2f}",
            ]
            if analytic_kind:
                predicted = annotate(g, reference=analytic_kind, kinds=()).compute_s
                rel = np.abs(predicted[timed] - measured[timed]) / measured[timed]
                row += [
                    f"{predicted.sum() * 1e3:.2f}",
                    f"{predicted.sum() / measured.sum():.2f}",
                    f"{100 * float(np.median(rel)):.0f}%",
                ]
            else:
                row += ["", "", ""]
            if device != "cpu":
                row.append(f"{whole_step_seconds(step, model, inputs, device, repeats) * 1e3:.2f}")
            rows.append(row)
        except Exception as exc:  # noqa: BLE001
            rows.append([name, "-", "-", "-", f"failed: {type(exc).__name__}: {exc}"[:80]])
        print(" | ".join(rows[-1]), flush=True)
    return rows


def whole_step_seconds(step, model, inputs, device: str, repeats: int) -> float:
    """Median wall seconds of the captured step's GraphModule run whole on a GPU, synchronised."""
    args = step_arguments(step, model, inputs)
    with torch.no_grad():
        step.gm(*args)  # warm-up: kernels chosen, memory cached
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            step.gm(*args)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def cpu_figures() -> list[str]:
    torch.set_num_threads(1)

    def best(fn, runs=5):
        times = []
        for _ in range(runs):
            start = time.thread_time()
            fn()
            times.append(time.thread_time() - start)
        return min(times)

    lines = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
        torch.mm(a, b)
        lines.append(
            f"1024^3 {str(dtype).removeprefix('torch.')} matmul: {2 * 1024**3 / best(lambda: torch.mm(a, b)) / 1e9:.0f} GFLOP/s"
        )
    x = torch.randn(16 << 20)
    y = torch.empty_like(x)
    lines.append(f"64 MiB in-place copy: {2 * x.numel() * 4 / best(lambda: y.copy_(x)) / 1e9:.1f} GB/s")
    lines.append(f"64 MiB out-of-place relu: {2 * x.numel() * 4 / best(lambda: torch.relu(x)) / 1e9:.1f} GB/s")
    s = torch.randn(16)
    lines.append(f"tiny add (dispatch): {best(lambda: [torch.add(s, s) for _ in range(1000)]) / 1000 * 1e6:.2f} us")
    return lines


def markdown(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r + [""] * (len(header) - len(r))) + " |" for r in rows]
    return "\n".join(out)


def cost_parts(args: argparse.Namespace, names: list[str], kind: str, device_name: str) -> None:
    """Parts 2 and 3: measured profiles against the analytic model, and single-thread CPU figures."""
    analytic_kind = args.analytic_kind or (kind if kind in DEVICE_SPECS else None)
    clock = "thread CPU time" if args.device == "cpu" else f"{args.gpu_timing} time"
    print(
        f"\n## Part 2: batch {args.batch}, measured ({clock}) on {device_name} ({kind}) "
        f"vs analytic {analytic_kind or '(none for this kind: pass --analytic-kind)'}"
    )
    rows = cost_table(names, args.device, args.repeats, args.batch, args.max_gflop, args.gpu_timing, analytic_kind)
    header = [
        "model",
        "size",
        "nodes",
        "GFLOP",
        "measured ms",
        "analytic ms",
        "analytic / measured",
        "median node error",
    ]
    print(markdown(header + (["whole step ms"] if args.device != "cpu" else []), rows))
    if args.device == "cpu":
        print("\n## Part 3: single-thread CPU figures")
        print("\n".join(cpu_figures()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated zoo names (default: all)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N for part 2")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per node (median)")
    parser.add_argument("--batch", type=int, default=4, help="batch size of part 2 (default 4)")
    parser.add_argument(
        "--max-gflop",
        type=float,
        default=30.0,
        help="part 2 profiles the default size when its step is at most this many GFLOP, "
        "else the tiny configuration (default 30)",
    )
    parser.add_argument(
        "--gpu-timing",
        choices=("kernel", "wall"),
        default="kernel",
        help="on a GPU: sum of each node's CUDA kernels (default) or synchronised wall time",
    )
    parser.add_argument(
        "--analytic-kind",
        choices=sorted(DEVICE_SPECS),
        help="device kind of the analytic model in part 2 (default: the device's own, where known; "
        "e.g. H100 on an H200, which has its compute and more memory bandwidth)",
    )
    parser.add_argument("--skip-capture", action="store_true", help="skip part 1")
    parser.add_argument("--skip-paper", action="store_true", help="part 1 at batch 4 only")
    parser.add_argument(
        "--skip-cost", action="store_true", help="skip parts 2 and 3 (profiles against the analytic model)"
    )
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",")] if args.models else list(ZOO)
    kind, device_name = device_kind_of(args.device)
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {device_name}; "
        f"{args.repeats} timed runs per node (median)"
    )
    if not args.skip_capture:
        print("\n## Part 1: capture at the default size, meta device")
        rows = capture_table(names, args.skip_paper)
        print(markdown(["model", "batch", "nodes", "edges", "state MiB", "GFLOP", "capture s"], rows))
    if not args.skip_cost:
        cost_parts(args, names, kind, device_name)
    print(f"reproduce: ./run.sh bench bench/capture.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
