"""Celeritas: its Table 3 goals, fusion (the Table 2 columns) and plan time.

    ./run.sh bench bench/celeritas.py              # or: python bench/celeritas.py [--sizes 1k,10k,30k,100k]
                                                   #     [--transformer-layers 64] [--zoo inception_v3,...]
                                                   #     [--goals / --no-goals]

Goals (the paper's Table 3, on the reference model): Inception-v3 (batch 64),
GNMT (128) and Transformer (32), captured with Adam, over ``4xV100-nvlink``
and ``4xGPU-pcie``: the simulated step of ``celeritas`` against m-SCT, m-ETF,
m-TOPO and Order-Place; and RNNLM (batch 128) over ``2xV100-nvlink`` against
the expert split. Then:

For each graph: nodes and CCR before and after Optimal Operation Fusion
(R = 200, M = 0.25 of a device's memory; CCR = summed transfer time over
summed compute, Equation 1, on the cluster's mean link), the fusion time,
then the wall time of a whole ``place()`` call (fusion, placement, the
reference-model checks) and the simulated step time of the plan, for
``celeritas``, ``order_place`` and ``expert`` on 4xV100-nvlink.

Graphs:
- a captured transformer: one Adam training step of a stack of
  ``torch.nn.TransformerEncoderLayer`` (d_model 1024, 16 heads, pre-norm)
  between a 32k-token embedding and output layer, batch 8 x 256 tokens, built on
  the meta device and captured by placer.capture (64 layers: ~30k operations,
  ~32 GiB of memory on one device);
- synthetic training steps (placer.generate.training_graph, 3 parallel
  branches per block) whose parameters (about 24 GiB in all) and activations
  (about 6 GiB) do not fit one 16 GiB V100, at about 1k, 10k, 30k and 100k
  operations;
- zoo models named with ``--zoo``, captured at their paper batch size.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time

import numpy as np

from placer import load_cluster, place
from placer.errors import PlacerError
from placer.generate import training_graph
from placer.graph import OpGraph
from placer.transform.fusion import fuse

SIZES = {"1k": 71, "10k": 715, "30k": 2143, "100k": 7142}  # blocks of 3 branches -> ~1k .. ~100k nodes
ALGORITHMS = ("celeritas", "order_place", "expert")
#: (zoo model, batch, clusters, algorithms celeritas must beat)
GOALS = [
    (model, batch, ("4xV100-nvlink", "4xGPU-pcie"), ("m_sct", "m_etf", "m_topo", "order_place"))
    for model, batch in (("inception_v3", 64), ("gnmt", 128), ("transformer", 32))
]
GOALS.append(("rnnlm", 128, ("2xV100-nvlink",), ("expert",)))


def goals() -> None:
    """Print the goal table: each case's steps in ms, and whether celeritas beats every rival."""
    from placer.capture import capture_spec

    print("goal: celeritas's simulated step (ms) below each rival's (RNNLM: no slower than the expert split)")
    print(f"{'model':>14} {'cluster':>14} {'celeritas':>10} {'plan s':>7} | rivals (ms) | met")
    for model, batch, clusters, rivals in GOALS:
        graph = capture_spec(f"zoo:{model}", batch, optimizer="adam", fake=True).graph
        for name in clusters:
            cluster = load_cluster(name)
            began = time.perf_counter()
            ours = place(graph, cluster, "celeritas")
            took = time.perf_counter() - began
            steps = {}
            for rival in rivals:
                try:
                    steps[rival] = place(graph, cluster, rival).predicted["makespan_s"]
                except PlacerError:
                    steps[rival] = float("inf")
            mine = ours.predicted["makespan_s"]
            met = all(mine <= s if rival == "expert" else mine < s for rival, s in steps.items())
            stats = ours.extra["celeritas"]
            print(
                f"{f'{model}-bs{batch}':>14} {name:>14} {mine * 1e3:10.1f} {took:7.1f} | "
                + " ".join(f"{r} {s * 1e3:.1f}" for r, s in steps.items())
                + f" | {'yes' if met else 'no'}  ({stats['policy']}, {stats['layout']}, R={stats['exploration_range']}"
                + ("" if stats["charge_pushes"] else ", uncharged")
                + (", Eq. 7" if stats["timing"] == "paper" else "")
                + f", {stats['order']} order, {stats['moves']} moves)",
                flush=True,
            )


def generated(blocks: int) -> OpGraph:
    """A training step with ~24 GiB of parameters and ~6 GiB of activations over ``blocks`` blocks."""
    branch_ops = 3 * blocks
    return training_graph(
        layers=blocks,
        branches=3,
        seed=0,
        param_mib=24 * 1024 / branch_ops,
        activation_mib=6 * 1024 / branch_ops,
        name=f"synthetic-{blocks}x3",
    )


def transformer(layers: int) -> OpGraph:
    """The captured training step of a ``layers``-deep transformer language model (see the module docstring)."""
    import torch
    from torch import nn

    from placer.capture import capture

    class LanguageModel(nn.Module):
        def __init__(self, depth: int, width: int = 1024, heads: int = 16, vocab: int = 32000):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True, norm_first=True)
                for _ in range(depth)
            )
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())

    torch.manual_seed(0)
    with torch.device("meta"):
        model = LanguageModel(layers)
        tokens = torch.zeros(8, 256, dtype=torch.long)
    return capture(model, (tokens, tokens), optimizer="adam", name=f"transformer-{layers}L").graph


def zoo_graphs(names: list[str]) -> list[OpGraph]:
    """Zoo models captured at their paper batch size."""
    from placer.capture import capture_spec
    from placer.capture.zoo import ZOO

    return [capture_spec(f"zoo:{name}", ZOO[name].paper_batch, fake=True).graph for name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(SIZES), help="generated sizes to run, from " + ",".join(SIZES))
    parser.add_argument(
        "--transformer-layers", type=int, default=64, help="layers of the captured transformer (0: none)"
    )
    parser.add_argument("--zoo", default="", help="zoo models to capture, comma-separated")
    parser.add_argument(
        "--goals",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the goal table first (Table 3 models against the list schedulers)",
    )
    args = parser.parse_args()
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    if args.goals:
        goals()
    cluster = load_cluster("4xV100-nvlink")
    graphs = []
    if args.transformer_layers:
        began = time.perf_counter()
        graphs.append(transformer(args.transformer_layers))
        print(f"captured {graphs[-1].name} in {time.perf_counter() - began:.1f} s")
    graphs += zoo_graphs([name for name in args.zoo.split(",") if name])
    graphs += [generated(SIZES[s]) for s in args.sizes.split(",") if s]
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}; cluster {cluster.name}")
    print("times: wall seconds / CPU seconds of this process (the machine is shared); step: simulated step time")
    print(
        f"{'graph':>18} {'nodes':>7} {'CCR':>6} {'fused':>6} {'CCR':>6} {'fuse s':>11} | "
        + " | ".join(f"{a + ' s':>13} {'step':>7}" for a in ALGORITHMS)
    )
    for graph in graphs:
        wall, cpu = time.perf_counter(), time.process_time()
        fused = fuse(graph, cluster)
        cells = [f"{time.perf_counter() - wall:5.2f}/{time.process_time() - cpu:5.2f}"]
        for algorithm in ALGORITHMS:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                step = f"{place(graph, cluster, algorithm).predicted['makespan_s']:7.4f}"
            except PlacerError as exc:
                step = f"{'failed':>7}"
                print(f"  {algorithm} on {graph.name}: {exc}")
            cells.append(f"{time.perf_counter() - wall:6.2f}/{time.process_time() - cpu:6.2f} {step}")
        print(
            f"{graph.name:>18} {graph.num_nodes:>7} {fused.ccr_before:>6.2f} {fused.num_clusters:>6} "
            f"{fused.ccr_after:>6.2f} {cells[0]:>11} | " + " | ".join(cells[1:])
        )
    print(f"reproduce: ./run.sh bench bench/celeritas.py {shlex.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
