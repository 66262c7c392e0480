"""Does the simulator predict what a placed step takes when it runs?

For each model, plan and CPU preset (``2xcpu``, ``4xcpu``: processes over gloo):

1. calibrate: the gloo link's latency and bandwidth measured by
   :func:`placer.harness.calibrate.calibrate` (ping-pong between two processes),
   a message's host cost, and the barrier that ends a step (added to the
   prediction with the calibrated message cost);
   every operation's time measured alone, one thread, by
   :func:`placer.harness.profiling.profile_module` (median of 5 runs);
2. plan on the calibrated graph and cluster; the reference simulator's
   makespan is the prediction;
3. run the plan with the distributed executor (one process per device,
   one intra-op thread each): the measured step is the median of the steps
   after two warm-ups (barrier to barrier);
4. also predict from the per-operation times the run itself measured (FastT's
   feedback, :func:`placer.harness.feedback.measured_graph`), from those
   with the links' latency set to the transfers the run measured
   (:func:`placer.harness.feedback.measured_cluster`), and from the
   operations' own times (less the host time of their messages) with the
   host cost of a message fitted to the run's messages
   (:class:`placer.sim.messages.MessageCost`, charged by
   :func:`placer.sim.messages.messages_graph`): what the simulator says
   once it knows the runtime's real costs; each of these plus the end of the
   step after its last operation, which no operation's time holds (the
   barrier: :attr:`placer.runtime.distributed.DistributedResult.tail_s`);
5. predict each plan from another plan's run of the same model and cluster,
   as ``placer tune`` must (out of sample): from its op and transfer times,
   and from its operations' own times and message cost (plus that run's step
   end).

Error = (predicted - measured) / measured. Prints Markdown tables, then where
the prediction before a run parts from the run's (op times, message cost, the
step's end, what is left per operation; with rounds, their spread), what it
would be with the message cost of another model's round-robin run instead of
the calibration's streams (a calibration by a probe plan), how
much slower each rank computed than profiled and, from the traces, whether
operations run slower just after their rank blocked or while the other ranks
compute, and the command to reproduce them.

Every plan's run follows a fresh profile of its model, and with ``--rounds R``
every plan runs R times in turn, so that the machine's own speed, which moves
over seconds on a many-core machine (docs/benchmarks.md, "Fidelity"), weighs
on both sides alike: a plan's measured step is the median of every round's
steps after warm-up, its operations' times the median over the rounds, and its
prediction comes from each node's median over every profile (the plans are
made from the first). The record keeps every profile, and the summary compares
the prediction from every profile with that from each round's first profile
alone and from those just before the plan's runs.

With ``--probe``, the calibration takes a message's host cost from a probe run
(``placer calibrate --probe``: :func:`placer.harness.calibrate.measure_probe`), so
the predictions before a run use it; the record keeps the streams' cost too,
and the summary compares the two.

With ``--record DIR``, what each run measured is kept there (the profiled
graph, the calibrated cluster, the plan, and the run's step, operation,
message and transfer times, to 0.1 us), beside each run's last measured step
as a Chrome trace (:func:`placer.runtime.trace.run_trace`) and the
simulator's timeline of the plan with the run's own op times
(:func:`placer.sim.trace.chrome_trace`), to see where they part.
``--replay DIR_OR_ARCHIVE`` prints the tables again from such a record, with
the cost model of the code at hand: how a change to the model would have
predicted runs measured on a quiet machine, without that machine.
``bench/data`` holds the record of docs/benchmarks.md's "Fidelity" table, with
its measured traces and without the simulated ones (``tar cJf NAME.tar.xz
--exclude '*-simulated.json' DIR``): ``fidelity-h200.tar.xz`` (six models over
``2xcpu`` and ``4xcpu`` on 16 CPU cores of an H200 machine, calibrated with
``--probe``, 3 rounds, every profile kept) with ``fidelity-h200-rnnlm.tar.xz``
(RNNLM on a second machine of the same kind: replay the two together,
comma-separated). ``--calibration FILE`` replays a record with another
calibration's message cost and barrier (``placer calibrate`` writes one): how
far the calibration alone moves the prediction before a run. The calibration
also times streams of messages
(:attr:`placer.sim.messages.MessageCost.by_gap`), and the prediction with
the calibrated message cost charges each message at its gap in the simulated
schedule (:func:`placer.sim.messages.simulate_with_messages`). The replay
reads records of earlier forms too; fields a record lacks are left empty.

Usage::

    PYTHONPATH=. python bench/fidelity.py [--steps 8] [--models lenet,alexnet,...,rnnlm]
        [--clusters 2xcpu,4xcpu] [--plans expert,metis,round_robin] [--rounds 1] [--record DIR]
    PYTHONPATH=. python bench/fidelity.py --replay bench/data/fidelity-h200.tar.xz,bench/data/fidelity-h200-rnnlm.tar.xz
    PYTHONPATH=. python bench/fidelity.py --replay bench/data/fidelity-h200.tar.xz --calibration cal.json
    PYTHONPATH=. python bench/fidelity.py --replay OLD_RECORD.tar.xz --rounds-log OLD_RUN.log

Run it on a quiet machine with a core per rank: on a loaded one the ranks
wait for CPU time the simulator knows nothing about.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import itertools
import json
import os
import re
import statistics
import sys
import tarfile
import tempfile
import time
from typing import Any

import numpy as np
import torch

# name -> (spec, batch)
MODELS = {
    "lenet": ("zoo:lenet", 64),
    "alexnet": ("zoo:alexnet?image_size=64&width=16&hidden=256&classes=10", 32),
    "vgg": ("zoo:vgg19?image_size=32&width=8&hidden=64&classes=10", 32),
    "resnet": ("zoo:resnet50?depth=14&image_size=32&width=8&classes=10", 32),
    # Three more, which the cost model's rules were not fitted on: out of sample.
    "transformer": ("zoo:transformer?layers=2&hidden=64&heads=4&ff=256&vocab=1000&seq_len=32", 16),
    "inception": ("zoo:inception_v3?image_size=75&width=8&classes=10&aux=false", 16),
    "rnnlm": ("zoo:rnnlm?layers=2&hidden=128&vocab=1000&seq_len=16", 16),
}
PLANS = ("expert", "metis", "round_robin")
WARMUP_STEPS = 2


@dataclasses.dataclass(eq=False)  # a run is itself: predictions are cached by (run, source)
class Run:
    """One placed run: the case, what was planned for it and what it measured."""

    model: str
    cluster_name: str
    algorithm: str
    graph: Any
    cluster: Any
    plan: Any
    step_s: list
    op_s: dict
    transfer_s: list
    op_message_s: dict = dataclasses.field(default_factory=dict)  # absent from the oldest records
    message_s: list = dataclasses.field(default_factory=list)
    calibrated_message_cost: Any = None  # absent from the oldest records
    tail_s: float = 0.0  # from the record, or from its traces where it has none (see recorded_runs)
    round_step_s: list = dataclasses.field(default_factory=list)  # each round's median step, with --rounds
    calibrated_barrier_s: float = 0.0  # absent from older records
    # The last step's measured trace events (run_trace's), where the record keeps them (live runs, records).
    trace_events: list = dataclasses.field(default_factory=list)
    # With --probe: the calibration's streams' message cost, calibrated_message_cost the probe's.
    stream_message_cost: Any = None
    # Every profile of the model, in the order taken (round, the run it came before, node ->
    # seconds); the graph's times are their per-node median.
    profiles: list = dataclasses.field(default_factory=list)

    @property
    def measured_s(self) -> float:
        return statistics.median(self.step_s[WARMUP_STEPS:] or self.step_s)

    @property
    def case(self) -> tuple[str, str]:
        return self.model, self.cluster_name


def captured_model(name: str):
    """The captured training step of :data:`MODELS`' ``name`` and its flat inputs."""
    from placer.capture.spec import capture_spec, load_model

    spec, batch = MODELS[name]
    captured = capture_spec(spec, batch)
    model, inputs = load_model(spec, batch)
    return captured, captured.step_inputs(model, inputs)


def fed_graph(run: Run, source: Run):
    """``run``'s graph with the op times ``source`` measured (FastT's feedback)."""
    from placer.harness.feedback import measured_graph

    return measured_graph(run.graph, source.plan.bind(run.graph, run.cluster), run.cluster, source.op_s)


@functools.cache  # the tables and the pair count ask for the same predictions
def predicted_from(run: Run, source: Run) -> float:
    """The simulator's step for ``run``'s plan from the op and transfer times ``source`` measured, plus the
    end of a step ``source`` measured (:attr:`placer.runtime.distributed.DistributedResult.tail_s`)."""
    from placer.harness.feedback import measured_cluster
    from placer.sim import simulate_plan

    return (
        simulate_plan(run.plan, fed_graph(run, source), measured_cluster(run.cluster, source.transfer_s)).makespan_s
        + source.tail_s
    )


@functools.cache
def predicted_with_messages(run: Run, source: Run) -> float | None:
    """The simulator's step for ``run``'s plan from the operations' own times ``source`` measured and the
    host cost of a message fitted to its messages (:func:`run_message_cost`), charged as ``run``'s plan sends
    them, over the calibrated links; None for a run recorded without messages.

    The links keep their calibrated latency: with the messages' host time on the ranks, what a run's
    transfers took beyond it depends on that plan's traffic (on two recorded samples, predicting another
    plan's run with the source run's transfer times instead: 19.7% and 24.0% mean error; with the
    calibrated links: 16.9% and 18.0%).
    Plus the end of a step ``source`` measured, as :func:`predicted_from`.
    """
    cost = run_message_cost(source)
    if cost is None:
        return None
    return step_with_messages(run, cost, source) + source.tail_s


@functools.cache
def run_own_times(run: Run) -> dict[str, float]:
    """Each node's own time in ``run``: its measured time less its messages' host time
    (:func:`placer.harness.feedback.own_times`). Read only: the replay's predictions share it."""
    from placer.harness.feedback import own_times

    return own_times(run.op_s, run.op_message_s)


def run_own_seconds(run: Run) -> np.ndarray:
    """:func:`run_own_times` per node of ``run``'s graph, NaN where the run has none."""
    own = run_own_times(run)
    return np.array([own.get(node, np.nan) for node in run.graph.ids])


@functools.cache  # the tables and the gap's split ask for the same simulations
def step_with_messages(run: Run, cost, ops_from: Run | None) -> float:
    """``run``'s plan simulated with ``cost`` charged for its messages, each node at the own time ``ops_from``
    measured (:func:`placer.harness.feedback.own_times`, less what ``cost`` charges the operation after
    ``ops_from``'s messages: :func:`placer.sim.messages.without_after_message`) or, without one, at its
    profiled time."""
    from placer.sim.messages import simulate_with_messages, without_after_message

    own = (
        {}
        if ops_from is None
        else without_after_message(run_own_times(ops_from), ops_from.plan.bind(ops_from.graph, ops_from.cluster), cost)
    )
    return simulate_with_messages(run.plan.bind(run.graph, run.cluster), cost, own).makespan_s


@functools.cache
def run_message_cost(run: Run):
    """The host cost of a message fitted to ``run``'s messages, shaped over gaps by its calibration's costs by
    gap where it has them (:func:`placer.sim.messages.spread_over_gaps`); None for a run recorded without
    messages."""
    from placer.sim.messages import MessageCost, spread_over_gaps

    if not run.message_s:
        return None
    fitted = MessageCost.fit(run.message_s)
    if run.calibrated_message_cost is None:
        return fitted
    return spread_over_gaps(
        fitted, run.calibrated_message_cost, run.plan.bind(run.graph, run.cluster), run_own_times(run)
    )


#: The predictions of a run the table shows: key, column, and how the summary says it.
PREDICTIONS = (
    ("calibrated", "calibrated", "calibrated"),
    ("calibrated_messages", "calibrated, message cost", "calibrated with the calibrated message cost"),
    # The same without what an operation loses right after a message (where the record's calibration has it).
    (
        "calibrated_messages_plain",
        "calibrated, message cost, not the op after",
        "the same without the operations after messages",
    ),
    ("op", "run's op times", "with the run's own op times"),
    ("op_transfer", "run's op and transfer times", "with its op and transfer times"),
    ("own_messages", "ops' own times, message cost", "with the ops' own times and its message cost"),
)


@functools.cache  # a live run prints its line as it ends, then again in the table
def table_row(run: Run) -> tuple[tuple, float, dict[str, float | None]]:
    """One run's line of the table: the case, what was measured, and each of :data:`PREDICTIONS` (None
    where the record lacks what it needs)."""
    from placer.sim import simulate_plan

    calibrated_messages = plain = None
    cost = run.calibrated_message_cost
    if cost is not None:
        calibrated_messages = step_with_messages(run, cost, None) + run.calibrated_barrier_s
        if cost.after_send_s or cost.after_receive_s or cost.after_wait_s:
            plain = step_with_messages(run, cost.host_only(), None) + run.calibrated_barrier_s
    case = (run.model, run.graph.num_nodes, run.cluster_name, run.algorithm, len(set(run.plan.placement.values())))
    return (
        case,
        run.measured_s,
        {
            "calibrated": run.plan.predicted["makespan_s"],
            "calibrated_messages": calibrated_messages,
            "calibrated_messages_plain": plain,
            "op": simulate_plan(run.plan, fed_graph(run, run), run.cluster).makespan_s + run.tail_s,
            "op_transfer": predicted_from(run, run),
            "own_messages": predicted_with_messages(run, run),
        },
    )


def record_run(folder: str, run: Run, result) -> None:
    """Keep what one run measured under ``folder`` (the layout :func:`recorded_runs` reads); the traces are
    ``result``'s (its last round's)."""
    from placer.io import write_text_atomic
    from placer.runtime.trace import write_run_trace
    from placer.sim import simulate_plan
    from placer.sim.trace import write_trace

    os.makedirs(folder, exist_ok=True)
    stem = os.path.join(folder, f"{run.model}-{run.cluster_name}-{run.algorithm}")
    write_run_trace(
        stem + "-measured.json",
        result.timeline,
        run.cluster,
        step_s=result.step_s[-1],
        predicted_s=run.plan.predicted["makespan_s"],
    )
    write_trace(simulate_plan(run.plan, fed_graph(run, run), run.cluster), stem + "-simulated.json")
    run.graph.save(os.path.join(folder, f"{run.model}-graph.json"))
    run.cluster.save(os.path.join(folder, f"{run.cluster_name}-cluster.json"))
    run.plan.save(stem + "-plan.json")
    # Times to 0.1 us (a clock read costs more), compact: tens of thousands of messages per model.
    measured = _rounded(
        {
            "step_s": run.step_s,
            "op_s": run.op_s,
            "transfer_s": run.transfer_s,
            "op_message_s": run.op_message_s,
            "message_s": run.message_s,
            "tail_s": run.tail_s,
            "round_step_s": run.round_step_s,
            "calibrated_barrier_s": run.calibrated_barrier_s,
        }
    )
    if run.calibrated_message_cost is not None:
        measured["calibrated_message_cost"] = run.calibrated_message_cost.to_dict()
    if run.stream_message_cost is not None:
        measured["stream_message_cost"] = run.stream_message_cost.to_dict()
    write_text_atomic(stem + "-run.json", json.dumps(measured, separators=(",", ":")))
    if run.profiles:
        write_text_atomic(
            os.path.join(folder, f"{run.model}-profiles.json"),
            json.dumps(_rounded(run.profiles), separators=(",", ":")),
        )


def _rounded(value):
    """``value`` with every float rounded to 0.1 us."""
    if isinstance(value, float):
        return round(value, 7)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def recorded_runs(source: str) -> list[Run]:
    """The runs of a record (a folder, or a ``.tar.*`` archive of one)."""
    from placer.cluster import load_cluster
    from placer.graph import OpGraph
    from placer.plan import Plan
    from placer.sim.messages import MessageCost

    with tempfile.TemporaryDirectory() as unpacked:
        if os.path.isfile(source):
            with tarfile.open(source) as archive:
                archive.extractall(unpacked, filter="data")
            found = glob.glob(os.path.join(unpacked, "**", "*-run.json"), recursive=True)
        else:
            found = glob.glob(os.path.join(source, "*-run.json"))
        if not found:
            sys.exit(f"fidelity: no *-run.json under {source}")
        runs = []
        for path in sorted(found):
            folder, stem = os.path.split(path[: -len("-run.json")])
            name, cluster_name, algorithm = stem.split("-", 2)
            with open(path, encoding="utf-8") as f:
                measured = json.load(f)
            trace = measured_trace(os.path.join(folder, f"{stem}-measured.json"))
            profiles_path = os.path.join(folder, f"{name}-profiles.json")
            profiles = []
            if os.path.exists(profiles_path):
                with open(profiles_path, encoding="utf-8") as f:
                    profiles = json.load(f)
            runs.append(
                Run(
                    name,
                    cluster_name,
                    algorithm,
                    OpGraph.load(os.path.join(folder, f"{name}-graph.json")),
                    load_cluster(os.path.join(folder, f"{cluster_name}-cluster.json")),
                    Plan.load(os.path.join(folder, f"{stem}-plan.json")),
                    measured["step_s"],
                    measured["op_s"],
                    [tuple(x) for x in measured["transfer_s"]],
                    measured.get("op_message_s", {}),
                    [tuple(x) for x in measured.get("message_s", [])],
                    measured.get("calibrated_message_cost")
                    and MessageCost.from_dict(measured["calibrated_message_cost"]),
                    measured["tail_s"] if "tail_s" in measured else trace_tail_s(trace),
                    measured.get("round_step_s", []),
                    measured.get("calibrated_barrier_s", 0.0),
                    [] if trace is None else trace["traceEvents"],
                    measured.get("stream_message_cost") and MessageCost.from_dict(measured["stream_message_cost"]),
                    profiles,
                )
            )
    return runs


def measured_trace(path: str) -> dict | None:
    """A run's recorded trace of its last step (:func:`placer.runtime.trace.run_trace`), None where not kept."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def trace_tail_s(trace: dict | None) -> float:
    """The end of the last step after its last operation, from a run's trace (0 without one).

    For records made before runs measured it, where the record keeps the traces: the trace's clock starts
    with the first rank to start, which may precede the measuring rank's start, so this is at most the tail.
    """
    if trace is None:
        return 0.0
    ended = max(((e["ts"] + e["dur"]) / 1e6 for e in trace["traceEvents"] if e.get("ph") == "X"), default=None)
    return 0.0 if ended is None else max(0.0, trace["otherData"]["step_s"] - ended)


def print_table(rows: list[tuple]) -> None:
    shown = [
        (key, column, phrase)
        for key, column, phrase in PREDICTIONS
        if all(predicted[key] is not None for _, _, predicted in rows)
    ]
    print(
        "| model | nodes | cluster | plan | devices used | measured | "
        + " | ".join(f"predicted ({column}) | error" for _, column, _ in shown)
        + " |"
    )
    print("|---|---:|---|---|---:|---:|" + "---:|---:|" * len(shown))
    for case, measured, predicted in rows:
        print(
            "| "
            + " | ".join(map(str, case))
            + f" | {measured * 1e3:.2f} ms | "
            + " | ".join(
                f"{predicted[key] * 1e3:.2f} ms | {(predicted[key] - measured) / measured:+.1%}" for key, _, _ in shown
            )
            + " |"
        )
    print()
    for label, kinds in (("all", None), ("expert and metis", ("expert", "metis")), ("round_robin", ("round_robin",))):
        chosen = [row for row in rows if kinds is None or row[0][3] in kinds]
        if chosen:
            means = [
                f"{statistics.mean(abs(p[key] - m) / m for _, m, p in chosen):.1%} {phrase}" for key, _, phrase in shown
            ]
            print(f"mean |error| over {len(chosen)} runs ({label}): " + ", ".join(means))


def print_cross(
    runs: list[Run],
    predict=predicted_from,
    title: str = "Predicted from another plan's run (its op and transfer times)",
) -> None:
    """Each plan's step predicted from another plan's run of the same model and cluster: out of sample.

    This is what ``placer tune`` does: it measures one plan, then predicts others from those measurements.
    ``predict(run, source)`` gives the prediction (None: none).
    """
    by_case: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_case.setdefault(run.case, []).append(run)
    sources = sorted({run.algorithm for run in runs})
    if max(len(group) for group in by_case.values()) < 2:
        return
    print(f"{title}:")
    print()
    print("| model | cluster | plan | measured | " + " | ".join(f"from {s}'s run | error" for s in sources) + " |")
    print("|---|---|---|---:|" + "---:|---:|" * len(sources))
    errors: dict[str, list[float]] = {}
    for run in runs:
        cells = []
        for source in sources:
            other = next((o for o in by_case[run.case] if o.algorithm == source and o is not run), None)
            predicted = None if other is None else predict(run, other)
            if predicted is None:
                cells.append("| ")
                continue
            error = (predicted - run.measured_s) / run.measured_s
            errors.setdefault(source, []).append(abs(error))
            errors.setdefault(f"onto {run.algorithm}", []).append(abs(error))
            cells.append(f"{predicted * 1e3:.2f} ms | {error:+.1%}")
        print(
            f"| {run.model} | {run.cluster_name} | {run.algorithm} | {run.measured_s * 1e3:.2f} ms | "
            + " | ".join(cells)
            + " |"
        )
    print()
    pairs = [e for source in sources for e in errors.get(source, [])]
    if not pairs:
        return
    print(
        f"mean |error| over {len(pairs)} (plan, other plan's run) pairs: {statistics.mean(pairs):.1%}; "
        + ", ".join(f"from {s}'s runs {statistics.mean(errors[s]):.1%}" for s in sources if s in errors)
        + "; "
        + ", ".join(
            f"{key} {statistics.mean(errors[key]):.1%}" for key in (f"onto {s}" for s in sources) if key in errors
        )
    )


def ordered_pairs(runs: list[Run], predict) -> tuple[int, int]:
    """Of every two plans of a case, predicted from each run of the case, how often the faster one is predicted
    faster (what a loop that keeps the faster plan needs): ``(right, pairs)``."""
    by_case: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_case.setdefault(run.case, []).append(run)
    right = total = 0
    for group in by_case.values():
        for source in group:
            for a, b in itertools.combinations(group, 2):
                right += (predict(a, source) < predict(b, source)) == (a.measured_s < b.measured_s)
                total += 1
    return right, total


def mean_errors(errors) -> str:
    """``mean |error| (mean error)`` of relative errors, as percentages."""
    return f"{statistics.mean(map(abs, errors)):.1%} ({statistics.mean(errors):+.1%})"


def print_gap_parts(runs: list[Run]) -> None:
    """Where the calibrated prediction with message cost parts from the run's: each run predicted with its op
    times and its message cost each either calibrated (profiled) or the run's, without the step's end."""
    runs = [run for run in runs if run.message_s and run.calibrated_message_cost is not None]
    if not runs:
        return
    errors: dict[str, dict[tuple[str, str], list[float]]] = {}
    for run in runs:
        for ops, ops_from in (("profiled", None), ("the run's own", run)):
            for messages, cost in (("calibrated", run.calibrated_message_cost), ("the run's", run_message_cost(run))):
                error = step_with_messages(run, cost, ops_from) / run.measured_s - 1
                for group in ("all", run.algorithm):
                    errors.setdefault(group, {}).setdefault((ops, messages), []).append(error)
    for group, parts in errors.items():
        count = len(next(iter(parts.values())))
        print(
            f"mean |error| (mean error) over {count} runs ({group}), op times and message cost each calibrated "
            "or the run's, without the step's end: "
            + "; ".join(
                f"{ops} op times, {messages} message cost {mean_errors(e)}" for (ops, messages), e in parts.items()
            )
        )


def print_probe_message_cost(runs: list[Run]) -> None:
    """The prediction before a run with the message cost of another model's round-robin run instead of the
    calibration's streams: what a calibration by a probe plan (a small model placed round robin, run, and its
    messages fitted) would give.

    Each run is predicted with its profiled op times and, per round-robin run of another model over the same
    cluster, that run's fitted message cost (:func:`run_message_cost`, shaped over gaps by its calibration);
    the median over those models, against the calibration's streams' message cost, both without the step's end
    (as :func:`print_gap_parts`). Out of sample: the model, and so the plan, is never the run's own. Also with
    what that run's operations lost right after its messages (:func:`placer.sim.messages.fit_after_message`,
    as ``placer calibrate --probe`` fits it) in place of the streams' charges.
    """
    from placer.sim.messages import fit_after_message, simulate_with_messages

    def probe_costs(donor: Run) -> tuple[Any, Any]:
        """The donor's message cost, without and with its operations' after-message charges."""
        cost = run_message_cost(donor)
        return cost, fit_after_message(donor.plan.bind(donor.graph, donor.cluster), run_own_times(donor), cost)

    donors: dict[str, list[Run]] = {}
    for run in runs:
        if run.algorithm == "round_robin" and run.message_s:
            donors.setdefault(run.cluster_name, []).append(run)
    errors: dict[str, dict[str, list[float]]] = {}  # plan -> way -> errors
    for run in runs:
        others = [donor for donor in donors.get(run.cluster_name, []) if donor.model != run.model]
        if not others or run.calibrated_message_cost is None:
            continue
        bound = run.plan.bind(run.graph, run.cluster)
        costs = [probe_costs(donor) for donor in others]
        probed = statistics.median(simulate_with_messages(bound, cost).makespan_s for cost, _ in costs)
        fitted = statistics.median(simulate_with_messages(bound, cost).makespan_s for _, cost in costs)
        calibrated = step_with_messages(run, run.stream_message_cost or run.calibrated_message_cost, None)
        for plans in ("all", run.algorithm):
            by_way = errors.setdefault(plans, {})
            by_way.setdefault("calibrated", []).append(calibrated / run.measured_s - 1)
            by_way.setdefault("probe", []).append(probed / run.measured_s - 1)
            by_way.setdefault("fitted", []).append(fitted / run.measured_s - 1)
    for plans, by_way in errors.items():
        calibrated, probed = by_way["calibrated"], by_way["probe"]
        print(
            f"mean |error| (mean error) over {len(probed)} runs ({plans}), profiled op times, without the "
            f"step's end: the calibration's streams' message cost {mean_errors(calibrated)}; another model's "
            f"round-robin run's message cost {mean_errors(probed)}, with what its operations lost after its "
            f"messages {mean_errors(by_way['fitted'])}"
        )
    streams: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if run.stream_message_cost is not None:  # calibrated with --probe: both costs recorded
            for plans in ("all", run.algorithm):
                streams.setdefault(plans, []).append(
                    (
                        step_with_messages(run, run.calibrated_message_cost, None) / run.measured_s - 1,
                        step_with_messages(run, run.stream_message_cost, None) / run.measured_s - 1,
                    )
                )
    for plans, pairs in streams.items():
        probed, streamed = zip(*pairs)
        print(
            f"mean |error| (mean error) over {len(pairs)} runs ({plans}), profiled op times, without the step's "
            f"end: the calibration's probe run's message cost {mean_errors(probed)}; its streams' "
            f"{mean_errors(streamed)}"
        )


def beside_messages(run: Run) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node of ``run``: its device (the bound plan), profiled seconds, own seconds in the run (NaN where
    it has none), and the messages it sends and receives (as the first consumer of a tensor from another
    rank) under the plan."""
    from placer.sim.messages import plan_messages

    bound, profiled = placed_profile(run)
    ran = run_own_seconds(run)
    sends, receives = np.zeros(run.graph.num_nodes), np.zeros(run.graph.num_nodes)
    for producer, consumer, _ in plan_messages(run.graph, bound):
        sends[producer] += 1
        receives[consumer] += 1
    return bound, profiled, ran, sends, receives


def print_message_slowdown(runs: list[Run]) -> None:
    """How much a rank's operations slow down per message it handles: per rank of every run, its operations'
    own time in the run (their messages' host time taken out) fitted as ``factor x profiled + per_message x
    messages`` (the messages it sends and receives under the plan; least squares on relative residuals);
    then :func:`print_message_roles`.

    What a message costs its rank beyond what the runtime times as the message's own is mostly the
    operation right after it, slower than the profile's operations, which each come right after another
    (``bench/op_slowdown.py --part receive``; :attr:`placer.sim.messages.MessageCost.after_send_s`).
    """
    rows, ran_s = [], []
    for run in runs:
        bound, profiled, ran, sends, receives = beside_messages(run)
        for rank in range(run.cluster.num_devices):
            timed = ~np.isnan(ran) & (bound.device_of == rank)
            if timed.sum() >= 5:
                rows.append((profiled[timed].sum(), (sends + receives)[bound.device_of == rank].sum()))
                ran_s.append(ran[timed].sum())
    if len(rows) < 2:
        return
    weights = 1 / np.array(ran_s)
    (factor, per_message), *_ = np.linalg.lstsq(
        np.array(rows) * weights[:, None], np.array(ran_s) * weights, rcond=None
    )
    print(
        f"a rank's operations' own time over {len(rows)} ranks: {factor:.3f} x profiled + "
        f"{per_message * 1e6:.1f} us per message it sends or receives"
    )
    print_message_roles(runs)


def print_message_roles(runs: list[Run]) -> None:
    """Which operations lose beside messages: their own time in the runs over their profile, by whether
    they send a message, receive one, both or neither, for the plans with few messages (expert, METIS) and
    round robin's."""
    roles = ("neither", "sends", "receives", "sends and receives")
    totals: dict[tuple[str, str], list[float]] = {}  # (plans, role) -> [ops, profiled, ran, messages]
    for run in runs:
        _, profiled, ran, sends, receives = beside_messages(run)
        role = (sends > 0) + 2 * (receives > 0)
        plans = "round robin" if run.algorithm == "round_robin" else "expert and METIS"
        for k, name in enumerate(roles):
            chosen = (role == k) & ~np.isnan(ran)
            entry = totals.setdefault((plans, name), [0, 0.0, 0.0, 0.0])
            entry[0] += int(chosen.sum())
            entry[1] += float(profiled[chosen].sum())
            entry[2] += float(ran[chosen].sum())
            entry[3] += float((sends + receives)[chosen].sum())
    print("operations' own time in the runs over their profile, by their messages:")
    for plans in ("expert and METIS", "round robin"):
        parts = []
        for name in roles:
            ops, profiled, ran, messages = totals.get((plans, name), (0, 0.0, 0.0, 0.0))
            if profiled > 0:
                per_message = f", {(ran - profiled) / messages * 1e6:+.1f} us per message" if messages else ""
                parts.append(f"{name} {ops:.0f} ops, {ran / profiled:.2f}x their profile{per_message}")
        if parts:
            print(f"  {plans}: " + "; ".join(parts))


def placed_profile(run: Run):
    """The run's plan bound to its graph and cluster, and each node's profiled seconds on its device."""
    bound = run.plan.bind(run.graph, run.cluster)
    return bound, bound.placed_durations()


def rank_slowdowns(run: Run, over_s: float = 50e-6) -> dict[int, float]:
    """Per rank, its operations' own time in the run over their profiled time (operations profiled over
    ``over_s``): how much slower each rank computed than the profile said."""
    bound, profiled = placed_profile(run)
    device_of = bound.device_of
    ran = run_own_seconds(run)
    timed = (profiled > over_s) & ~np.isnan(ran)
    return {
        rank: float(ran[timed & (device_of == rank)].sum() / profiled[timed & (device_of == rank)].sum())
        for rank in range(run.cluster.num_devices)
        if (timed & (device_of == rank)).sum() >= 5
    }


def traced_ops(run: Run, over_s: float = 50e-6) -> tuple[np.ndarray, int]:
    """What was going on around each operation of the run's traced step, beside its time in the run.

    From the run's trace of its last step, the operations profiled over ``over_s`` with no input or output on
    another rank (no message of their own to count), one row each: the run's seconds, the profiled seconds,
    the seconds since its rank last woke (from a blocking wait, over ``BLOCKED_WAIT_S``, or at the step's start,
    after the barrier), and the share of the operation's time the other ranks spent in operations. Also the
    number of wakes (the ranks' starts and blocking waits). No rows without a trace or with one rank.
    """
    from placer.runtime.distributed import BLOCKED_WAIT_S

    graph = run.graph
    bound, profiled = placed_profile(run)
    device_of = bound.device_of
    crossing = device_of[graph.src] != device_of[graph.dst]
    messaging = np.zeros(graph.num_nodes, dtype=bool)
    messaging[graph.src[crossing]] = messaging[graph.dst[crossing]] = True
    index = {node: i for i, node in enumerate(graph.ids)}
    lanes: dict[int, list[dict]] = {}
    for event in run.trace_events:
        if event.get("ph") == "X":
            lanes.setdefault(event["tid"], []).append(event)
    if len(lanes) < 2:
        return np.zeros((0, 4)), 0
    busy = {
        lane: np.array([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "op"]).reshape(-1, 2)
        for lane, events in lanes.items()
    }
    rows, wakes = [], len(lanes)
    for lane, events in lanes.items():
        woke = 0.0
        for event in sorted(events, key=lambda e: e["ts"]):
            start, end = event["ts"], event["ts"] + event["dur"]
            if event.get("cat") == "wait":
                if event["dur"] / 1e6 > BLOCKED_WAIT_S:
                    woke, wakes = end, wakes + 1
                continue
            i = index.get(event["name"])
            if i is None or messaging[i] or profiled[i] <= over_s or end <= start:
                continue
            others = sum(
                np.clip(np.minimum(spans[:, 1], end) - np.maximum(spans[:, 0], start), 0, None).sum()
                for other, spans in busy.items()
                if other != lane
            )
            rows.append(
                (event["dur"] / 1e6, profiled[i], (start - woke) / 1e6, others / (end - start) / (len(lanes) - 1))
            )
    return np.array(rows, dtype=float).reshape(-1, 4), wakes


def print_traced_slowdowns(runs: list[Run], window_s: float = 200e-6) -> None:
    """Do operations run slower just after their rank blocked (woken, its caches cold), or while the other ranks
    compute (sharing the host's caches and memory)? Pooled over the runs with a trace, the round-robin plans
    apart (nearly all their operations send or receive)."""
    traced = [run for run in runs if run.trace_events and run.algorithm != "round_robin"]
    tables = [traced_ops(run) for run in traced]
    rows = np.concatenate([table for table, _ in tables]) if tables else np.zeros((0, 4))
    if not len(rows):
        return
    wakes = sum(woken for _, woken in tables)

    def slowdown(chosen: np.ndarray) -> str:
        return (
            f"{rows[chosen, 0].sum() / rows[chosen, 1].sum():.2f}x their profile ({int(chosen.sum())} ops)"
            if chosen.any()
            else "none"
        )

    soon = rows[:, 2] < window_s
    later = rows[~soon, 0].sum() / rows[~soon, 1].sum()
    excess = rows[soon, 0].sum() - later * rows[soon, 1].sum()
    print(
        f"operations with no message of their own, profiled over 50 us, in the traced steps of {len(traced)} runs "
        f"(round robin apart): within {window_s * 1e6:.0f} us of their rank's last blocking wait or the step's "
        f"start, {slowdown(soon)}; later, {slowdown(~soon)}; the excess {excess * 1e6 / wakes:.1f} us per wake "
        f"({wakes} wakes: the ranks' starts and their blocking waits), "
        f"{excess / sum(run.measured_s for run in traced):.1%} of the steps"
    )
    share = rows[:, 3]
    print(
        "the same operations by the share of their time the other ranks spent in operations: "
        f"under 25%, {slowdown(share < 0.25)}; 25 to 50%, {slowdown((share >= 0.25) & (share < 0.5))}; "
        f"50 to 75%, {slowdown((share >= 0.5) & (share < 0.75))}; 75% or more, {slowdown(share >= 0.75)}"
    )


def per_op_residual_s(run: Run, probe_s: float = 3e-6) -> float:
    """The time per operation that, added to every node's own time, would make the prediction from the run's own
    times and message cost (:func:`predicted_with_messages`) equal the run: a linear estimate from that
    prediction and the same with ``probe_s`` added to every node. What the run spent per operation that no
    operation's time holds."""
    from placer.sim.messages import simulate_with_messages

    bound, profiled = placed_profile(run)
    own = run_own_times(run)
    probed = {node: own.get(node, profiled[i]) + probe_s for i, node in enumerate(run.graph.ids)}
    base = predicted_with_messages(run, run)
    more = simulate_with_messages(bound, run_message_cost(run), probed).makespan_s + run.tail_s
    return probe_s * (run.measured_s - base) / (more - base)


def print_residuals(runs: list[Run]) -> None:
    """The step's end the runs measured, and what each run spent per operation beyond its operations' times."""
    tails = [run.tail_s for run in runs if run.tail_s > 0]
    if tails:
        print(
            f"the step's end after the last operation: {statistics.median(tails) * 1e3:.2f} ms (median over "
            f"{len(tails)} runs), {min(tails) * 1e3:.2f} to {max(tails) * 1e3:.2f} ms"
        )
    if not all(run.message_s for run in runs):
        return
    by_plan: dict[str, list[float]] = {}
    for run in runs:
        by_plan.setdefault(run.algorithm, []).append(per_op_residual_s(run))
    print(
        "left per operation, beyond the run's own times, message cost and step end (linear estimate, median "
        "over runs): " + ", ".join(f"{plan} {statistics.median(r) * 1e6:.1f} us" for plan, r in by_plan.items())
    )


def print_round_spread(runs: list[Run]) -> None:
    """With rounds: how far a plan's rounds lie from their median, and the prediction before a run compared with
    each round alone and with the rounds pooled (the machine's noise against the model's gap)."""
    runs = [run for run in runs if len(run.round_step_s) > 1]
    if not runs:
        return
    deviations = [abs(step / statistics.median(run.round_step_s) - 1) for run in runs for step in run.round_step_s]
    ratios = [max(run.round_step_s) / min(run.round_step_s) for run in runs]
    print(
        f"rounds: over {len(runs)} plans, a round's median step lies {statistics.mean(deviations):.1%} from its "
        f"plan's median round on average, the slowest round up to {max(ratios):.2f} times the fastest"
    )
    rounds = min(len(run.round_step_s) for run in runs)
    for key, column, _ in PREDICTIONS[:2]:
        predicted = [table_row(run)[2][key] for run in runs]
        if None in predicted:
            continue
        alone = [
            statistics.mean(abs(p / run.round_step_s[k] - 1) for p, run in zip(predicted, runs)) for k in range(rounds)
        ]
        pooled_error = statistics.mean(abs(p / run.measured_s - 1) for p, run in zip(predicted, runs))
        print(
            f"  predicted ({column}) against each round alone: "
            + ", ".join(f"{e:.1%}" for e in alone)
            + f"; against the rounds pooled: {pooled_error:.1%}"
        )


def before_run_from(run: Run, seconds: dict[str, float]) -> float:
    """``run``'s prediction before a run (calibrated, message cost: :func:`table_row`'s) with its nodes timed
    as in ``seconds`` instead of the record's pooled profile."""
    from placer.cost.profile import Profile, apply_profile

    graph = apply_profile(run.graph, Profile(run.graph.name, run.graph.digest(), "cpu", seconds))
    return (
        step_with_messages(dataclasses.replace(run, graph=graph), run.calibrated_message_cost, None)
        + run.calibrated_barrier_s
    )


def print_profile_choice(runs: list[Run]) -> None:
    """With a profile before every run: the prediction before a run from every profile (the table's), from
    each round's first profile alone, and from the profiles taken just before this plan's runs."""
    runs = [run for run in runs if len(run.profiles) > 1 and run.calibrated_message_cost is not None]
    if not runs:
        return
    choices = {
        "every profile": lambda run: run.profiles,
        "each round's first profile": lambda run: [
            next(p for p in run.profiles if p["round"] == r) for r in sorted({p["round"] for p in run.profiles})
        ],
        "the profiles just before its runs": lambda run: [
            p for p in run.profiles if p["before"] == f"{run.cluster_name} {run.algorithm}"
        ],
    }
    said = []
    for label, chosen in choices.items():
        errors = [before_run_from(run, median_profile(chosen(run))) / run.measured_s - 1 for run in runs]
        said.append(f"{label} ({statistics.mean(len(chosen(run)) for run in runs):.0f} per run) " + mean_errors(errors))
    print(f"before a run (calibrated, message cost), over {len(runs)} runs, profiled from: " + "; ".join(said))


def rounds_from_log(path: str) -> dict[tuple[str, str, str], list[float]]:
    """(model, cluster, plan) -> each round's median step, from a live ``--rounds`` run's printed lines (for
    records older than :attr:`Run.round_step_s`)."""
    pattern = re.compile(r"^(\w+)\s+(\w+)\s+(\w+)\s*: round \d+ of \d+, step ([\d.]+) ms$")
    found: dict[tuple[str, str, str], list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            match = pattern.match(line.strip())
            if match:
                found.setdefault(match.group(1, 2, 3), []).append(float(match.group(4)) / 1e3)
    return found


def print_rank_slowdowns(runs: list[Run]) -> None:
    print("Each rank's operations (those profiled over 50 us), their time in the run over the profile's:")
    spreads, least = [], 0
    for run in runs:
        factors = rank_slowdowns(run)
        print(
            f"  {run.model:12s}{run.cluster_name:6s}{run.algorithm:12s}"
            + "  ".join(f"rank {rank} {factor:.2f}" for rank, factor in factors.items())
        )
        if len(factors) > 1:
            spreads.append(max(factors.values()) / min(factors.values()))
            least += min(factors, key=factors.get) == 0
    if spreads:
        print(
            f"over the {len(spreads)} runs with several such ranks: the slowest rank's factor over the fastest's "
            f"{statistics.median(spreads):.2f} (median), up to {max(spreads):.2f}; rank 0 the fastest in {least}"
        )


def operator_slowdowns(run: Run, totals: dict[str, list[float]]) -> None:
    """Add to ``totals``, per operator (``graph.op``), its nodes' profiled seconds and own seconds in the run."""
    _, profiled = placed_profile(run)
    own = run_own_times(run)
    for i, node in enumerate(run.graph.ids):
        if node in own:
            entry = totals.setdefault(run.graph.op[i], [0.0, 0.0])
            entry[0] += float(profiled[i])
            entry[1] += own[node]


def print_operator_slowdowns(runs: list[Run], top: int = 4) -> None:
    """Per model, over its expert and METIS runs (few messages), the operators whose own time in the runs
    exceeds their profile the most, and the whole step's operations."""
    print(
        "By operator, the expert and METIS runs of each model (few messages): own time in the runs over the "
        "profile's, the operators that lost the most"
    )
    by_model: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        if run.algorithm in ("expert", "metis"):
            operator_slowdowns(run, by_model.setdefault(run.model, {}))
    for model, totals in by_model.items():
        profiled = sum(entry[0] for entry in totals.values())
        ran = sum(entry[1] for entry in totals.values())
        worst = sorted(totals.items(), key=lambda item: item[1][0] - item[1][1])[:top]
        print(
            f"  {model:12s} all {ran / profiled:.2f}x; "
            + ", ".join(
                f"{op} {entry[1] / entry[0]:.2f}x (+{(entry[1] - entry[0]) / ran:.0%} of the ops' time)"
                for op, entry in worst
                if entry[0] > 0
            )
        )


def report(runs: list[Run]) -> None:
    """The tables: each run predicted from its own measurements, then from another plan's run, then how much
    slower each rank computed than profiled."""
    print_table([table_row(run) for run in runs])
    print()
    print_cross(runs)
    with_messages = all(run.message_s for run in runs)
    if with_messages:
        print()
        print_cross(
            runs,
            predicted_with_messages,
            "Predicted from another plan's run (the operations' own "
            "times, the fitted host cost of a message as this plan sends them, the calibrated links)",
        )
    print()
    for label, predict in (
        ("op and transfer times", predicted_from),
        ("ops' own times and message cost", predicted_with_messages),
    ):
        if predict is predicted_from or with_messages:
            right, total = ordered_pairs(runs, predict)
            print(f"the faster of two plans of a case, predicted from a run's {label}: right in {right} of {total}")
    print()
    print_gap_parts(runs)
    print_probe_message_cost(runs)
    print_residuals(runs)
    print_round_spread(runs)
    print_profile_choice(runs)
    print_rank_slowdowns(runs)
    print_message_slowdown(runs)
    print_operator_slowdowns(runs)
    print_traced_slowdowns(runs)


def gap_costs(cost) -> str:
    """``cost``'s fixed host costs by gap, as ``gap us: sending us, receiving us`` pairs."""
    return ", ".join(f"{gap * 1e6:.0f}: {sent * 1e6:.1f}, {received * 1e6:.1f}" for gap, sent, received in cost.by_gap)


def measure(args: argparse.Namespace) -> list[Run]:
    from placer.algorithms import place
    from placer.cluster import load_cluster
    from placer.cost.profile import Profile, apply_profile
    from placer.harness.calibrate import apply_calibration, calibrate
    from placer.harness.profiling import profile_module
    from placer.runtime.distributed import run_distributed
    from placer.runtime.trace import run_trace
    from placer.sim import simulate_plan
    from placer.sim.messages import MessageCost

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    calibration = calibrate("gloo", ranks=2, probe=args.probe)
    link = calibration.links["gloo"]
    cost = calibration.message_cost
    streams = calibration.meta.get("stream_message_cost")
    stream_cost = streams and MessageCost.from_dict(streams)
    streamed = stream_cost or cost  # with --probe, the predictions take the probe's cost
    print(
        f"gloo link: latency {link.latency_s * 1e6:.1f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
        f"(R^2 {link.r2:.3f}); a message's host cost: sending {streamed.send_fixed_s * 1e6:.1f} us + "
        f"{streamed.send_per_byte_s * 1e12:.0f} ps/B, receiving {streamed.receive_fixed_s * 1e6:.1f} us + "
        f"{streamed.receive_per_byte_s * 1e12:.0f} ps/B; in streams (sending, receiving us by us between them) "
        + gap_costs(streamed)
        + f"; an operation right after a message {cost.after_send_s * 1e6:.1f} us longer (sending), "
        f"{cost.after_receive_s * 1e6:.1f} us (receiving), {cost.after_wait_s * 1e6:.1f} us (waiting to receive)"
        + f"; the last rank in a barrier {(calibration.barrier_s or 0.0) * 1e6:.1f} us; "
        f"measured in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    if stream_cost is not None:
        print(
            f"a message's host cost from the probe run ({calibration.meta['probe']['messages']} messages), which "
            f"the predictions before a run take: sending {cost.send_fixed_s * 1e6:.1f} us + "
            f"{cost.send_per_byte_s * 1e12:.0f} ps/B, receiving {cost.receive_fixed_s * 1e6:.1f} us + "
            f"{cost.receive_per_byte_s * 1e12:.0f} ps/B; by gap, the streams' shape scaled to it: " + gap_costs(cost)
        )
    runs = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        captured, flat = captured_model(name)

        def profiled(seconds: dict[str, float]):
            return apply_profile(captured.graph, Profile(captured.graph.name, captured.graph.digest(), "cpu", seconds))

        def profile(round_: int, before: str) -> dict[str, float]:
            seconds = profile_module(
                captured.gm, [t.clone() for t in flat], repeats=5, warmup=1, node_ids=set(captured.graph.ids)
            )
            profiles.append({"round": round_, "before": before, "seconds": seconds})
            return seconds

        profiles, jobs = [], []  # jobs: (cluster name, cluster, algorithm, plan, its runs)
        for round_ in range(args.rounds):
            # The machine's speed moves over seconds (docs/benchmarks.md, "Fidelity"): rounds spread the
            # runs over time, and a profile before every run spreads the profiles over the same seconds.
            if round_ == 0:  # the plans come from the first profile
                first = profile(0, "")
                for cluster_name in args.clusters.split(","):
                    cluster = apply_calibration(load_cluster(cluster_name), calibration)
                    for algorithm in args.plans.split(","):
                        try:
                            plan = place(profiled(first), cluster, algorithm)
                        except ImportError as exc:  # e.g. metis without pymetis installed
                            print(f"{name:8s} {cluster_name:6s} {algorithm:11s}: skipped ({exc})")
                            continue
                        jobs.append((cluster_name, cluster, algorithm, plan, []))
                if jobs:  # the plans' profile is also the one before the first run
                    profiles[0]["before"] = f"{jobs[0][0]} {jobs[0][2]}"
            for index, (cluster_name, cluster, algorithm, plan, rounds) in enumerate(jobs):
                if round_ > 0 or index > 0:  # the first run follows the plans' profile
                    profile(round_, f"{cluster_name} {algorithm}")
                rounds.append(
                    run_distributed(
                        captured.gm,
                        captured.graph,
                        plan,
                        cluster,
                        flat,
                        steps=args.steps,
                        carrier=captured.carrier,
                        timeout_s=120,
                    )
                )
                if args.rounds > 1:
                    print(
                        f"{name:8s} {cluster_name:6s} {algorithm:11s}: round {round_ + 1} of {args.rounds}, step "
                        f"{statistics.median(rounds[-1].step_s[WARMUP_STEPS:]) * 1e3:.2f} ms",
                        flush=True,
                    )
        graph = profiled(median_profile(profiles))
        for cluster_name, cluster, algorithm, plan, rounds in jobs:
            if len(profiles) > 1:  # predicted from every profile
                plan.predicted = simulate_plan(plan, graph, cluster).predicted()
            run = Run(
                name,
                cluster_name,
                algorithm,
                graph,
                cluster,
                plan,
                **pooled(rounds),
                calibrated_message_cost=calibration.message_cost,
                calibrated_barrier_s=calibration.barrier_s or 0.0,
                trace_events=run_trace(rounds[-1].timeline, cluster)["traceEvents"],
                stream_message_cost=stream_cost,
                profiles=profiles,
            )
            if args.record:
                record_run(args.record, run, rounds[-1])
            runs.append(run)
            _, measured, predicted = table_row(run)
            said = [
                f"{column} {predicted[key] * 1e3:.2f} ms ({(predicted[key] - measured) / measured:+.1%})"
                for key, column, _ in PREDICTIONS
                if predicted[key] is not None
            ]
            print(
                f"{name:8s} {cluster_name:6s} {algorithm:11s}: measured {measured * 1e3:8.2f} ms; predicted "
                + ", ".join(said),
                flush=True,
            )
    return runs


def median_profile(profiles: list[dict]) -> dict[str, float]:
    """Each node's median over ``profiles`` (:attr:`Run.profiles`' entries)."""
    return {node: statistics.median(p["seconds"][node] for p in profiles) for node in profiles[0]["seconds"]}


def pooled(rounds: list) -> dict[str, Any]:
    """One plan's runs in rounds as one :class:`Run`'s ``step_s, op_s, transfer_s, op_message_s, message_s,
    tail_s, round_step_s``.

    Every round's steps after its warm-up (the first round's warm-up kept first, as :attr:`Run.measured_s`
    expects), each node's median over the rounds, every transfer and message of every round, the median
    round's step end, and each round's median step.
    """
    first = rounds[0]
    step_s = list(first.step_s) + [s for result in rounds[1:] for s in result.step_s[WARMUP_STEPS:]]

    def per_node(field: str) -> dict:
        return {
            node: statistics.median(getattr(result, field)[node] for result in rounds if node in getattr(result, field))
            for node in getattr(first, field)
        }

    return {
        "step_s": step_s,
        "op_s": per_node("op_s"),
        "op_message_s": per_node("op_message_s"),
        "transfer_s": [t for result in rounds for t in result.transfer_s],
        "message_s": [m for result in rounds for m in result.message_s],
        "tail_s": statistics.median(result.tail_s for result in rounds),
        "round_step_s": [statistics.median(result.step_s[WARMUP_STEPS:]) for result in rounds],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help=f"steps per run (the first {WARMUP_STEPS} are warm-up)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--clusters", default="2xcpu,4xcpu", help="comma-separated cpu presets")
    parser.add_argument("--plans", default=",".join(PLANS), help="comma-separated registered algorithms")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every plan (each after a profile) this many times per model; each plan's steps "
        "and op times pooled over the rounds, its prediction from every profile",
    )
    parser.add_argument("--record", help="folder to keep what each run measured (and its traces) in")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="calibrate a message's host cost with a probe run (placer calibrate --probe); the "
        "replay then also shows the prediction with the streams' cost",
    )
    parser.add_argument(
        "--replay",
        help="a --record folder or archive, or several, comma-separated (one sample "
        "measured in parts): predict their runs again, run nothing",
    )
    parser.add_argument(
        "--rounds-log",
        help="with --replay: a live --rounds run's output, for the rounds of a record made before records kept them",
    )
    parser.add_argument(
        "--calibration",
        help="with --replay: a `placer calibrate` file whose message cost and "
        "barrier the predictions before the runs take, instead of the recorded",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")

    if args.replay:
        print(f"replaying the runs recorded in {args.replay} with this code's cost model")
        runs = [run for source in args.replay.split(",") for run in recorded_runs(source)]
        if args.rounds_log:
            logged = rounds_from_log(args.rounds_log)
            for run in runs:
                run.round_step_s = run.round_step_s or logged.get((run.model, run.cluster_name, run.algorithm), [])
        if args.calibration:
            from placer.errors import PlacerError
            from placer.harness.calibrate import load_calibration

            try:
                calibration = load_calibration(args.calibration)
            except PlacerError as exc:
                parser.error(str(exc))
            if calibration.message_cost is None:
                parser.error(f"--calibration {args.calibration}: it has no message cost (a gloo calibration has)")
            for run in runs:
                run.calibrated_message_cost = calibration.message_cost
                run.calibrated_barrier_s = calibration.barrier_s or 0.0
        report(runs)
        print(
            f"reproduce: PYTHONPATH=. python bench/fidelity.py --replay {args.replay}"
            + (f" --rounds-log {args.rounds_log}" if args.rounds_log else "")
            + (f" --calibration {args.calibration}" if args.calibration else "")
        )
        return 0
    runs = measure(args)
    print()
    report(runs)
    print(f"load average now {os.getloadavg()[0]:.1f}")
    print(
        f"reproduce: PYTHONPATH=. python bench/fidelity.py --steps {args.steps} --models {args.models} "
        f"--clusters {args.clusters} --plans {args.plans} --rounds {args.rounds}"
        + (" --probe" if args.probe else "")
        + (f" --record {args.record}" if args.record else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
