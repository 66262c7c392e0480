"""Commands of placer.cost: ``profile``, ``calibrate``, ``cost`` and ``predict``."""

from __future__ import annotations

import argparse
import math
import re
import sys
from fractions import Fraction
from typing import TYPE_CHECKING

from ..cluster import load_cluster
from ..cost.analytic import DEVICE_SPECS, PRESET_REFERENCE, annotate
from ..cost.profile import apply_profile, device_kind_of, fixed_part, load_profile
from ..errors import OptionError
from ..graph import OpGraph
from ..harness.calibrate import DEFAULT_SIZES, apply_calibration, calibrate
from ..harness.contention import measure_contention, under_contention
from ..harness.profiling import profile_spec
from ..harness.standard_eval import standard_evaluation
from ..io import check_output
from ..report.tables import print_rows, working
from ..show import terminal
from ..terminate import terminate_raises
from .capture import add_optimizer_option, add_optimizer_settings, optimizer_settings

if TYPE_CHECKING:
    from ..cost.profile import Profile
    from ..graph import OpGraph

__all__ = ["add_commands"]


# A number (decimal or exponent form), then an optional K/M/G with KiB/KB spellings, then an optional B.
_SIZE = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:E[+-]?\d+)?)\s*(?:([KMG])I?)?B?")
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    """``"4096"``, ``"64K"``, ``"1.5K"``, ``"1M"``, ``"1GiB"`` (binary multiples) -> bytes.

    The value is read exactly (1.5K is 1536 bytes): a size that is not a whole number of
    bytes (``"1.5"``, ``"0.3K"``) is refused rather than truncated, and so is one below
    the 4 bytes (one float32) of the smallest transfer either backend times.
    """
    found = _SIZE.fullmatch(text.strip().upper())
    if found is None:
        raise OptionError(
            f"option '--sizes' expects sizes in bytes like 4096, 64K, 1.5M or 1G (K = 1024), got {text!r}"
        )
    number, unit = found.groups()
    size = Fraction(number) * _SIZE_UNITS[unit or ""]
    if size.denominator != 1:
        raise OptionError(f"option '--sizes': {text!r} is {float(size)} bytes, not a whole number of bytes")
    if size < 4:
        raise OptionError(f"option '--sizes': sizes must be at least 4 bytes (one float32), got {text!r}")
    return int(size)


def _ints(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"option '{option}' expects comma-separated integers, got {text!r}") from None


def _positive(value: int | None, option: str) -> None:
    if value is not None and value < 1:
        raise OptionError(f"option '{option}' must be >= 1, got {value}")


def cmd_profile(args: argparse.Namespace) -> int:

    _positive(args.batch, "--batch")
    _positive(args.repeats, "--repeats")
    _positive(args.ranks, "--ranks")
    if args.small_batch is not None and not 1 <= args.small_batch < args.batch:
        raise OptionError(
            f"option '--small-batch' must be >= 1 and below --batch ({args.batch}), got {args.small_batch}"
        )
    device_kind_of(args.device)  # refuse a bad device before capturing
    if args.ranks > 1 and device_kind_of(args.device)[0] != "cpu":
        raise OptionError("--ranks is for --device cpu (ranks of a process-per-device run share this machine's CPUs)")
    settings = optimizer_settings(args)
    check_output(args.output, "profile file", inputs=[args.spec])
    if args.graph_output:
        check_output(args.graph_output, "graph file", inputs=[args.spec])

    def timed(batch: int):
        """The step captured at ``batch`` samples, and its profile."""
        return profile_spec(
            args.spec,
            batch,
            optimizer=args.optimizer,
            lr=args.lr,
            settings=settings,
            device=args.device,
            repeats=args.repeats,
            gpu_timing=args.gpu_timing,
        )

    with working(
        f"capturing {args.spec} at batch {args.batch}, then timing every operation on {args.device} "
        f"({args.repeats} runs each) ...",
        measuring=True,
    ):
        step, profile = timed(args.batch)
    if args.small_batch is not None:
        with working(f"timing every operation at batch {args.small_batch} too ...", measuring=True):
            _, small = timed(args.small_batch)
        profile = fixed_part(profile, small, args.batch, args.small_batch)
        share = sum(profile.fixed_seconds.values()) / max(profile.total_s, 1e-30)
        print(
            f"{share:.0%} of the operations' time at batch {args.batch} is fixed (what batch {args.small_batch} "
            f"does not shrink): a micro-batch, a replica or a split part pays it whole"
        )
    if args.ranks > 1:
        with working(
            f"training {args.spec} eagerly in one process, then in {args.ranks} at once, to time their contention ...",
            measuring=True,
        ):
            contention = measure_contention(
                args.spec, args.batch, args.ranks, optimizer=args.optimizer, lr=args.lr, settings=settings
            )
        profile = under_contention(profile, contention)
        print(
            f"{args.ranks} processes at once take {contention.slowdown:.2f}x as long for a step as one alone "
            f"({contention.together_s * 1e3:.1f} against {contention.alone_s * 1e3:.1f} ms): every operation's "
            f"time is scaled by it"
        )
    profile.save(args.output)
    line = (
        f"{terminal(step.graph.name)}: {len(profile.node_seconds)} nodes timed on "
        f"{terminal(profile.meta['device_name'])} ({terminal(profile.device_kind)}), sum {profile.total_s * 1e3:.3f} ms"
    )
    if profile.device_kind in DEVICE_SPECS:
        predicted = annotate(step.graph, reference=profile.device_kind, kinds=()).compute_s.sum()
        line += f"; analytic model {predicted * 1e3:.3f} ms"
    print(f"{line} -> {args.output}")
    if args.graph_output:
        apply_profile(step.graph, profile).save(args.graph_output)
        print(f"graph with compute_s_by_kind[{profile.device_kind!r}] -> {args.graph_output}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:

    sizes = [_size(s) for s in args.sizes.split(",")] if args.sizes else list(DEFAULT_SIZES)
    if len(set(sizes)) < 2:
        raise OptionError(f"option '--sizes' needs two sizes or more to fit latency and bandwidth, got {args.sizes!r}")
    if args.backend == "gloo" and args.ranks < 2:
        raise OptionError(f"option '--ranks' must be >= 2 to measure transfers between processes, got {args.ranks}")
    if args.cluster_output and not args.cluster:
        raise OptionError("option '--cluster-output' needs '--cluster' (the preset or file to calibrate)")
    _positive(args.repeats, "--repeats")
    if not args.timeout > 0:
        raise OptionError(f"option '--timeout' must be > 0, got {args.timeout}")
    check_output(args.output, "calibration file", inputs=[args.cluster])
    if args.cluster_output:
        check_output(args.cluster_output, "cluster file", inputs=[args.cluster])
    cluster = link_map = None
    if args.cluster:  # checked before the seconds of measuring
        if not args.cluster_output:
            raise OptionError("option '--cluster' needs '--cluster-output' (where to write the calibrated cluster)")
        cluster = load_cluster(args.cluster)
        bad = [pair for pair in args.link if pair.count("=") != 1 or "" in pair.split("=")]
        if bad:
            raise OptionError(f"--link {bad[0]!r}: give CHANNEL_LINK=MEASURED_LINK, e.g. --link nvlink2=gloo")
        link_map = dict(pair.split("=", 1) for pair in args.link) if args.link else None
        links = {(link_map or {}).get(ch.extra.get("link"), ch.extra.get("link")) for ch in cluster.channels}
        if args.backend == "gloo" and "gloo" not in links:
            raise OptionError(
                f"no channel of cluster {cluster.name!r} has the link 'gloo' that --backend gloo "
                f"measures (its links: {sorted(map(str, links))}); map one with --link LINK=gloo"
            )
    processes = f", {args.ranks} processes" if args.backend == "gloo" else ""
    processes += ", then a probe run" if args.probe else ""
    stopped = "placer: terminated: the calibration's processes were stopped and nothing was written"
    with terminate_raises(stopped), working(f"timing transfers ({args.backend}{processes}) ...", measuring=True):
        cal = calibrate(
            args.backend, ranks=args.ranks, sizes=sizes, repeats=args.repeats, timeout_s=args.timeout, probe=args.probe
        )
    cal.save(args.output)
    rows = [
        [name, f"{f.latency_s * 1e6:.1f}", f"{f.bandwidth_bytes_per_s / 1e9:.3f}", f"{f.r2:.4f}", str(len(f.samples))]
        for name, f in cal.links.items()
    ]
    print_rows(
        ["link", "latency us", "bandwidth GB/s", "R^2", "points"],
        rows,
        title=f"latency + bytes / bandwidth fits ({args.backend})",
    )
    for name, f in cal.links.items():
        print_rows(
            ["bytes", "measured us", "fit us"],
            [[str(b), f"{t * 1e6:.1f}", f"{float(f.predict(b)) * 1e6:.1f}"] for b, t in f.samples],
            title=f"{name} points",
        )
        if f.r2 < POOR_FIT_R2:
            print(
                f"placer: warning: the {name} fit explains little of its points (R^2 {f.r2:.2f} < "
                f"{POOR_FIT_R2}): a busy machine or sizes too close together; calibrate again (a wider "
                f"--sizes, more --repeats) before planning with it",
                file=sys.stderr,
            )
    if cal.message_cost is not None:
        cost = cal.message_cost
        probe = cal.meta.get("probe")
        fitted = " (fitted to the probe run; the table: messages timed alone)" if probe else ""
        print_rows(
            ["bytes", "sending us", "receiving us"],
            [[str(b), f"{sent * 1e6:.1f}", f"{received * 1e6:.1f}"] for _, _, b, sent, received in cal.message_samples],
            title=f"a message's host cost{fitted}: sending {cost.send_fixed_s * 1e6:.1f} us + "
            f"{cost.send_per_byte_s * 1e12:.0f} ps/B, receiving {cost.receive_fixed_s * 1e6:.1f} us + "
            f"{cost.receive_per_byte_s * 1e12:.0f} ps/B",
        )
        if cost.by_gap:
            print_rows(
                ["computing between messages us", "sending us", "receiving us"],
                [
                    [f"{gap * 1e6:.0f}", f"{sent * 1e6:.1f}", f"{received * 1e6:.1f}"]
                    for gap, sent, received in cost.by_gap
                ],
                title="a message's fixed host cost in a stream of them"
                + (" (the streams' shape, scaled to the probe run)" if probe else ""),
            )
        if probe:
            print(
                f"a message's host cost fitted to {probe['messages']} messages of a probe run ({probe['model']}, "
                f"batch {probe['batch']}, round robin over 2 ranks, {probe['steps']} steps), shaped over the gaps "
                "as the streams (the table above); the streams' own cost is kept in the file (stream_message_cost)"
            )
        print(
            f"an operation right after a message, against one after another operation: "
            f"{cost.after_send_s * 1e6:.1f} us longer after sending, {cost.after_receive_s * 1e6:.1f} us after "
            f"receiving, {cost.after_wait_s * 1e6:.1f} us after waiting to receive (charged to the nodes that "
            "send and receive" + ("; fitted to the probe run's operations against their profile)" if probe else ")")
        )
    if cal.loaded_latency_s is not None:
        print(
            f"a message waited for while the ranks compute arrives {cal.loaded_latency_s * 1e6:.1f} us after its "
            f"send, beyond its bytes' time (the mean of {cal.meta.get('loaded_messages', 0)}; the calibrated "
            f"{args.backend} channels take it as their latency, in place of the fit's)"
        )
    if cal.barrier_s is not None:
        print(
            f"the last of {args.ranks} ranks to reach a barrier spends {cal.barrier_s * 1e6:.1f} us in it "
            f"(how a step of the process-per-device runtime ends)"
        )
    if cal.collectives:
        print_rows(
            ["collective", "latency us", "bandwidth GB/s", "R^2", "16 MiB ms"],
            [
                [
                    kind,
                    f"{f.latency_s * 1e6:.1f}",
                    f"{f.bandwidth_bytes_per_s / 1e9:.3f}",
                    f"{f.r2:.4f}",
                    f"{float(f.predict(16 << 20)) * 1e3:.2f}",
                ]
                for kind, f in cal.collectives.items()
            ],
            title=f"torch.distributed's collectives on {args.ranks} ranks, against a bucket's bytes",
        )
    print(f"calibration -> {args.output}")
    if cluster is not None:
        apply_calibration(cluster, cal, link_map).save(args.cluster_output)
        print(f"calibrated cluster -> {args.cluster_output}")
    return 0


def _replaced_times(
    before: OpGraph, after: OpGraph, profiles: list[Profile]
) -> dict[str, list[tuple[str, float, float]]]:
    """Kind -> (node, old seconds, new seconds) of each ``compute_s_by_kind`` entry of ``before``
    that ``after`` changes and no profile of ``profiles`` re-measures.

    The analytic model writes the same value again over one of its own times (a captured
    graph's), so a value it changes came from elsewhere: a profile (``placer profile
    --graph-output``), a prediction from measured times, or another tool, which FORMATS.md
    calls measured.
    """
    remeasured = {(p.device_kind, node) for p in profiles for node in p.node_seconds}
    replaced: dict[str, list[tuple[str, float, float]]] = {}
    for node, old, new in zip(before.ids, before.compute_s_by_kind, after.compute_s_by_kind):
        for kind, seconds in (old or {}).items():
            now = (new or {}).get(kind, seconds)
            if not math.isclose(now, seconds, rel_tol=1e-9, abs_tol=1e-15) and (kind, node) not in remeasured:
                replaced.setdefault(kind, []).append((node, seconds, now))
    return replaced


#: A link fit with a smaller R^2 than this is flagged: its points hardly follow latency + bytes / bandwidth.
POOR_FIT_R2 = 0.9


def cmd_cost(args: argparse.Namespace) -> int:

    check_output(args.output, "graph file", inputs=[args.graph, *args.profile])
    original = OpGraph.load(args.graph)
    profiles = [load_profile(path, original) for path in args.profile]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds is not None else None
    graph = annotate(original, reference=args.reference, kinds=kinds)
    for profile in profiles:
        graph = apply_profile(graph, profile)
    replaced = _replaced_times(original, graph, profiles)
    if replaced and not args.overwrite_measured:
        counts = "; ".join(
            f"{len(times)} for kind {kind!r} (node {times[0][0]!r}: {times[0][1]:.4g} s -> {times[0][2]:.4g} s)"
            for kind, times in replaced.items()
        )
        raise OptionError(
            f"graph file {args.graph} has measured times that the analytic model would replace: "
            f"{counts}. Give --kinds without {', '.join(map(repr, replaced))} to keep them, or "
            f"--overwrite-measured to replace them"
        )
    for kind, times in replaced.items():
        print(
            f"{args.graph}: replaced {len(times)} measured times for kind {kind!r} by the analytic model's "
            f"(--overwrite-measured)"
        )
    for profile in profiles:
        print(f"{profile.source}: {len(profile.node_seconds)} measured times for kind {profile.device_kind!r}")
    graph.save(args.output)
    measured = next((p for p in profiles if p.device_kind == args.reference), None)
    on_reference = (
        ""
        if measured is None
        else f"; measured {sum(measured.node_seconds.values()) * 1e3:.3f} ms, which its devices take"
    )
    print(
        f"{terminal(graph.name)}: {graph.num_nodes} nodes, {graph.compute_s.sum() * 1e3:.3f} ms on {args.reference} "
        f"(analytic{on_reference}) -> {args.output}"
    )
    costed = {kind for times in graph.compute_s_by_kind if times for kind in times} | {args.reference}
    if PRESET_REFERENCE not in costed:
        print(
            f"placer: note: compute_s holds {args.reference} times now, and {PRESET_REFERENCE} has no times of "
            f"its own in {args.output}: the presets' {PRESET_REFERENCE}s (speed 1.0) run at the "
            f"{args.reference} times; add {PRESET_REFERENCE} to --kinds",
            file=sys.stderr,
        )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:

    batches = _ints(args.batches, "--batches")
    if len(set(batches)) < 2:  # before the captures
        raise OptionError(f"option '--batches' needs at least two distinct batch sizes, got {args.batches!r}")
    _positive(args.target, "--target")
    _positive(args.repeats, "--repeats")
    settings = optimizer_settings(args)
    check_output(args.output, "graph file", inputs=[args.spec])
    device = None if args.device == "none" else args.device
    if device is not None:
        device_kind_of(device)  # a bad device is refused before the captures
    # With a device it times every operation at each batch.
    timing = (
        f", timing every operation on {device} (minutes for a large model; --device none fits the analytic times)"
        if device is not None
        else ""
    )
    with working(
        f"capturing {args.spec} at batches {', '.join(map(str, batches))}{timing} and fitting each node's costs ...",
        measuring=device is not None,
    ):
        model = standard_evaluation(
            args.spec,
            batches,
            optimizer=args.optimizer,
            lr=args.lr,
            settings=settings,
            device=device,
            repeats=args.repeats,
        )
    graph = model.predict(args.target)
    graph.save(args.output)
    kind = model.time_kind
    seconds = sum(d[kind] for d in graph.compute_s_by_kind) if kind else float(graph.compute_s.sum())
    print(
        f"{terminal(graph.name)}: fitted at batches {model.batches} (nodes matched by {model.matched_by}); "
        f"predicted step {seconds * 1e3:.3f} ms ({kind or 'compute_s'}, one device), "
        f"{graph.output_bytes.sum() / 2**20:.1f} MiB of outputs, {graph.param_bytes.sum() / 2**20:.1f} MiB resident "
        f"-> {args.output}"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``profile``, ``calibrate``, ``cost`` and ``predict`` to the ``placer`` command."""
    p = sub.add_parser("profile", help="time every node of a model's training step on this machine's device")
    p.add_argument("spec", help="zoo:NAME or path/file.py:FACTORY")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    add_optimizer_option(p, lr=True)
    add_optimizer_settings(p)
    p.add_argument("--repeats", type=int, default=5, help="timed runs per node; the median is kept")
    p.add_argument(
        "--small-batch",
        type=int,
        help="also time every operation at this smaller batch and record, per operation, the part of its time "
        "that the rows do not shrink (a micro-batch, a replica or a split part pays it whole)",
    )
    p.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="CPU: the processes of a process-per-device run that will share this machine; each operation's "
        "time is scaled by how much slower a step runs in that many processes at once (default 1: alone)",
    )
    p.add_argument(
        "--gpu-timing",
        choices=("kernel", "wall"),
        default="kernel",
        help="on a GPU: sum of each node's kernel times (default) or synchronised wall time",
    )
    p.add_argument("--output", "-o", required=True, help="placer.profile/1 file to write")
    p.add_argument("--graph-output", help="also write the graph with the measured times")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("calibrate", help="measure transfers and fit latency + bytes/bandwidth per link")
    p.add_argument("--backend", choices=("gloo", "cuda"), default="gloo")
    p.add_argument("--ranks", type=int, default=2, help="processes for gloo (default 2)")
    p.add_argument(
        "--sizes",
        help="comma-separated transfer sizes in bytes, K/M/G binary multiples read exactly "
        "(1.5K = 1536; a size that is not whole bytes is refused; default 1K to 64M by 4x)",
    )
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the processes are killed")
    p.add_argument("--output", "-o", required=True, help="placer.calibration/1 file to write")
    p.add_argument("--cluster", help="preset or cluster file to calibrate")
    p.add_argument("--cluster-output", help="where to write the calibrated cluster")
    p.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="CHANNEL_LINK=MEASURED_LINK",
        help="apply a measured link to channels of another link type; repeatable",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="gloo: take a message's host cost, and what the operation after it loses, from a probe run "
        "(a small ResNet placed round robin over 2 ranks), as plans' runs pay them, instead of from "
        "streams of one message at a time",
    )
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser(
        "cost",
        help="cost a graph: analytic roofline per device kind, then measured profiles",
        description="Write the analytic model's times into the graph (compute_s for --reference, "
        "compute_s_by_kind for --kinds), then the times of each --profile. A graph that "
        "already holds measured times for one of --kinds (from 'placer profile "
        "--graph-output', 'placer predict --device', another tool: any time the analytic "
        "model would change) is refused rather than losing them: leave that kind out "
        "of --kinds to keep them, give a --profile of it, or --overwrite-measured.",
    )
    p.add_argument("graph", help="placer.graph/1 file")
    p.add_argument(
        "--reference",
        default=PRESET_REFERENCE,
        help=f"kind whose times become compute_s (default {PRESET_REFERENCE}, the presets' speed-1.0 kind)",
    )
    p.add_argument(
        "--kinds",
        help="other kinds for compute_s_by_kind, comma-separated (default: every kind the "
        f"analytic model knows: {', '.join(DEVICE_SPECS)})",
    )
    p.add_argument("--profile", action="append", default=[], help="placer.profile/1 file to apply; repeatable")
    p.add_argument(
        "--overwrite-measured",
        action="store_true",
        help="replace the graph's measured times of --kinds by the analytic model's (default: refuse)",
    )
    p.add_argument("--output", "-o", required=True)
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("predict", help="predict the graph at a batch size from small batches (Celeritas 4.2)")
    p.add_argument("spec", help="zoo:NAME or path/file.py:FACTORY")
    p.add_argument("--batches", default="2,4,8", help="small batch sizes to run (default 2,4,8)")
    p.add_argument("--target", type=int, required=True, help="batch size to predict")
    p.add_argument(
        "--device", default="cpu", help="where to time nodes: cpu, cuda:N, or none (fit compute_s; default cpu)"
    )
    add_optimizer_option(p, lr=True)
    add_optimizer_settings(p)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", "-o", required=True)
    p.set_defaults(func=cmd_predict)
