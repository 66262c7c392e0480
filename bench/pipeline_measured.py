"""Placer's pipelines against ``torch.distributed.pipelining``, measured on gloo CPU ranks.

For each model (a chain of blocks) and CPU preset (``2xcpu``, ``4xcpu``: one
gloo process per rank, one intra-op thread each), with the same model,
batch, ``M`` micro-batches (default twice the ranks), optimizer and stages:

1. ``eager``: one process, one thread, no parallelism (``bench/ddp.py``'s);
2. ``torch``: ``torch.distributed.pipelining``'s ``Schedule1F1B``, one
   ``PipelineStage`` per rank (:func:`placer.runtime.pipelining.run_pipelining`),
   the model cut by hand into ``K`` stages of contiguous blocks, the cut that
   balances the blocks' profiled times (the fewest seconds on the slowest stage);
3. ``1f1b``: placer's ``1f1b`` plan with the same cut
   (``place(..., "1f1b", microbatches=M, stages=...)``), run by the distributed
   executor (:func:`placer.runtime.distributed.run_distributed`);
4. ``best``: placer's fastest micro-batched plan by the simulator with each
   message's host cost (as ``auto`` ranks plans on a calibrated cluster), of
   ``gpipe`` and ``1f1b`` (their own cuts and the hand cut), ``m_etf`` and
   ``heft`` with ``M`` micro-batches, run the same way (where it is the
   ``1f1b`` plan, that plan's measurement serves both).

The models: ``resnet`` (ResNet-26 bottleneck blocks with batch norm, the
stem and the head as blocks of their own) and ``vgg`` (VGG-19, a block per
convolution), 32x32 images; ``rnnlm`` (a block per LSTM layer; its placed step
sends every time step's state between stages, and runs minutes) on request.

Every engine runs once per round (``--rounds``), in turn, so that the
machine's speed, which moves over seconds, weighs on all alike; a measured
step is the median of every round's steps after the warm-up, barrier to
barrier. Plans are made, before any run, on the step's graph profiled on this
CPU, scaled by the contention of as many processes at once as the preset has
ranks, and the preset with its gloo link calibrated on as many ranks, as
``bench/ddp.py`` makes them (whose helpers this script uses): the plan's
simulated step is the prediction. The contention charges every rank as if
all were busy, which a pipeline's bubbles are not (``--no-contention``: the
profile alone). ``torch``'s prediction is that of the
``1f1b`` plan, which has its stages and schedule.

Goals (issue: measured pipelines): placer's ``1f1b`` step at most 1.10x
torch's, its best plan's below torch's, and every prediction of a placer plan
within 15% of its measured step. Prints a Markdown table and writes it, with
the numbers, to ``--output``::

    ./run.sh bench bench/pipeline_measured.py [--models resnet,vgg] [--clusters 2xcpu,4xcpu]
        [--microbatches 0] [--steps 6] [--warmup 2] [--rounds 3] [--profiles 3] [--no-contention]
        [--output bench/data/pipeline-measured.json]

Run it on a quiet machine: another job's load during the runs, and not during
the measurement of contention, is what no prediction sees (the record keeps
the machine's core count and load).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from ddp import (  # noqa: E402  (bench/ddp.py's)
    add_run_options,
    busy_split,
    calibrated_clusters,
    calibration_record,
    contended_graphs,
    eager_steps,
    fixed_share,
    median_after,
    ms,
    step_profile,
    with_messages_s,
    write_record,
)


class Piece(NamedTuple):
    """A block of a chain model: the layer names of its operations (the first starts it, as ``stages=``
    names a stage) and how it maps its input to its output."""

    layers: tuple[str, ...]
    run: Callable[[nn.Module, torch.Tensor], torch.Tensor]


class Chain(NamedTuple):
    """A zoo model as a chain of blocks: its spec, batch, blocks and the loss of the last block's output."""

    spec: str
    batch: int
    pieces: Callable[[nn.Module], list[Piece]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def resnet_pieces(model: nn.Module) -> list[Piece]:
    """The stem, every bottleneck block, the head (pooling, ``fc``)."""
    pieces = [Piece(("conv1", "bn1"), lambda m, x: F.max_pool2d(F.relu(m.bn1(m.conv1(x))), 3, 2, 1))]
    for stage in range(model.stages):
        for index in range(len(getattr(model, f"layer{stage + 1}"))):
            name = f"layer{stage + 1}.{index}"
            pieces.append(Piece((name,), lambda m, x, s=stage + 1, i=index: getattr(m, f"layer{s}")[i](x)))
    pieces.append(Piece(("fc",), lambda m, x: m.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))))
    return pieces


def vgg_pieces(model: nn.Module) -> list[Piece]:
    """Every convolution with its ReLU (and the pooling after it), the head (pooling, the classifier)."""
    features = list(model.features)
    pieces = []
    for i, layer in enumerate(features):
        if isinstance(layer, nn.Conv2d):
            end = i + 3 if i + 2 < len(features) and isinstance(features[i + 2], nn.MaxPool2d) else i + 2
            names = tuple(f"features.{j}" for j in range(i, end))
            pieces.append(Piece(names, lambda m, x, a=i, b=end: m.features[a:b](x)))
    pieces.append(Piece(("avgpool", "classifier"), lambda m, x: m.classifier(m.avgpool(x).flatten(1))))
    return pieces


def _lstm_layer(model: nn.Module, index: int, x: torch.Tensor) -> torch.Tensor:
    """LSTM layer ``index`` of an RNNLM over the whole sequence, from a zero state."""
    layer = model.lstm.layers[index]
    zeros = x.new_zeros(x.shape[0], model.lstm.hidden)
    state, outputs = (zeros, zeros), []
    for t in range(x.shape[1]):
        out, state = layer(x[:, t], state)
        outputs.append(out)
    return torch.stack(outputs, dim=1)


def rnnlm_pieces(model: nn.Module) -> list[Piece]:
    """The embedding, every LSTM layer, the classifier."""
    pieces = [Piece(("embedding",), lambda m, x: m.dropout(m.embedding(x)))]
    for index in range(len(model.lstm.layers)):
        pieces.append(Piece((f"lstm.layers.{index}",), lambda m, x, i=index: _lstm_layer(m, i, x)))
    pieces.append(Piece(("classifier",), lambda m, x: m.classifier(x)))
    return pieces


# name -> chain: steps of hundreds of milliseconds on one core, blocks of similar weight. Dropout off.
MODELS = {
    "resnet": Chain(
        "zoo:resnet50?depth=26&image_size=32&width=16&classes=10", 32, resnet_pieces, lambda y, t: F.cross_entropy(y, t)
    ),
    "vgg": Chain(
        "zoo:vgg19?image_size=32&width=16&hidden=256&classes=10&dropout=0",
        32,
        vgg_pieces,
        lambda y, t: F.cross_entropy(y, t),
    ),
    "rnnlm": Chain(
        "zoo:rnnlm?layers=4&hidden=256&vocab=2000&seq_len=8&dropout=0",
        32,
        rnnlm_pieces,
        lambda y, t: F.cross_entropy(y.flatten(0, 1), t.flatten()),
    ),
}
DEFAULT_MODELS = "resnet,vgg"
#: Placer's candidates for its best micro-batched plan: (algorithm, with the hand cut).
CANDIDATES = (("1f1b", True), ("gpipe", True), ("1f1b", False), ("gpipe", False), ("m_etf", False), ("heft", False))
ENGINES = ("torch", "1f1b", "best")
#: The goals, as ratios.
ONE_F_ONE_B_OVER_TORCH = 1.10
BEST_OVER_TORCH = 1.00
PREDICTION_ERROR = 0.15


class Stage(nn.Module):
    """Blocks ``pieces`` of ``model`` in turn: a stage of a pipeline torch's way (the model whole, its
    other blocks unused)."""

    def __init__(self, model: nn.Module, pieces: list[Piece]):
        super().__init__()
        self.model = model
        self.pieces = pieces

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for piece in self.pieces:
            x = piece.run(self.model, x)
        return x


def piece_seconds(graph, seconds: dict[str, float], pieces: list[Piece]) -> list[float]:
    """Each block's profiled seconds: its operations', by their layer names (unnamed ones left out)."""
    total = [0.0] * len(pieces)
    owner = {}
    for k, piece in enumerate(pieces):
        for layer in piece.layers:
            owner[layer] = k
    for node, layer in zip(graph.ids, graph.layer):
        if layer is None:
            continue
        parts = layer.split(".")
        for n in range(len(parts), 0, -1):
            k = owner.get(".".join(parts[:n]))
            if k is not None:
                total[k] += seconds[node]
                break
    return total


def balanced_cut(costs: list[float], stages: int) -> list[int]:
    """The first block of each stage, for the cut into ``stages`` contiguous stages whose slowest is the
    fastest (ties: the earliest cut)."""
    best, found = float("inf"), None
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        bounds = [0, *cuts, len(costs)]
        slowest = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
        if slowest < best:
            best, found = slowest, bounds[:-1]
    return found


def measure_case(name: str, clusters: dict, args: argparse.Namespace, began: float) -> list[dict]:
    from placer.algorithms import place
    from placer.capture import capture
    from placer.capture.spec import load_model
    from placer.cost.profile import apply_profile
    from placer.errors import PlacerError
    from placer.runtime.distributed import run_distributed
    from placer.runtime.pipelining import run_pipelining
    from placer.runtime.replicas import replica_steps

    def say(text: str) -> None:
        print(f"[{time.perf_counter() - began:6.0f} s] {name:7s} {text}", flush=True)

    chain = MODELS[name]
    torch.manual_seed(0)
    model, inputs = load_model(chain.spec, chain.batch)
    data, target = inputs[0], inputs[-1]
    pieces = chain.pieces(model)
    with torch.no_grad():  # the blocks are the model
        whole, chained = model(*inputs), chain.loss(Stage(model, pieces)(data), target)
    if not torch.allclose(whole, chained, rtol=1e-5, atol=1e-6):
        raise SystemExit(f"{name}: its blocks compute a loss of {float(chained)}, the model {float(whole)}")
    captured = capture(copy.deepcopy(model), inputs, optimizer=args.optimizer, lr=0.01)
    optimizer = captured.optimizer.eager(model.parameters())
    flat = captured.step_inputs(model, inputs, optimizer)
    ranks = max(cluster.num_devices for cluster, _ in clusters.values())
    smallest = max(1, chain.batch // (args.microbatches or 2 * ranks))  # a micro-batch's rows
    profile, _ = step_profile(chain.spec, chain.batch, captured, model, inputs, args, smallest)
    graph = apply_profile(captured.graph, profile)
    costs = piece_seconds(graph, profile.node_seconds, pieces)
    say(
        f"batch {chain.batch}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"{graph.num_nodes} operations, {len(pieces)} blocks; profiled: {profile.total_s * 1e3:.1f} ms of operations"
        + fixed_share(profile)
    )
    graphs, contentions = contended_graphs(chain.spec, chain.batch, captured.graph, profile, clusters, args, say)
    setups: dict[str, dict[str, Any]] = {}
    for cluster_name, (cluster, calibration) in clusters.items():
        graph = graphs[cluster_name]
        k = cluster.num_devices
        m = args.microbatches or 2 * k
        starts = balanced_cut(costs, k)
        cut = ",".join(pieces[s].layers[0] for s in starts[1:])
        bounds = [*starts, len(pieces)]
        stages = [Stage(model, pieces[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        candidates, ranked = {}, {}
        for algorithm, hand in CANDIDATES:
            label = f"{algorithm}@cut" if hand else algorithm
            options = {"stages": cut} if hand else {}
            t0 = time.perf_counter()
            try:
                plan = place(graph, cluster, algorithm, microbatches=m, **options)
            except PlacerError as exc:
                say(f"{cluster_name} {label}: no plan ({str(exc).splitlines()[0]})")
                continue
            candidates[label] = plan
            # Ranked as auto ranks plans on a calibrated cluster: with each message's host cost.
            ranked[label] = with_messages_s(plan, graph, cluster, calibration) or plan.predicted["makespan_s"]
            say(
                f"{cluster_name} {label}: planned in {time.perf_counter() - t0:.1f} s, predicted "
                f"{plan.predicted['makespan_s'] * 1e3:.1f} ms, {ranked[label] * 1e3:.1f} ms with its messages"
            )
        best = min(candidates, key=ranked.get)
        plans = {"1f1b": candidates["1f1b@cut"], "best": candidates[best]}
        setups[cluster_name] = {
            "microbatches": m,
            "cut": cut,
            "stage_seconds": [sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])],
            "stages": stages,
            "plans": plans,
            "best": best,
            "traced": {key: replica_steps(captured, plan) for key, plan in plans.items()},
            "candidates": {label: plan.predicted["makespan_s"] for label, plan in candidates.items()},
            "candidates_with_messages": ranked,
        }
        say(f"{cluster_name}: {m} micro-batches, stages from {cut}; best plan {best}")
    rounds: dict[tuple[str, str], list[list[float]]] = {}
    splits: dict[tuple[str, str], list[dict]] = {}
    predicted: dict[tuple[str, str], float] = {}
    steps = args.warmup + args.steps
    for round_ in range(args.rounds):
        said = f" (round {round_ + 1} of {args.rounds})" if args.rounds > 1 else ""
        step_list = eager_steps(model, inputs, captured.optimizer, args.steps, args.warmup)
        rounds.setdefault(("", "eager"), []).append(step_list)
        say(f"eager{said}: {statistics.median(step_list) * 1e3:.1f} ms")
        for cluster_name, (cluster, _) in clusters.items():
            setup = setups[cluster_name]
            for engine in ENGINES:
                if engine == "best" and setup["best"] == "1f1b@cut":
                    continue  # the plan measured as 1f1b
                if engine == "torch":
                    result = run_pipelining(
                        setup["stages"],
                        (data,),
                        target,
                        chain.loss,
                        captured.optimizer,
                        setup["microbatches"],
                        schedule="1f1b",
                        steps=steps,
                        timeout_s=args.timeout,
                    )
                    extra = ""
                else:
                    plan = setup["plans"][engine]
                    result = run_distributed(
                        captured.gm,
                        graphs[cluster_name],
                        plan,
                        cluster,
                        flat,
                        steps=steps,
                        carrier=captured.carrier,
                        threads=1,
                        timeout_s=args.timeout,
                        replica_steps=setup["traced"][engine],
                    )
                    measured = median_after(result.step_s, args.warmup)
                    splits.setdefault((cluster_name, engine), []).append(busy_split(result, plan, cluster, measured))
                    predicted[cluster_name, engine] = result.predicted_s
                    extra = f", predicted {result.predicted_s * 1e3:.1f} ms ({(result.predicted_s - measured) / measured:+.1%})"
                rounds.setdefault((cluster_name, engine), []).append(result.step_s[args.warmup :])
                say(f"{cluster_name} {engine}{said}: {median_after(result.step_s, args.warmup) * 1e3:.1f} ms{extra}")

    def step_s(key: tuple[str, str]) -> float:
        return statistics.median(s for steps_ in rounds[key] for s in steps_)

    for cluster_name in clusters:
        if setups[cluster_name]["best"] == "1f1b@cut":
            for table_ in (rounds, splits, predicted):
                table_[cluster_name, "best"] = table_[cluster_name, "1f1b"]

    cases = []
    for cluster_name, (cluster, _) in clusters.items():
        setup = setups[cluster_name]
        case: dict[str, Any] = {
            "model": name,
            "spec": chain.spec,
            "batch": chain.batch,
            "cluster": cluster_name,
            "ranks": cluster.num_devices,
            "microbatches": setup["microbatches"],
            "cut": setup["cut"],
            "stage_profiled_s": setup["stage_seconds"],
            "profiled_s": profile.total_s,
            "contention": contentions[cluster_name].to_dict() if cluster_name in contentions else None,
            "eager_s": step_s(("", "eager")),
            "best_plan": setup["best"],
            "candidates_predicted_s": setup["candidates"],
            "candidates_with_messages_s": setup["candidates_with_messages"],
            "torch": {
                "measured_s": step_s((cluster_name, "torch")),
                "rounds_s": [statistics.median(r) for r in rounds[cluster_name, "torch"]],
                "predicted_s": predicted[cluster_name, "1f1b"],
            },
        }
        for engine in ("1f1b", "best"):
            split = splits[cluster_name, engine]
            case[engine] = {
                "measured_s": step_s((cluster_name, engine)),
                "rounds_s": [statistics.median(r) for r in rounds[cluster_name, engine]],
                "predicted_s": predicted[cluster_name, engine],
                "busiest": {key: statistics.median(one[key] for one in split) for key in split[0] if key != "rank"},
            }
        case["1f1b_over_torch"] = case["1f1b"]["measured_s"] / case["torch"]["measured_s"]
        case["best_over_torch"] = case["best"]["measured_s"] / case["torch"]["measured_s"]
        case["best_over_1f1b"] = case["best"]["measured_s"] / case["1f1b"]["measured_s"]
        cases.append(case)
    return cases


def error(entry: dict) -> float:
    return abs(entry["predicted_s"] - entry["measured_s"]) / entry["measured_s"]


def table(cases: list[dict]) -> str:
    """The Markdown table: measured steps (predictions in brackets), the goals' ratios."""
    lines = [
        "| model | ranks | M | eager | torch 1F1B (pred) | placer 1f1b (pred) | placer best (pred) | 1f1b/torch | "
        "best/torch | error 1f1b, best |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for c in cases:
        cells = [f"{ms(c[e]['measured_s'])} ({ms(c[e]['predicted_s'])})" for e in ENGINES]
        cells[2] = f"{c['best_plan']}: {cells[2]}"
        lines.append(
            f"| {c['model']} | {c['ranks']} | {c['microbatches']} | {ms(c['eager_s'])} | "
            + " | ".join(cells)
            + f" | {c['1f1b_over_torch']:.2f} | {c['best_over_torch']:.2f} | "
            f"{error(c['1f1b']):.0%}, {error(c['best']):.0%} |"
        )
    return "\n".join(lines)


def goals(cases: list[dict]) -> list[str]:
    """What each goal says over the cases."""
    said = []
    for key, goal, what, strict in (
        ("1f1b_over_torch", ONE_F_ONE_B_OVER_TORCH, "placer 1f1b / torch 1F1B <=", False),
        ("best_over_torch", BEST_OVER_TORCH, "placer best / torch 1F1B <", True),
    ):
        met = sum(c[key] < goal if strict else c[key] <= goal for c in cases)
        said.append(f"{what} {goal:.2f}: {met} of {len(cases)} cases (worst {max(c[key] for c in cases):.2f})")
    errors = [error(c[e]) for c in cases for e in ("1f1b", "best")]
    said.append(
        f"|predicted - measured| / measured <= {PREDICTION_ERROR:.2f} (placer's plans): "
        f"{sum(e <= PREDICTION_ERROR for e in errors)} of {len(errors)} runs "
        f"(mean {statistics.mean(errors):.1%}, worst {max(errors):.1%})"
    )
    torch_errors = [error(c["torch"]) for c in cases]
    said.append(
        f"torch 1F1B against the 1f1b plan's prediction: mean {statistics.mean(torch_errors):.1%}, "
        f"worst {max(torch_errors):.1%}"
    )
    return said


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"of {', '.join(MODELS)}")
    parser.add_argument("--clusters", default="2xcpu,4xcpu", help="CPU presets (gloo ranks)")
    parser.add_argument("--microbatches", type=int, default=0, help="M; 0: twice the ranks")
    add_run_options(parser, steps=6, rounds=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="longest a rank waits for another, seconds")
    parser.add_argument("--output", default="bench/data/pipeline-measured.json", help="the record ('' for none)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}: one of {', '.join(MODELS)}")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1 or args.profiles < 1 or args.microbatches < 0:
        parser.error("--steps, --rounds and --profiles must be >= 1, --warmup and --microbatches >= 0")
    torch.set_num_threads(1)
    command = (
        f"./run.sh bench bench/pipeline_measured.py --models {','.join(models)} --clusters {args.clusters} "
        f"--microbatches {args.microbatches} --steps {args.steps} --warmup {args.warmup} --rounds {args.rounds} "
        f"--profiles {args.profiles} --optimizer {args.optimizer}"
        + (" --no-contention" if args.no_contention else "")
        + (" --no-fixed-part" if args.no_fixed_part else "")
        + (f" --output {args.output}" if args.output else "")
    )
    load = os.getloadavg()[0]
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPU cores, load average "
        f"{load:.1f}; {args.optimizer}, {args.steps} steps after {args.warmup}",
        flush=True,
    )
    began = time.perf_counter()
    clusters = calibrated_clusters([c.strip() for c in args.clusters.split(",") if c.strip()], began)
    for name, (cluster, _) in clusters.items():
        if cluster.num_devices < 2:
            parser.error(f"{name}: a pipeline needs at least 2 ranks")
    cases = []
    for name in models:
        cases.extend(measure_case(name, clusters, args, began))
    elapsed = time.perf_counter() - began
    text = table(cases)
    print()
    print(
        f"Steps in ms (median of {args.rounds} x {args.steps} after {args.warmup} each); pred: the simulator's "
        f"step for the plan, profiled and calibrated before the runs (torch's: the 1f1b plan's, its stages and "
        f"schedule); {args.optimizer}; {os.cpu_count()} CPU cores, load average {load:.1f} at the start"
    )
    print()
    print(text)
    print()
    for line in goals(cases):
        print(line)
    print()
    print(f"{elapsed:.0f} s in all")
    print(f"reproduce: {command}")
    if args.output:
        record = {
            "what": "placer's pipelines against torch.distributed.pipelining's Schedule1F1B (bench/pipeline_measured.py)",
            "command": command,
            "torch": torch.__version__,
            "cpu_cores": os.cpu_count(),
            "load_average": load,
            "optimizer": args.optimizer,
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "profiles": args.profiles,
            "calibration": calibration_record(clusters),
            "seconds": elapsed,
            "cases": cases,
            "table": text,
            "goals": goals(cases),
        }
        write_record(args.output, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
