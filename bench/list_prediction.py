"""What the list schedulers predict against what the reference model measures for their plans.

Issue 4 asks that a schedule HEFT, DPOS or m-ETF predict be what the simulator then measures for
their placement and order. Each scheduler builds one schedule (at the liveness ratio, as the
first of its memory retries) of a zoo model's captured step, then builds it again told the
transfers the simulation of the last one ran, while that shortens the step (``refined_schedule``,
as the memory retries do; for m-ETF, the step of its plan, which takes earliest-ready dispatch
where faster). Per scheduler this prints the first schedule's predicted makespan and
the reference model's for its placement and per-device order, then the same two for the schedule
kept, and the reference model's for that placement under earliest-ready dispatch (no order:
FORMATS.md, rule 2), which Baechi's placers keep where it is faster
(``plan_from_schedule(..., dispatch=True)``).

    ./run.sh bench bench/list_prediction.py [--cases resnet50/4xGPU-pcie,gnmt/4xGPU-pcie] [--coplace] [--why]

``--why`` also prints, per schedule, where its bookings part from the transfers its simulation
ran: how many ran earlier than booked (and their channel time; how many of them from sources,
nodes without inputs), how many later, and how many bookings ran nowhere (sent ahead to a device
where no consumer then went).

Zoo models are captured at their paper batch size (Adam) and cached with bench/quality.py's cache.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from placer import load_cluster
from placer.algorithms.baechi import etf_schedule
from placer.algorithms.common import liveness_ratio
from placer.algorithms.fastt import dpos_schedule
from placer.algorithms.heft import heft_schedule
from placer.algorithms.list_scheduling import refined_schedule
from placer.errors import InfeasibleError
from placer.sim import simulate
from placer.transform.colocate import colocate_sole_consumers

sys.path.insert(0, str(Path(__file__).parent))
from quality import captured_graph  # noqa: E402  (the zoo capture cache of bench/quality.py)

SCHEDULERS = {"heft": heft_schedule, "dpos": dpos_schedule, "m_etf": etf_schedule}
#: Those whose plans take earliest-ready dispatch where faster, so whose refinement compares by that.
DISPATCHING = {"m_etf"}
CASES = (
    "resnet50/4xV100-nvlink,resnet50/4xGPU-pcie,inception_v3/4xV100-nvlink,gnmt/4xGPU-pcie,"
    "gnmt/8xV100-nvlink,transformer/4xGPU-pcie,bert_large/8xH100-nvswitch,rnnlm/2x4xV100"
)


def where_they_part(graph, sched) -> str:
    """``sched``'s booked transfers (:attr:`Schedule.transfers`) against those of its simulation."""
    sent = sched.simulated.transfers
    ran = {key: (float(sent.start[x]), float(sent.end[x])) for key, x in sent.rows().items()}
    source = np.bincount(graph.dst, minlength=graph.num_nodes) == 0
    early = [key for key, (_, start, _) in sched.transfers.items() if key in ran and ran[key][0] < start - 1e-12]
    late = sum(1 for key, (_, start, _) in sched.transfers.items() if key in ran and ran[key][0] > start + 1e-12)
    unused = [key for key in sched.transfers if key not in ran]
    early_ms = 1e3 * sum(ran[key][1] - ran[key][0] for key in early)
    unused_ms = 1e3 * sum(sched.transfers[key][2] - sched.transfers[key][1] for key in unused)
    return (
        f"{len(sched.transfers)} booked: {len(early)} ran earlier ({early_ms:.1f} ms of channel time, "
        f"{sum(source[key[0]] for key in early)} from sources), {late} later, {len(unused)} ran nowhere "
        f"({unused_ms:.1f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=CASES, help="comma-separated model/cluster pairs")
    parser.add_argument("--cache", default="bench/.cache", help="folder for captured graphs")
    parser.add_argument(
        "--coplace",
        action="store_true",
        help="schedule with Baechi's co-placement (each operation with its only reader)",
    )
    parser.add_argument(
        "--why",
        action="store_true",
        help="also print where each schedule's bookings part from its simulation's transfers",
    )
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}")
    print(
        "per scheduler: the first schedule's predicted / simulated step, then the kept schedule's predicted / "
        "simulated / simulated with earliest-ready dispatch, in ms ('!' where that plan does not fit memory)"
    )
    print(f"{'case':>36} " + " ".join(f"{name:>34}" for name in SCHEDULERS) + "   wall s")
    errors: dict[str, dict[str, list[float]]] = {"first": {}, "kept": {}}  # |predicted / simulated - 1|
    for case in args.cases.split(","):
        model, cluster_name = case.split("/")
        graph, cluster = captured_graph(model, None, Path(args.cache)), load_cluster(cluster_name)
        if args.coplace:
            graph = colocate_sole_consumers(graph) or graph
        ratio, scale = liveness_ratio(graph, cluster), np.ones(cluster.num_devices)
        began, cells, whys = time.perf_counter(), [], []
        for name, schedule in SCHEDULERS.items():

            def build(g, ratio, scale, sends=None):
                return schedule(g, cluster, ratio, capacity_scale=scale, sends=sends)

            try:
                first = build(graph, ratio, scale)
            except InfeasibleError:
                cells.append("infeasible")
                continue
            first.simulated = simulate(graph, cluster, first.device_of, first.orders, check=False)
            kept = (
                refined_schedule(build, graph, cluster, first, ratio, scale, dispatch=name in DISPATCHING)
                if first.simulated.fits
                else first
            )
            dispatched = simulate(graph, cluster, kept.device_of, check=False)
            cell = []
            for which, sched in (("first", first), ("kept", kept)):
                errors[which].setdefault(name, []).append(abs(sched.makespan_s / sched.simulated.makespan_s - 1))
                cell.append(
                    f"{sched.makespan_s * 1e3:.1f} / {sched.simulated.makespan_s * 1e3:.1f}"
                    f"{'' if sched.simulated.fits else '!'}"
                )
            cells.append(f"{cell[0]} -> {cell[1]} / {dispatched.makespan_s * 1e3:.1f}{'' if dispatched.fits else '!'}")
            whys += [
                f"    {name} {which}: {where_they_part(graph, sched)}"
                for which, sched in (("first", first), ("kept", kept))
                if args.why
            ]
        print(
            f"{graph.name + '/' + cluster.name:>36} "
            + " ".join(f"{c:>34}" for c in cells)
            + f"   {time.perf_counter() - began:.1f}",
            flush=True,
        )
        for line in whys:
            print(line)
    for which, per_scheduler in errors.items():
        print(
            f"mean |predicted / simulated with its order - 1|, {which} schedule: "
            + ", ".join(f"{name} {100 * sum(e) / len(e):.1f}% over {len(e)}" for name, e in per_scheduler.items())
        )
    print(
        f"reproduce: ./run.sh bench bench/list_prediction.py --cases {args.cases}"
        + (" --coplace" if args.coplace else "")
        + (" --why" if args.why else "")
    )


if __name__ == "__main__":
    main()
