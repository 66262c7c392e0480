"""FastT's OS-DPOS against DPOS on each model's own graph, forward and backward operations splittable.

FastT (Section 5.2, Table 1) reports OS-DPOS 4.5 to 10.9% faster than DPOS on convolutional models.
Goal: OS-DPOS started from the model's own graph (``data_parallel_start=False``: splitting alone, no
data-parallel start) at least 5% faster than DPOS, geometric mean over the cases.

    ./run.sh bench bench/fastt.py                       # the table
    python bench/fastt.py --models vgg19 --clusters 4xV100-nvlink --time-limit 30
    python bench/fastt.py --verify                      # the split plans also run (local backend, tiny sizes)

Models are captured from the zoo at FastT's batches (Table 1: VGG-19 and Inception-v3 at 64; ResNet-50 at
the 32 of FastT's ResNet-200) with SGD, on fake tensors, and costed by the analytic roofline
(:func:`placer.cost.analytic.annotate`, V100). Each cell is the plan's simulated step time; the split
columns count OS-DPOS's splits and how many of them are of backward operations (``convolution_backward``
and the weight-gradient ``mm``).

``--verify`` captures each model at a tiny size (a few samples; the zoo's small options), asks OS-DPOS for
a plan over two CPU devices with its costs scaled so that splits pay, makes sure the plan splits a backward
operation (else splits one itself), and runs three training steps of it with the local executor against
eager PyTorch (:func:`placer.runtime.check.verify_plan`), as ``placer run ... --verify`` does.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import time

import numpy as np

from placer import load_cluster, place
from placer.errors import InfeasibleError

#: (zoo model, FastT's batch).
MODELS = [("vgg19", 64), ("resnet50", 32), ("inception_v3", 64)]
CLUSTERS = ["4xV100-nvlink", "2x4xV100"]
BACKWARD_OPS = ("aten.convolution_backward", "aten.mm")


def _split_kinds(plan, graph) -> tuple[int, int]:
    """(splits, splits of backward operations) of an OS-DPOS plan."""
    target = plan.rewritten_graph
    backward = 0
    for split in plan.splits:
        part = next((i for i, extra in enumerate(target.node_extra)
                     if extra.get("split_of") == split["node"] and "part" in extra), None)
        if part is not None and "join" in target.node_extra[part]:
            backward += 1
    return len(plan.splits), backward


def table(models: list[tuple[str, int]], clusters: list[str], time_limit: float) -> None:
    from placer.capture import capture_spec
    from placer.cost.analytic import annotate

    print(f"simulated step time in ms; OS-DPOS from the model's own graph, {time_limit:g} s search; "
          f"splits (of them backward)")
    print(f"{'model':>22} {'cluster':>14} {'ops':>6} {'dpos':>9} {'os_dpos':>9} {'splits':>7} {'gain':>7} "
          f"{'time (s)':>9}")
    gains = []
    for model, batch in models:
        began = time.perf_counter()
        graph = annotate(capture_spec(f"zoo:{model}", batch, optimizer="sgd", fake=True).graph)
        print(f"# captured {graph.name} in {time.perf_counter() - began:.0f} s", flush=True)
        for name in clusters:
            cluster = load_cluster(name)
            try:
                dpos = place(graph, cluster, "dpos")
                began = time.perf_counter()
                os_dpos = place(graph, cluster, "os_dpos", data_parallel_start=False, time_limit=time_limit)
                took = time.perf_counter() - began
            except InfeasibleError as exc:
                print(f"{graph.name:>22} {name:>14} infeasible: {exc}")
                continue
            a, b = dpos.predicted["makespan_s"], os_dpos.predicted["makespan_s"]
            gains.append(a / b)
            count, backward = _split_kinds(os_dpos, graph)
            print(f"{graph.name:>22} {name:>14} {graph.num_nodes:>6} {a * 1e3:>9.1f} {b * 1e3:>9.1f} "
                  f"{f'{count}({backward})':>7} {(1 - b / a) * 100:>+6.1f}% {took:>9.1f}", flush=True)
    if gains:
        geomean = math.exp(sum(math.log(g) for g in gains) / len(gains))
        print(f"geometric mean: OS-DPOS {(1 - 1 / geomean) * 100:.1f}% faster than DPOS "
              f"({geomean:.3f}x) over {len(gains)} cases")


#: Tiny captures for --verify: (zoo model, batch, zoo options).
TINY = [("vgg19", 2, {"width": 4, "image": 32, "classes": 10}),
        ("resnet50", 2, {"width": 4, "image": 32, "classes": 10}),
        ("inception_v3", 2, {"width": 2, "image": 75, "classes": 10})]


def verify(models: list[str]) -> bool:
    """Run OS-DPOS's split plans of tiny models with the local executor against eager training."""
    import torch

    from placer.algorithms.common import placement_units
    from placer.capture.spec import capture_spec, load_model
    from placer.plan import Plan
    from placer.runtime.check import verify_plan
    from placer.transform.split import split_dims, split_operation

    torch.set_num_threads(1)
    cluster = load_cluster("2xcpu")
    ok = True
    for model, batch, options in TINY:
        if model not in models:
            continue
        spec = f"zoo:{model}"
        captured = capture_spec(spec, batch, optimizer="sgd", **options)
        graph = captured.graph
        # Costs that make a backward operation's split pay on two devices: every op 1 ms per unit of work.
        plan = place(graph.replace(compute_s=np.where(np.isnan(graph.flops), 0, graph.flops) * 1e-9 + 1e-6),
                     cluster, "os_dpos", data_parallel_start=False, time_limit=20)
        target = plan.rewritten_graph
        splits = list(plan.splits)
        backward = [s for s in splits if graph.op[graph.index[s["node"]]] in BACKWARD_OPS] if splits else []
        if not backward:
            # OS-DPOS split no backward operation here: split the first of each kind along each dimension.
            target, splits = graph, []
            for op in BACKWARD_OPS:
                for dim in ("batch", "channel"):
                    node = next((graph.ids[i] for i in range(graph.num_nodes) if graph.op[i] == op
                                 and dim in split_dims(graph, i) and "join" in graph.splittable[i][0]), None)
                    if node is not None and node not in {s["node"] for s in splits}:
                        target = split_operation(target, node, dim, 2)
                        splits.append({"node": node, "dim": dim, "parts": 2})
            unit_of, units = placement_units(target)
            device_of = np.arange(len(units))[unit_of] % cluster.num_devices
            plan = Plan.from_arrays(graph, cluster, device_of, placed_graph=target, splits=splits)
        model_, inputs = load_model(spec, batch, **options)
        report = verify_plan(plan, captured, model_, inputs, steps=3)
        kinds = sorted({(graph.op[graph.index[s["node"]]].removeprefix("aten."), s["dim"]) for s in splits})
        print(f"{model}: {len(splits)} splits {kinds}: {report}", flush=True)
        ok &= report.ok
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(m for m, _ in MODELS))
    parser.add_argument("--clusters", default=",".join(CLUSTERS))
    parser.add_argument("--time-limit", type=float, default=60.0, help="OS-DPOS's search time per case")
    parser.add_argument("--verify", action="store_true", help="run tiny split plans against eager training")
    args = parser.parse_args()
    names = args.models.split(",")
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.verify:
        ok = verify(names)
    else:
        table([(m, b) for m, b in MODELS if m in names], args.clusters.split(","), args.time_limit)
        ok = True
    print(f"reproduce: ./run.sh bench bench/fastt.py {shlex.join(sys.argv[1:])}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
