"""Why do operations run slower in a placed step than profiled alone? Probes for a quiet many-core machine.

``--part load`` (the default), for each model of bench/fidelity.py: every node
timed alone (the profile the calibration takes), and again while ``K - 1``
other processes time the same step (a machine as loaded as ``K`` busy ranks),
free and pinned to cores of their own; then plans run with the distributed
executor, each rank's thread free to move between cores, then pinned to a
core of its own (pinned only where the machine has a core for each process
beside the parent's: one logical CPU per physical core); per run, what its operations took over what the alone profile
says, for those that read a tensor another rank sent and for the rest.

``--part drift``: rounds of (a profile alone, a one-rank run of the whole step),
each preceded by a gauge (:func:`gauge_s`, a fixed mix of one-thread work) in
the parent and in every rank: how far the same step's time moves between
rounds seconds apart, and whether the gauge follows it. Prints each round,
then a summary: per model the steps' spread around their median, and the mean
error of the one-rank step predicted by the round's profile, plain and scaled
by the gauges (the rank's before the run over the parent's before the profile).
``--replay LOG`` prints that summary again from such a run's printed rounds.

``--part ranks``: does a rank's core set its slowdown? The ranks of one run
compute at factors up to 1.95x apart over the profile. Each plan runs with
every rank gauging its core (:func:`gauge_s`) and saying which CPU and memory
node it is on before its first step; per rank, its operations' time over the
profile (:func:`fidelity.rank_slowdowns`) beside its gauge over the parent's
(taken before the profile). If the core's speed sets the factor, the two
agree.

``--part receive``: does an operation run slower on a tensor another process
sent? The fidelity records' operations that read a received tensor ran 15 to
21 us per message longer than profiled on 16-core H100 and H200 machines. Two
gloo processes as the runtime's ranks: rank 1 writes a tensor and sends it,
rank 0 receives it into a buffer posted before (as
:func:`placer.runtime.program.receive_buffer`) and times an element-wise
operation first after the receive and after another operation, on the received
tensor and on one its own thread wrote, and first after a receive it waited
for (its peer sending a millisecond late): whether it is the tensor's bytes or
the operation's place right after a message that costs, and whether the rank's
sleep in a wait adds to it; medians per size.

    PYTHONPATH=. python bench/op_slowdown.py [--part load|drift|ranks|receive] [--models resnet,vgg] [--rounds 6]
    PYTHONPATH=. python bench/op_slowdown.py --replay bench/data/op_slowdown-drift-h200.log
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from placer.harness.calibrate import compute_until

sys.path.insert(0, str(Path(__file__).parent))
from fidelity import Run, captured_model, rank_slowdowns  # noqa: E402


def physical_cores() -> list[int]:
    """One logical CPU per physical core this process may use (the first of each sibling set)."""
    allowed = sorted(os.sched_getaffinity(0))
    chosen, seen = [], set()
    for cpu in allowed:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        siblings = path.read_text().strip() if path.exists() else str(cpu)
        if siblings not in seen:
            seen.add(siblings)
            chosen.append(cpu)
    return chosen


def _profile(name: str, core: int | None, barrier, queue) -> None:
    from placer.harness.profiling import profile_module

    torch.set_num_threads(1)
    if core is not None:
        os.sched_setaffinity(0, {core})
    captured, flat = captured_model(name)
    barrier.wait()
    seconds = profile_module(
        captured.gm, [t.clone() for t in flat], repeats=5, warmup=1, node_ids=set(captured.graph.ids)
    )
    queue.put(seconds)


def concurrent_profiles(name: str, k: int, cores: list[int] | None) -> list[dict[str, float]]:
    """Every node's seconds in each of ``k`` processes profiling ``name`` at once (pinned to ``cores``)."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(k), ctx.Queue()
    procs = [
        ctx.Process(target=_profile, args=(name, None if cores is None else cores[i], barrier, queue)) for i in range(k)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]  # a process that died raises queue.Empty
    for p in procs:
        p.join()
    return results


class Pin:
    """A run's rank hook: pin each rank's thread to a core of its own."""

    def __init__(self, cores: list[int]):
        self.cores = cores

    def __call__(self, rank: int) -> None:
        os.sched_setaffinity(0, {self.cores[rank]})


def ratios(
    graph, plan, cluster, op_s: dict[str, float], op_message_s: dict[str, float], alone: dict[str, float]
) -> tuple[float, float]:
    """Sum of the run's own op times over the alone profile's, for ops over 20 us reading a remote input / not."""
    from placer.harness.feedback import own_times

    own = own_times(op_s, op_message_s)
    bound = plan.bind(graph, cluster)
    dev = bound.device_of
    remote = np.zeros(graph.num_nodes, bool)
    cross = dev[graph.src] != dev[graph.dst]
    remote[graph.dst[cross]] = True
    out = []
    for mask in (remote, ~remote):
        ids = [graph.ids[i] for i in np.flatnonzero(mask) if graph.ids[i] in own and alone.get(graph.ids[i], 0) > 20e-6]
        out.append(sum(own[i] for i in ids) / sum(alone[i] for i in ids) if ids else float("nan"))
    return out[0], out[1]


_GAUGE: dict = {}


def gauge_s() -> float:
    """Thread seconds of a fixed mix of one-thread work (a convolution, a matrix product, elementwise ops):
    the machine's speed now. The least of 7 tries, on tensors made once."""
    if not _GAUGE:
        g = torch.Generator().manual_seed(0)
        _GAUGE.update(
            x=torch.randn(16, 8, 32, 32, generator=g),
            w=torch.randn(8, 8, 3, 3, generator=g),
            a=torch.randn(256, 256, generator=g),
            b=torch.randn(256, 256, generator=g),
            c=torch.empty(256, 256),
            v=torch.randn(1 << 20, generator=g),
            u=torch.empty(1 << 20),
        )
    t = _GAUGE
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = []
    for _ in range(8):
        t0 = time.thread_time()
        for _ in range(4):
            torch.nn.functional.conv2d(t["x"], t["w"], padding=1)
            torch.mm(t["a"], t["b"], out=t["c"])
            torch.add(t["v"], 1.0, out=t["u"]).relu_()
        times.append(time.thread_time() - t0)
    torch.set_num_threads(threads)
    return min(times[1:])


class GaugeInRank:
    """A run's rank hook: gauge the rank's core before its first step, into ``folder/rank-N``; with ``where``,
    the CPU and memory node it ran the gauge on into ``folder/rank-N.where``."""

    def __init__(self, folder: str, where: bool = False):
        self.folder = folder
        self.where = where

    def __call__(self, rank: int) -> None:
        Path(self.folder, f"rank-{rank}").write_text(f"{gauge_s()!r}")
        if self.where:
            Path(self.folder, f"rank-{rank}.where").write_text(current_cpu_and_node())


def current_cpu_and_node() -> str:
    """``cpu C, node N`` this process last ran on (Linux /proc and /sys; ``?`` where they do not say)."""
    try:  # field 39 of /proc/self/stat, counted after the command's closing parenthesis
        cpu = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36]
    except (OSError, IndexError):
        return "cpu ?, node ?"
    nodes = [p.name[4:] for p in Path(f"/sys/devices/system/cpu/cpu{cpu}").glob("node[0-9]*")]
    return f"cpu {cpu}, node {nodes[0] if nodes else '?'}"


#: A round as :func:`drift` prints it, and its gauges (older logs have none).
ROUND = re.compile(
    r"(?P<model>\w+) round \d+: profile alone (?P<profile>[\d.]+) ms; one-rank run: "
    r"step (?P<step>[\d.]+) ms, its ops (?P<ops>[\d.]+) ms"
)
GAUGES = re.compile(r"before profile (?P<gauge_profile>[\d.]+) ms, before run (?P<gauge_run>[\d.]+) ms")
RANK_GAUGE = re.compile(r"gauge in rank 0: (?P<gauge_rank>[\d.]+) ms")


def drift(args) -> None:
    """Rounds of (profile alone, one-rank run of the whole step), with gauges: does the machine's speed move?"""
    from placer.algorithms import place
    from placer.cluster import load_cluster
    from placer.cost.profile import Profile, apply_profile
    from placer.harness.profiling import profile_module
    from placer.runtime.distributed import run_distributed

    torch.set_num_threads(1)
    cluster = load_cluster("2xcpu")
    lines = []
    for name in args.models.split(","):
        captured, flat = captured_model(name)
        graph = captured.graph
        for k in range(args.rounds):
            before = gauge_s()
            alone = profile_module(captured.gm, [t.clone() for t in flat], repeats=5, warmup=1, node_ids=set(graph.ids))
            total = sum(alone.values())
            plan = place(apply_profile(graph, Profile(graph.name, graph.digest(), "cpu", alone)), cluster, "single")
            between = gauge_s()
            # The rank that works (rank 0) gauges its core first (the rank hook), then runs.
            with tempfile.TemporaryDirectory() as folder:
                result = run_distributed(
                    captured.gm,
                    graph,
                    plan,
                    cluster,
                    flat,
                    steps=args.steps,
                    carrier=captured.carrier,
                    timeout_s=120,
                    hook=GaugeInRank(folder),
                )
                in_rank = float(Path(folder, "rank-0").read_text())
            own = sum(result.op_s.values())
            step = statistics.median(result.step_s[2:])
            line = (
                f"gauge in rank 0: {in_rank * 1e3:.2f} ms; gauge before profile {before * 1e3:.2f} ms, "
                f"before run {between * 1e3:.2f} ms, after {gauge_s() * 1e3:.2f} ms; "
                f"{name} round {k}: profile alone {total * 1e3:.2f} ms; "
                f"one-rank run: step {step * 1e3:.2f} ms, its ops {own * 1e3:.2f} ms "
                f"({own / total:.2f}x the profile), outside ops {(step - own) * 1e3:.2f} ms"
            )
            print(line, flush=True)
            lines.append(line)
    print()
    summarize(lines)


def summarize(lines: list[str]) -> None:
    """Per model, the one-rank steps' spread around their median; the error of each round's step predicted by
    its profile, plain and scaled by the gauges (rank 0's before the run over the parent's before the profile)."""
    rounds: dict[str, list[dict]] = {}
    for line in lines:
        found = ROUND.search(line)
        if found:
            values = {key: float(value) for key, value in found.groupdict().items() if key != "model"}
            for pattern in (GAUGES, RANK_GAUGE):
                gauge = pattern.search(line)
                values.update({key: float(value) for key, value in (gauge.groupdict() if gauge else {}).items()})
            rounds.setdefault(found["model"], []).append(values)
    deviations, plain, gauged, ratios = [], [], [], []
    for model, seen in rounds.items():
        steps = [r["step"] for r in seen]
        middle = statistics.median(steps)
        deviation = [abs(step - middle) / middle for step in steps]
        deviations += deviation
        ratios += [r["ops"] / r["profile"] for r in seen]
        plain += [abs(r["profile"] - r["step"]) / r["step"] for r in seen]
        with_gauges = [r for r in seen if "gauge_rank" in r and "gauge_profile" in r]
        gauged += [
            abs(r["profile"] * r["gauge_rank"] / r["gauge_profile"] - r["step"]) / r["step"] for r in with_gauges
        ]
        gauges = "".join(
            f"; gauge {where} {min(r[key] for r in with_gauges):.2f} to {max(r[key] for r in with_gauges):.2f} ms"
            for where, key in (("in the parent", "gauge_profile"), ("in the rank", "gauge_rank"))
            if with_gauges
        )
        print(
            f"{model}: {len(seen)} rounds, one-rank step {min(steps):.2f} to {max(steps):.2f} ms "
            f"({min(steps) / middle:.2f} to {max(steps) / middle:.2f}x the median {middle:.2f} ms, "
            f"mean |deviation| {statistics.mean(deviation):.1%}){gauges}"
        )
    if not plain:
        print("no rounds found")
        return
    print(
        f"over {len(plain)} rounds: the steps' mean |deviation| from their model's median "
        f"{statistics.mean(deviations):.1%}; the run's ops over the round's profile, median "
        f"{statistics.median(ratios):.2f} ({min(ratios):.2f} to {max(ratios):.2f}); mean |error| of the step "
        f"predicted by the round's profile {statistics.mean(plain):.1%}"
        + (f"; over the {len(gauged)} with gauges, scaled by them {statistics.mean(gauged):.1%}" if gauged else "")
    )


def load(args) -> None:
    """Profiles alone and under load, then runs free and pinned: what each run's operations took over the profile."""
    from placer.algorithms import place
    from placer.cluster import load_cluster
    from placer.cost.profile import Profile, apply_profile
    from placer.harness.calibrate import apply_calibration, calibrate
    from placer.runtime.distributed import run_distributed

    torch.set_num_threads(1)
    cores = physical_cores()
    print(
        f"{os.cpu_count()} logical CPUs, {len(cores)} physical cores allowed: {cores}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    calibration = calibrate("gloo", ranks=2)
    raw: dict = {}
    for name in args.models.split(","):
        began = time.perf_counter()
        captured, flat = captured_model(name)
        graph = captured.graph
        profiles = {"alone": concurrent_profiles(name, 1, None)[0]}
        for k in (2, 4):
            loaded = concurrent_profiles(name, k, None)
            profiles[f"{k} at once"] = {n: statistics.median(p[n] for p in loaded) for n in loaded[0]}
            if len(cores) > k:  # a core of its own for each, beside the parent's
                pinned = concurrent_profiles(name, k, cores[1 : k + 1])
                profiles[f"{k} at once, pinned"] = {n: statistics.median(p[n] for p in pinned) for n in pinned[0]}
        alone = profiles["alone"]
        total = sum(alone.values())
        print(
            f"{name}: {graph.num_nodes} nodes, profiled alone {total * 1e3:.2f} ms; "
            + ", ".join(f"{key} x{sum(p.values()) / total:.3f}" for key, p in profiles.items() if key != "alone"),
            flush=True,
        )
        graph = apply_profile(graph, Profile(graph.name, graph.digest(), "cpu", alone))
        raw[name] = {"profiles": profiles, "runs": []}
        for cluster_name in args.clusters.split(","):
            cluster = apply_calibration(load_cluster(cluster_name), calibration)
            for algorithm in args.plans.split(","):
                plan = place(graph, cluster, algorithm)
                for pin in (False, True)[: 1 + (len(cores) > cluster.num_devices)]:
                    result = run_distributed(
                        captured.gm,
                        graph,
                        plan,
                        cluster,
                        flat,
                        steps=args.steps,
                        carrier=captured.carrier,
                        timeout_s=120,
                        hook=Pin(cores[1:]) if pin else None,
                    )
                    step = statistics.median(result.step_s[2:])
                    remote, local = ratios(graph, plan, cluster, result.op_s, result.op_message_s, alone)
                    how = "pinned" if pin else "free  "
                    print(
                        f"  {cluster_name} {algorithm:11s} {how}: step {step * 1e3:8.2f} ms "
                        f"(predicted {plan.predicted['makespan_s'] * 1e3:8.2f}); own op time / alone profile: "
                        f"remote-input ops {remote:.2f}, others {local:.2f}",
                        flush=True,
                    )
                    raw[name]["runs"].append(
                        {
                            "cluster": cluster_name,
                            "plan": algorithm,
                            "pinned": pin,
                            "placement": plan.placement,
                            "step_s": result.step_s,
                            "op_s": result.op_s,
                            "op_message_s": result.op_message_s,
                        }
                    )
        print(f"  ({time.perf_counter() - began:.0f} s)", flush=True)
        if args.out:  # after every model, so that a run cut short keeps what it measured
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, "op_slowdown.json").write_text(json.dumps(raw))


def ranks(args) -> None:
    """Each plan run with every rank gauging its core first: its operations' slowdown beside its core's speed."""
    from placer.algorithms import place
    from placer.cluster import load_cluster
    from placer.cost.profile import Profile, apply_profile
    from placer.harness.profiling import profile_module
    from placer.runtime.distributed import run_distributed

    torch.set_num_threads(1)
    print(
        f"{os.cpu_count()} logical CPUs; parent on {current_cpu_and_node()}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    pairs = []  # (rank's gauge over the parent's, rank's slowdown factor)
    for name in args.models.split(","):
        captured, flat = captured_model(name)
        parent = gauge_s()
        alone = profile_module(
            captured.gm, [t.clone() for t in flat], repeats=5, warmup=1, node_ids=set(captured.graph.ids)
        )
        graph = apply_profile(captured.graph, Profile(captured.graph.name, captured.graph.digest(), "cpu", alone))
        for cluster_name in args.clusters.split(","):
            cluster = load_cluster(cluster_name)
            for algorithm in args.plans.split(","):
                plan = place(graph, cluster, algorithm)
                with tempfile.TemporaryDirectory() as folder:
                    result = run_distributed(
                        captured.gm,
                        graph,
                        plan,
                        cluster,
                        flat,
                        steps=args.steps,
                        carrier=captured.carrier,
                        timeout_s=120,
                        hook=GaugeInRank(folder, where=True),
                    )
                    gauges, where = {}, {}
                    for rank in range(cluster.num_devices):
                        gauges[rank] = float(Path(folder, f"rank-{rank}").read_text())
                        where[rank] = Path(folder, f"rank-{rank}.where").read_text()
                run = Run(
                    name,
                    cluster_name,
                    algorithm,
                    graph,
                    cluster,
                    plan,
                    result.step_s,
                    result.op_s,
                    result.transfer_s,
                    result.op_message_s,
                    result.message_s,
                )
                factors = rank_slowdowns(run)
                step = statistics.median(result.step_s[2:])
                print(
                    f"{name:12s}{cluster_name:6s}{algorithm:12s}step {step * 1e3:8.2f} ms; parent's gauge "
                    f"{parent * 1e3:.2f} ms; "
                    + "; ".join(
                        f"rank {rank} ({where[rank]}): gauge x{gauges[rank] / parent:.2f}, ops x{factor:.2f}"
                        for rank, factor in factors.items()
                    ),
                    flush=True,
                )
                pairs += [(gauges[rank] / parent, factor) for rank, factor in factors.items()]
    if len(pairs) > 2:
        gauge, factor = np.array(pairs).T
        print(
            f"over {len(pairs)} ranks: ops' factor {np.median(factor):.2f} (median), the core's gauge over the "
            f"parent's {np.median(gauge):.2f}; correlation {np.corrcoef(gauge, factor)[0, 1]:+.2f}; the factor "
            f"over the gauge's ratio {np.median(factor / gauge):.2f} (median), {np.min(factor / gauge):.2f} to "
            f"{np.max(factor / gauge):.2f}"
        )


RECEIVE_SIZES = (256, 4 << 10, 64 << 10, 1 << 20, 4 << 20)


def _receive_rank(rank: int, port: int, repeats: int, queue) -> None:
    """One process of :func:`receive`: rank 1 sends, rank 0 times an operation after receiving."""
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    clock = time.perf_counter

    def timed(tensor) -> float:
        began = clock()
        torch.add(tensor, 1.0)
        return clock() - began

    def compute_for(seconds: float, tensor) -> None:
        compute_until(clock() + seconds, lambda: torch.add(tensor, 1.0))

    rows = []
    for size in RECEIVE_SIZES:
        # Per repetition, in turn: the received tensor first after a receive that was there, the rank's
        # own first, the received one first after a receive it waited for (its peer sends a millisecond late).
        samples: list[list[float]] = [[], [], [], [], []]
        for rep in range(3 * repeats + 3):  # the first of each way warms up
            mode = rep % 3
            if rank == 1:
                sent = torch.empty(size // 4)
                sent.fill_(float(rep))
                dist.barrier()
                if mode == 2:
                    compute_for(1e-3, sent)
                dist.send(sent, dst=0)
                continue
            own = torch.empty(size // 4)
            own.fill_(float(rep))
            buf = torch.empty(size // 4)
            request = dist.irecv(buf, src=1)
            dist.barrier()
            if mode < 2:
                compute_for(300e-6, own)  # until the message is surely there
            request.wait()
            if rep < 3:
                continue
            if mode == 0:
                samples[0].append(timed(buf))
                samples[3].append(timed(own))
            elif mode == 1:
                samples[2].append(timed(own))
                samples[1].append(timed(buf))
            else:
                samples[4].append(timed(buf))
        if rank == 0:
            rows.append((size, *(statistics.median(column) for column in samples)))
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def receive(args) -> None:
    """``torch.add(x, 1.0)`` on rank 0 right after a receive and right after another operation, on the
    received tensor and on one its own thread wrote, per size (two gloo processes, one thread each)."""
    from placer.harness.calibrate import _free_port

    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_receive_rank, args=(rank, port, args.steps, queue)) for rank in (0, 1)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=300)
    for p in procs:
        p.join()
    print(
        f"{os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.1f}; torch.add(x, 1.0) on rank 0 "
        f"(us, median of {args.steps} each), x received or written by its own thread, first after a receive "
        "that was there or after another operation, and first after a receive it waited for:"
    )
    print(
        f"{'bytes':>9} {'received, first':>16} {'received, after op':>19} {'own, first':>11} "
        f"{'own, after op':>14} {'received, first after waiting':>30}"
    )
    for size, received_first, received_after, own_first, own_after, waited_first in rows:
        print(
            f"{size:9d} {received_first * 1e6:16.1f} {received_after * 1e6:19.1f} {own_first * 1e6:11.1f} "
            f"{own_after * 1e6:14.1f} {waited_first * 1e6:30.1f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet,vgg,inception,transformer,rnnlm")
    parser.add_argument("--clusters", default="2xcpu,4xcpu")
    parser.add_argument("--plans", default="single,expert,round_robin")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (--part receive: tensors per size)")
    parser.add_argument("--part", choices=("load", "drift", "ranks", "receive"), default="load")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per model (--part drift)")
    parser.add_argument("--out", default=None, help="folder for the raw times (JSON; --part load)")
    parser.add_argument("--replay", help="a --part drift run's printed output: its summary again")
    args = parser.parse_args()
    if args.replay:
        summarize(Path(args.replay).read_text().splitlines())
        return 0
    {"drift": drift, "ranks": ranks, "load": load, "receive": receive}[args.part](args)
    if args.part == "receive":
        print(f"reproduce: PYTHONPATH=. python bench/op_slowdown.py --part receive --steps {args.steps}")
        return 0
    print(
        f"reproduce: PYTHONPATH=. python bench/op_slowdown.py --part {args.part} --models {args.models} "
        + (f"--rounds {args.rounds}" if args.part == "drift" else f"--clusters {args.clusters} --plans {args.plans}")
        + f" --steps {args.steps}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
