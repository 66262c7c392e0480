"""``placer``'s entry point and its planning commands: plan, simulate, validate, compare, demo.

User errors (bad files, options, impossible problems) print one line,
``placer: error: ...``, and exit with status 2; ``--debug`` shows the
traceback. Output files are written atomically, and only for valid plans.

The other commands live beside this module, each module with
``add_commands(subparsers)``, which adds parsers whose ``func(args) -> int``
runs the command: :mod:`~placer.cli.capture`, :mod:`~placer.cli.cost`,
:mod:`~placer.cli.run` and :mod:`~placer.cli.learn`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..algorithms import available_algorithms, place
from ..algorithms.auto import RUNNABLE_DEPRECATED
from ..algorithms.registry import check_seed, check_time_limit, checked_options, get_algorithm
from ..cluster import PRESETS, Cluster, load_cluster
from ..cost.profile import apply_profile, load_profile
from ..errors import ClusterMismatchWarning, InvalidPlanError, OptionError, PlacerError
from ..graph import OpGraph
from ..harness.calibrate import load_calibration
from ..io import check_output, command_scope, read_json
from ..plan import Plan
from ..report.compare import check_options, compare
from ..report.tables import print_rows, print_simulation, working
from ..show import one_line
from ..sim import simulate_plan
from ..sim.bounds import plan_lower_bound
from ..sim.messages import simulate_with_messages
from ..sim.trace import write_trace
from ..sim.validation import validate
from ..terminate import interrupted, interrupts_recorded, raise_if_interrupted
from ..transform.bind import bind_plan
from ..transform.microbatch import check_microbatches, uneven_microbatches
from ..transform.split import batch_samples
from .capture import SETTING_FLAGS, add_optimizer_option, add_optimizer_settings, optimizer_settings
from .common import add_microbatches_option, check_microbatches_flag, cluster_for_plan, naming_plan
from .demo import DEFAULT_BATCH, DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_TIME_LIMIT, run_demo

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["main", "build_parser"]


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise OptionError(f"--option expects KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.replace("-", "_"), value


def _check_search_flags(args: argparse.Namespace) -> None:
    """``--time-limit`` and ``--seed`` refused by their flags' names, before anything is captured or run."""

    check_time_limit(getattr(args, "time_limit", None), "'--time-limit'")
    if getattr(args, "seed", None) is not None:
        check_seed(args.seed, "'--seed'")


def _load_graph(source: str, args: argparse.Namespace | None = None, cluster: "Cluster | None" = None):
    """A graph file, or a model spec (zoo:NAME, file.py:FACTORY) captured at ``--batch``; with
    ``--profile``, its measured times (refused where ``cluster`` has no device of the profile's kind)."""

    is_spec = source.startswith("zoo:") or ".py:" in source
    if not is_spec:
        if getattr(args, "batch", None) is not None:
            raise OptionError(f"--batch applies to a model spec; {source} is a graph file, captured at its own batch")
        if getattr(args, "name", None) is not None:
            raise OptionError(f"--name applies to a model spec; {source} is a graph file, named at its capture")

        given = [flag for flag in SETTING_FLAGS if getattr(args, flag, None) is not None]
        if given:
            raise OptionError(
                f"--{given[0].replace('_', '-')} applies to a model spec; {source} is a graph file, "
                f"captured with its own optimizer"
            )
        graph = OpGraph.load(source)
    elif args is None or getattr(args, "batch", None) is None:
        raise OptionError(f"{source}: a model spec needs --batch N")
    else:
        from ..capture import capture_spec  # deferred: imports torch

        print(f"capturing one training step of {source} at batch {args.batch} ...", file=sys.stderr)

        graph = capture_spec(
            source,
            args.batch,
            optimizer=args.optimizer,
            name=getattr(args, "name", None),
            settings=optimizer_settings(args),
        ).graph
    if getattr(args, "profile", None):
        profile = load_profile(args.profile)
        if cluster is not None:
            profile.check_cluster(cluster)
        graph = apply_profile(graph, profile)
    return graph


def _algorithm_names(text: str | None) -> list[str] | None:
    """The names of ``--algorithms a,b``; None (every algorithm) without it."""
    if text is None:
        return None
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise OptionError(f"option '--algorithms' names no algorithm: {text!r}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise OptionError(
            f"option '--algorithms' names {', '.join(map(repr, twice))} twice (one row and one plan file each)"
        )
    return names


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, help="batch size when GRAPH is a model spec")
    p.add_argument(
        "--name",
        help="graph name when GRAPH is a model spec, as `placer capture --name` gave it "
        "(default NAME-bsBATCH-OPTIMIZER)",
    )

    add_optimizer_option(p, "optimizer of the captured step when GRAPH is a model spec (default adam)")
    add_optimizer_settings(p)
    p.add_argument("--profile", metavar="FILE", help="placer.profile/1 file of measured times to use")


def _microbatches_of(graph: OpGraph, args: argparse.Namespace, who: str) -> None:
    """Refuse ``--microbatches`` the loaded graph cannot take, in one line, before any planning; say so where the
    count does not divide the batch (the micro-batches are planned unevenly)."""
    if args.microbatches is None:
        return
    check_microbatches(graph, args.microbatches, who)
    note = uneven_microbatches(batch_samples(graph), args.microbatches)
    if note:
        print(f"placer: note: {note}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:

    _check_search_flags(args)
    options = dict(_parse_option(o) for o in args.option)
    for key, value in (("seed", args.seed), ("time_limit", args.time_limit)):
        if value is not None:
            if key in options:
                raise OptionError(f"--option {key}=... and --{key.replace('_', '-')} both set {key}: give one")
            options[key] = value
    checked_options(get_algorithm(args.algorithm), options)  # before a model is captured
    if "microbatches" in options:  # a pipeline's own option: the same as --microbatches
        if args.microbatches is not None:
            raise OptionError("--option microbatches=... and --microbatches both set microbatches: give one")
        args.microbatches = options.pop("microbatches")
    check_microbatches_flag(args)
    if args.algorithm == "auto" and "runnable" in options:
        print(f"placer: warning: option {RUNNABLE_DEPRECATED}; leave it out", file=sys.stderr)
    check_output(args.output, "plan file", inputs=[args.graph, args.cluster, args.profile])
    cluster = load_cluster(args.cluster)
    graph = _load_graph(args.graph, args, cluster)
    _microbatches_of(graph, args, "--microbatches")

    # A search can take its whole limit (auto: a minute by default); say what runs meanwhile.
    limit = "" if args.time_limit is None else f", within {args.time_limit:g} s"
    with (
        working(f"planning {graph.name} on {cluster.name} with {args.algorithm}{limit} ..."),
        warnings.catch_warnings(),
    ):
        warnings.filterwarnings("ignore", RUNNABLE_DEPRECATED, DeprecationWarning)  # said just above
        plan = place(graph, cluster, args.algorithm, microbatches=args.microbatches, **options)
    plan.save(args.output)
    p = plan.predicted
    print(
        f"{args.algorithm}: makespan {p['makespan_s'] * 1e3:.3f} ms (lower bound {p['lower_bound_s'] * 1e3:.3f} ms), "
        f"fits memory, planned in {plan.search_time_s:.2f} s -> {args.output}"
    )
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:

    plan = Plan.load(args.plan)  # a bad plan file fails before a model is captured
    if args.trace:
        check_output(
            args.trace, "trace file", inputs=[args.graph, args.plan, args.cluster, args.profile, args.message_cost]
        )
    cluster = cluster_for_plan(plan, args.plan, load_cluster(args.cluster) if args.cluster else None, args.cluster)
    graph = _load_graph(args.graph, args, cluster)
    with naming_plan(args.plan, plan, cluster):
        result = simulate_plan(plan, graph, cluster)
        if not math.isfinite(result.makespan_s):
            raise InvalidPlanError(
                f"the simulated step overflows (makespan {result.makespan_s}): a figure of "
                f"the graph or cluster is out of range"
            )
    if args.trace:
        write_trace(result, args.trace)
    report = {**result.predicted(), "lower_bound_s": plan_lower_bound(plan, graph, cluster)}
    other = _other_prediction(plan, cluster, result.makespan_s)
    if other:
        print(f"placer: note: plan {args.plan}{other}", file=sys.stderr)
    if args.message_cost:
        report["with_message_cost_s"] = _with_message_cost(graph, plan, cluster, args.message_cost, args.plan)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0

    print_simulation(result, report)
    if args.message_cost:
        print(
            f"with the host cost of its messages and the barrier that ends a step ({args.message_cost}; a "
            f"richer mode than the reference model): {report['with_message_cost_s'] * 1e3:.3f} ms"
        )
    if args.trace:
        print(f"timeline written to {args.trace} (open in ui.perfetto.dev)")
    return 0


def _other_prediction(plan, cluster, makespan_s: float) -> str:
    """What to say where the plan file's own predicted step differs from ``makespan_s`` on the cluster it
    was made for ('' where it agrees, or where the cluster is another, which :func:`cluster_for_plan` notes)."""
    predicted = plan.predicted.get("makespan_s")
    if (
        predicted is None
        or math.isclose(predicted, makespan_s, rel_tol=1e-6, abs_tol=1e-12)
        or (plan.cluster_digest and plan.cluster_digest != cluster.digest())
    ):
        return ""
    edited = "" if plan.order is not None else " (it has no order now: was it removed?)"
    return (
        f" predicted {predicted * 1e3:.3f} ms when it was made: it was planned with other costs (a --profile, "
        f"placer tune's measurements; pass the same to compare), or edited since{edited}"
    )


def _with_message_cost(graph, plan, cluster, calibration_path: str, plan_path: str) -> float:
    """The plan's step with each message's host cost, from a calibration file, on its nodes, and the
    calibrated barrier that ends a step of the process-per-device runtime (where the file has one)."""

    calibration = load_calibration(calibration_path)
    if calibration.message_cost is None:
        raise OptionError(
            f"calibration {calibration_path} has no message cost (`placer calibrate --backend gloo` times one)"
        )
    # The rewritten graph's, when the plan splits ops.
    with naming_plan(plan_path, plan, cluster):
        bound = bind_plan(plan, graph, cluster)
    step_s = simulate_with_messages(bound, calibration.message_cost).makespan_s
    return step_s + (calibration.barrier_s or 0.0)


def cmd_algorithms(args: argparse.Namespace) -> int:

    rows = []
    for name in available_algorithms():
        alg = get_algorithm(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in alg.options.items())
        rows.append([name, alg.summary, opts])
    print_rows(["algorithm", "what it does", "options (defaults)"], rows, title="Registered algorithms")
    return 0


def cmd_clusters(args: argparse.Namespace) -> int:

    rows = []
    for name in PRESETS:
        c = load_cluster(name)
        kinds = sorted({d.kind for d in c.devices})
        bw = sorted({ch.bandwidth_bytes_per_s for ch in c.channels})
        rows.append(
            [
                name,
                str(c.num_devices),
                ", ".join(kinds),
                f"{c.devices[0].memory_bytes / 2**30:.0f} GiB",
                ", ".join(f"{b / 1e9:g} GB/s" for b in bw),
                str(len(c.channels)),
            ]
        )
    print_rows(
        ["preset", "devices", "kinds", "memory each", "channel bandwidths", "channels"], rows, title="Cluster presets"
    )
    for name in PRESETS:
        print(f"{name}: {load_cluster(name).extra['source']}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:

    spec_flags = [
        (f"--{key.replace('_', '-')}", getattr(args, key), "shapes the step captured from a model spec")
        for key in ("batch", "name", *SETTING_FLAGS)
    ]
    for flag, value, what in (
        ("--cluster", args.cluster, "checks plans against a cluster"),
        ("--profile", args.profile, "re-costs the graph plans are checked against"),
        *spec_flags,
    ):
        if value is not None and not args.graph:
            raise OptionError(f"option '{flag}' {what}, which needs '--graph' too")
    cluster = load_cluster(args.cluster) if args.cluster else None
    graph = _load_graph(args.graph, args, cluster) if args.graph else None
    profile = None
    if args.profile:  # checked against each plan's own cluster too, as _load_graph did against --cluster
        profile = load_profile(args.profile)
    failed = 0
    for path in args.files:  # each file is checked, and each failure reported on its own line
        try:
            print(_validate_file(path, graph, cluster, args.cluster, profile))
        except PlacerError as exc:
            if args.debug:
                raise
            print(f"placer: error: {one_line(exc)}", file=sys.stderr)
            failed += 1
    return 2 if failed else 0


def _validate_file(path: str, graph, cluster, cluster_spec: str | None, profile=None) -> str:
    """Check one graph, cluster or plan file; what it holds, on one line. A plan is checked against
    ``graph`` (re-costed by ``profile``, which its cluster must have a device of) on ``cluster`` or its own."""

    doc = read_json(path, "file")
    tag = doc.get("format") if isinstance(doc, dict) else None
    if tag == "placer.graph/1":
        g = OpGraph.from_dict(doc, source=path)
        return f"{path}: valid graph {g.name!r}: {g.num_nodes} nodes, {g.num_edges} edges"
    if tag == "placer.cluster/1":
        c = Cluster.from_dict(doc, source=path)
        return f"{path}: valid cluster {c.name!r}: {c.num_devices} devices, {len(c.channels)} channels"
    if tag == "placer.plan/1":
        plan = Plan.from_dict(doc, source=path)
        if graph is None:
            return (
                f"{path}: well-formed plan for graph {plan.graph_name!r} "
                f"(pass --graph to check it against that graph, on its own cluster or --cluster)"
            )
        plan_cluster = cluster_for_plan(plan, path, cluster, cluster_spec)  # notes another cluster's figures
        with naming_plan(path, plan, plan_cluster), warnings.catch_warnings():
            warnings.simplefilter("ignore", ClusterMismatchWarning)  # noted once, just above
            if profile is not None:
                profile.check_cluster(plan_cluster)
            result = validate(plan, graph, plan_cluster)
        other = _other_prediction(plan, plan_cluster, result.makespan_s)
        return f"{path}: valid plan, makespan {result.makespan_s * 1e3:.3f} ms, fits memory" + (
            f" (the plan{other})" if other else ""
        )
    raise PlacerError(
        f"{path}: unknown document format {tag!r} (expected placer.graph/1, placer.cluster/1 or placer.plan/1)"
    )


def cmd_compare(args: argparse.Namespace) -> int:

    _check_search_flags(args)
    names = _algorithm_names(args.algorithms)
    check_options(names, seed=args.seed, time_limit=args.time_limit)
    check_microbatches_flag(args)
    if args.output:
        check_output(args.output, "report folder", folder=True)
    cluster = load_cluster(args.cluster)
    graph = _load_graph(args.graph, args, cluster)
    _microbatches_of(graph, args, "--microbatches")
    comparison = compare(
        graph, cluster, names, seed=args.seed, time_limit=args.time_limit, microbatches=args.microbatches
    )
    comparison.print()
    if args.output:
        paths = comparison.write(args.output)
        print(f"report: {paths['html']} (also comparison.md/.csv/.json, plans and charts in {args.output})")
    else:  # the table alone: say how to keep the report, the plans and their charts
        print("report: none written (-o DIR writes report.html, comparison.md/.csv/.json, the plans and their charts)")
    return 0 if comparison.best is not None else 2


def cmd_demo(args: argparse.Namespace) -> int:

    _check_search_flags(args)
    names = _algorithm_names(args.algorithms)
    return run_demo(
        Path(args.output),
        model=args.model,
        batch=args.batch,
        cluster=args.cluster,
        algorithms=names,
        time_limit=args.time_limit,
        train=not args.no_train,
    )


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(
        prog="placer", description=("Place and schedule the operations of a training step across devices.")
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("plan", help="place a graph on a cluster with an algorithm")
    p.add_argument("graph", metavar="GRAPH|MODEL", help="placer.graph/1 file, or zoo:NAME / file.py:FACTORY")
    p.add_argument("--cluster", required=True, help="preset name or placer.cluster/1 file")
    _add_model_options(p)
    p.add_argument("--algorithm", default="expert", help="registered algorithm (see `placer algorithms`)")
    p.add_argument("--output", "-o", required=True, help="plan file to write")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--time-limit", type=float, help="search time limit in seconds")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="algorithm option (value parsed as JSON when it can be); repeatable",
    )
    add_microbatches_option(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="simulate a plan under the reference model")
    p.add_argument(
        "graph",
        metavar="GRAPH|MODEL",
        help="the plan's placer.graph/1 file, or the model spec it was "
        "planned from (zoo:NAME / file.py:FACTORY, with the same --batch and --optimizer)",
    )
    p.add_argument("plan")
    _add_model_options(p)
    p.add_argument("--cluster", help="preset or file (default: the cluster the plan names)")
    p.add_argument(
        "--json", action="store_true", help="print makespan_s, peak_memory_bytes, fits, lower_bound_s as JSON"
    )
    p.add_argument("--trace", metavar="FILE", help="write a Chrome-trace / Perfetto timeline")
    p.add_argument(
        "--message-cost",
        metavar="CALIBRATION",
        help="also give the step with each message's host cost and the barrier that ends a step "
        "from this calibration file (one process per device over gloo; a richer mode beside the "
        "reference model)",
    )
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("algorithms", help="list the registered algorithms")
    p.set_defaults(func=cmd_algorithms)

    p = sub.add_parser("clusters", help="list the cluster presets")
    p.set_defaults(func=cmd_clusters)

    p = sub.add_parser("validate", help="check graph, cluster and plan files")
    p.add_argument("files", nargs="+")
    p.add_argument(
        "--graph",
        metavar="GRAPH|MODEL",
        help="graph to check plans against: a placer.graph/1 file, "
        "or the model spec they were planned from (zoo:NAME / file.py:FACTORY, with --batch)",
    )
    p.add_argument("--cluster", help="cluster to check plans against, with --graph (default: the plan's)")
    _add_model_options(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("compare", help="run several algorithms on one graph and compare their plans")
    p.add_argument("graph", metavar="GRAPH|MODEL", help="placer.graph/1 file, or zoo:NAME / file.py:FACTORY")
    p.add_argument("--cluster", required=True, help="preset name or placer.cluster/1 file")
    _add_model_options(p)
    p.add_argument("--algorithms", help="comma-separated names (default: every registered algorithm)")
    p.add_argument("--output", "-o", help="folder for the table (md, csv, json), plans, charts and report.html")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, help="per-algorithm time limit in seconds")
    add_microbatches_option(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("demo", help="the main job on the built-in default (no GPU, no input)")
    p.add_argument(
        "--output", "-o", default="placer-demo", help="folder for plans, timelines and the report (default placer-demo)"
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"batch size (default {DEFAULT_BATCH})")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"preset or file (default {DEFAULT_CLUSTER})")
    p.add_argument("--algorithms", help="comma-separated names (default: every registered algorithm)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT,
        help=f"per-algorithm search limit in seconds (default {DEFAULT_TIME_LIMIT:g})",
    )
    p.add_argument(
        "--no-train",
        action="store_true",
        help="skip training auto's plan of a small model on this machine's CPU ranks afterwards",
    )
    p.set_defaults(func=cmd_demo)

    # Deferred to here, inside main's try: these import torch, a second or two in which Ctrl-C may come.
    from . import capture, cost, learn, run

    for module in (capture, cost, run, learn):
        module.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # One command: the files it reads are inputs no output of it replaces (placer.io), and Ctrl-C ends it
    # with status 130 even where a library caught the KeyboardInterrupt (placer.terminate).
    with interrupts_recorded(), command_scope():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = None
    try:
        # Inside the try: the command modules import torch, a second or two in which Ctrl-C may come.
        args = build_parser().parse_args(argv)
        status = args.func(args)
        raise_if_interrupted()
        return status
    except PlacerError as exc:
        if interrupted():  # the error is what the interruption left: say that
            return _interrupted()
        if getattr(args, "debug", False):
            raise
        print(f"placer: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:
        # The reader left (`placer clusters | head`): stop quietly, and let no flush at exit raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _interrupted() -> int:
    print("placer: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
    sys.exit(main())
