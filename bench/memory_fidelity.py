"""Memory fidelity: the reference model's peak memory per device against what the runtime holds.

For each zoo model and algorithm, the plan's simulated peak on every device
(FORMATS.md, rule 6) beside the most tensor storage the local executor held
on that device after any operation of one step
(``LocalExecutor(track_memory=True)``: inputs, parameters, optimizer state,
outputs and received copies, each storage once; every plan device is the
CPU, and a transfer is a real copy). The executor frees a value after its
last reader, as the reference model does, so the two differ where the graph
misstates what an operation holds or for how long.

    ./run.sh bench bench/memory_fidelity.py [--models lenet,alexnet,transformer,resnet50,rnnlm]
                                            [--batch 32] [--algorithms single,expert,m_etf,metis]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from placer import load_cluster, place
from placer.api import validate
from placer.capture import capture_spec
from placer.runtime.local import LocalExecutor
from placer.runtime.program import compile_program

#: A device holding less than this share of the case's largest peak is left out of the mean error.
SMALL_SHARE = 0.1
#: A device counts as under-counted where the model says less than this share of what it holds
#: (single-device peaks differ by tens of bytes, which is no finding).
UNDER = 0.999


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="lenet,alexnet,transformer,resnet50,rnnlm")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--algorithms", default="single,expert,m_etf,metis")
    parser.add_argument("--cluster", default="2xcpu")
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    print(f"python {platform.python_version()}, {platform.machine()}; cluster {cluster.name}, batch {args.batch}")
    print("per device: simulated peak / executor's peak, MiB (ratio)")
    ratios: dict[str, list[float]] = {}
    for model in args.models.split(","):
        began = time.perf_counter()
        captured = capture_spec(f"zoo:{model}", args.batch)
        for name in args.algorithms.split(","):
            plan = place(captured.graph, cluster, name, time_limit=20)
            simulated = validate(plan, captured.graph, cluster).peak_memory_bytes
            program = compile_program(captured.gm, captured.graph, plan, cluster, carrier=captured.carrier)
            executor = LocalExecutor(program, track_memory=True)
            executor.run(captured.example_args())
            held = executor.peak_bytes
            cells = []
            for sim_b, held_b in zip(simulated.tolist(), held.tolist()):
                ratio = sim_b / held_b if held_b else float("nan")
                cells.append(f"{sim_b / 2**20:9.1f} / {held_b / 2**20:9.1f} ({ratio:.3f})")
                if held_b >= SMALL_SHARE * held.max():
                    ratios.setdefault(name, []).append(ratio)
            print(f"{model:>12} {name:>8}  " + "  ".join(cells), flush=True)
        print(f"{'':>12} ({time.perf_counter() - began:.0f} s)", flush=True)
    every = [r for rs in ratios.values() for r in rs]
    for name, rs in ratios.items():
        print(
            f"{name}: mean |simulated / held - 1| {np.mean(np.abs(np.array(rs) - 1)) * 100:.1f}% over {len(rs)} "
            f"devices (under by over 0.1%: {sum(r < UNDER for r in rs)}, lowest ratio {min(rs):.3f})"
        )
    print(
        f"all: mean |simulated / held - 1| {np.mean(np.abs(np.array(every) - 1)) * 100:.1f}% over {len(every)} devices"
    )
    print(
        f"reproduce: ./run.sh bench bench/memory_fidelity.py --models {args.models} --batch {args.batch} "
        f"--algorithms {args.algorithms} --cluster {args.cluster}"
    )


if __name__ == "__main__":
    main()
