"""What the list schedulers predict against what the reference model measures for their plans.

Issue 4 asks that a schedule HEFT, DPOS or m-ETF predict be what the simulator then measures for
their placement and order. Each scheduler builds one schedule (at the liveness ratio, as the
first of its memory retries) of a zoo model's captured step; this prints the makespan the schedule
predicts, the reference model's for its placement and per-device order, and the reference model's
for its placement under earliest-ready dispatch (no order: FORMATS.md, rule 2), which Baechi's
placers keep where it is faster (``plan_from_schedule(..., dispatch=True)``).

    ./run.sh bench bench/list_prediction.py [--cases resnet50/4xGPU-pcie,gnmt/4xGPU-pcie]

Zoo models are captured at their paper batch size (Adam) and cached with bench/quality.py's cache.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from placer import load_cluster
from placer.algorithms.baechi import etf_schedule
from placer.algorithms.common import liveness_ratio
from placer.algorithms.fastt import dpos_schedule
from placer.algorithms.heft import heft_schedule
from placer.errors import InfeasibleError
from placer.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph  # noqa: E402  (the zoo capture cache of bench/quality.py)

SCHEDULERS = {"heft": heft_schedule, "dpos": dpos_schedule, "m_etf": etf_schedule}
CASES = ("resnet50/4xV100-nvlink,resnet50/4xGPU-pcie,inception_v3/4xV100-nvlink,gnmt/4xGPU-pcie,"
         "gnmt/8xV100-nvlink,transformer/4xGPU-pcie,bert_large/8xH100-nvswitch,rnnlm/2x4xV100")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=CASES, help="comma-separated model/cluster pairs")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}")
    print("per scheduler: predicted / simulated with its order / simulated with earliest-ready dispatch, in ms "
          "('!' where that plan does not fit memory)")
    print(f"{'case':>36} " + " ".join(f"{name:>26}" for name in SCHEDULERS) + "   wall s")
    errors: dict[str, list[float]] = {name: [] for name in SCHEDULERS}   # |predicted / simulated - 1|
    for case in args.cases.split(","):
        model, cluster_name = case.split("/")
        graph, cluster = captured_graph(model, None, Path(args.cache)), load_cluster(cluster_name)
        ratio = liveness_ratio(graph, cluster)
        began, cells = time.perf_counter(), []
        for name, schedule in SCHEDULERS.items():
            try:
                sched = schedule(graph, cluster, ratio)
            except InfeasibleError:
                cells.append("infeasible")
                continue
            ordered = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
            dispatched = simulate(graph, cluster, sched.device_of, check=False)
            errors[name].append(abs(sched.finish.max() / ordered.makespan_s - 1))
            cells.append(f"{sched.finish.max() * 1e3:.1f} / {ordered.makespan_s * 1e3:.1f}{'' if ordered.fits else '!'}"
                         f" / {dispatched.makespan_s * 1e3:.1f}{'' if dispatched.fits else '!'}")
        print(f"{graph.name + '/' + cluster.name:>36} " + " ".join(f"{c:>26}" for c in cells)
              + f"   {time.perf_counter() - began:.1f}", flush=True)
    print("mean |predicted / simulated with its order - 1|: " + ", ".join(
        f"{name} {100 * sum(e) / len(e):.1f}% over {len(e)}" for name, e in errors.items() if e))
    print(f"reproduce: ./run.sh bench bench/list_prediction.py --cases {args.cases}")


if __name__ == "__main__":
    main()
