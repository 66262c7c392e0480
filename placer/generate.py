"""Synthetic graphs: training steps of layered models and random DAGs.

They need no PyTorch, so tests, benchmarks and the bundled example use them
at any size (10 to 100k+ nodes), reproducibly for a seed.
"""

from __future__ import annotations

import numpy as np

from .cluster import Channel, Cluster, Device, load_cluster
from .graph import OpGraph

__all__ = ["training_graph", "random_dag", "contract_cases", "with_device_kinds"]

GiB = 1 << 30

MiB = 1 << 20


def training_graph(
    layers: int = 8,
    branches: int = 2,
    *,
    seed: int = 0,
    batch: int = 32,
    param_mib: float = 16.0,
    activation_mib: float = 8.0,
    flop_s: float = 1.2e13,
    name: str | None = None,
) -> OpGraph:
    """One training step of a model made of ``layers`` blocks of ``branches`` parallel ops.

    Forward: each block fans out from the previous join into ``branches`` ops
    (each holding parameters) and joins them. A loss follows. Backward
    mirrors it: per branch a data-gradient and a weight-gradient op; then one
    optimizer update per branch, colocated with the forward op that holds
    the parameters (as captured graphs colocate in-place write-backs). Every
    op names its block in ``layer``, so forward and backward of a block share it.

    Costs are drawn around realistic magnitudes: ``param_mib`` and
    ``activation_mib`` are mean sizes per branch op at ``batch``; compute time
    follows FLOPs at ``flop_s`` FLOP/s.

    Returns
    -------
    OpGraph
        ``layers * (4 * branches + 3) + 2`` nodes: per block its branches' forward,
        data-gradient, weight-gradient and update ops, the join, its backward and the
        gradient sum; then the input and the loss.

    Examples
    --------
    >>> g = training_graph(layers=2, branches=2)
    >>> g.num_nodes
    24
    """
    rng = np.random.default_rng(seed)
    ids: list[str] = []
    compute, out_b, par_b, tmp_b, flops = [], [], [], [], []
    op: list[str] = []
    layer: list[str] = []
    coloc: list[str | None] = []
    src: list[int] = []
    dst: list[int] = []
    ebytes: list[int] = []

    def node(node_id, kind, block, fl, out, params=0, temp=0, group=None):
        ids.append(node_id)
        flops.append(float(fl))
        compute.append(float(fl) / flop_s + 5e-6)  # plus a kernel launch
        out_b.append(int(out))
        par_b.append(int(params))
        tmp_b.append(int(temp))
        op.append(kind)
        layer.append(block)
        coloc.append(group)
        return len(ids) - 1

    def edge(u, v):
        src.append(u)
        dst.append(v)
        ebytes.append(out_b[u])

    act_scale = batch / 32
    prev = node("input", "placeholder", "input", 0, activation_mib * MiB * act_scale)
    joins, branch_fwd, branch_in = [], [], []
    for k in range(layers):
        block = f"block{k}"
        outs = []
        for b in range(branches):
            params = rng.uniform(0.5, 1.5) * param_mib * MiB
            act = rng.uniform(0.5, 1.5) * activation_mib * MiB * act_scale
            fl = 2 * (params / 4) * batch * rng.uniform(2, 20)
            u = node(
                f"{block}.b{b}.fwd",
                "aten.convolution",
                block,
                fl,
                act,
                params=params,
                temp=act * 0.25,
                group=f"{block}.b{b}.param",
            )
            edge(prev, u)
            outs.append(u)
            branch_fwd.append(u)
            branch_in.append(prev)
        join = node(f"{block}.join", "aten.cat", block, sum(out_b[u] for u in outs) / 4, sum(out_b[u] for u in outs))
        for u in outs:
            edge(u, join)
        joins.append(join)
        prev = join
    grad = node("loss", "aten.nll_loss", "loss", out_b[prev], 4)
    edge(prev, grad)
    for k in reversed(range(layers)):
        block = f"block{k}"
        join = joins[k]
        gjoin = node(f"{block}.join.bwd", "aten.split", block, out_b[join] / 4, out_b[join])
        edge(grad, gjoin)
        grads_in = []
        for b in range(branches):
            f = branch_fwd[k * branches + b]
            x = branch_in[k * branches + b]
            gx = node(f"{block}.b{b}.bwd_data", "aten.convolution_backward", block, flops[f], out_b[x])
            edge(gjoin, gx)
            edge(f, gx)
            gw = node(f"{block}.b{b}.bwd_weight", "aten.convolution_backward", block, flops[f], par_b[f])
            edge(gjoin, gw)
            edge(x, gw)
            upd = node(f"{block}.b{b}.update", "aten._foreach_add", block, par_b[f] / 2, 0, group=f"{block}.b{b}.param")
            edge(gw, upd)
            grads_in.append(gx)
        gsum = node(f"{block}.grad_sum", "aten.add", block, out_b[grads_in[0]] / 4, out_b[grads_in[0]])
        for gx in grads_in:
            edge(gx, gsum)
        grad = gsum
    return OpGraph(
        ids,
        compute,
        src,
        dst,
        ebytes,
        output_bytes=out_b,
        param_bytes=par_b,
        temp_bytes=tmp_b,
        flops=flops,
        op=op,
        layer=layer,
        colocation=coloc,
        name=name or f"synthetic-{layers}x{branches}-bs{batch}-seed{seed}",
    )


def random_dag(
    n: int,
    *,
    edge_prob: float = 0.2,
    max_parents: int = 4,
    seed: int = 0,
    max_compute_s: float = 1e-3,
    max_bytes: int = 64 * MiB,
    colocation_groups: int = 0,
    name: str | None = None,
) -> OpGraph:
    """A random DAG with edges only from lower to higher index (so never a cycle).

    Each node draws up to ``max_parents`` parents among the previous nodes
    with probability ``edge_prob`` each; costs are uniform. ``colocation_groups``
    > 0 assigns a random group to about a quarter of the nodes.
    """
    rng = np.random.default_rng(seed)
    src: list[int] = []
    dst: list[int] = []
    for v in range(1, n):
        candidates = rng.choice(v, size=min(v, max_parents), replace=False)
        for u in candidates[rng.random(candidates.size) < edge_prob].tolist():
            src.append(u)
            dst.append(v)
    m = len(src)
    coloc = None
    if colocation_groups > 0:
        coloc = [f"g{rng.integers(colocation_groups)}" if rng.random() < 0.25 else None for _ in range(n)]
    return OpGraph(
        [f"n{i}" for i in range(n)],
        rng.uniform(0, max_compute_s, n),
        src,
        dst,
        rng.integers(0, max_bytes, m),
        rng.integers(0, 2, m),
        output_bytes=rng.integers(0, max_bytes, n),
        param_bytes=rng.integers(0, max_bytes, n),
        temp_bytes=rng.integers(0, max_bytes // 4 + 1, n),
        colocation=coloc,
        name=name or f"random-{n}-seed{seed}",
    )


def _mixed_cluster() -> Cluster:
    """Two V100s and a slower A100-kind device on a shared PCIe-like channel per source."""
    devices = [Device("v0", "V100", 16 * GiB), Device("v1", "V100", 16 * GiB), Device("a0", "A100", 40 * GiB, 1.3)]
    names = [d.name for d in devices]
    channels = [Channel(f"{a}->*", 12e9, 1e-5, tuple((a, b) for b in names if b != a)) for a in names]
    return Cluster("mixed-3", devices, channels)


def with_device_kinds(graph: OpGraph) -> OpGraph:
    """Every fifth node may only run on V100s."""
    kinds = [("V100",) if i % 5 == 0 else None for i in range(graph.num_nodes)]
    return graph.replace(device_kinds=kinds)


def _with_parallel_edges(graph: OpGraph) -> OpGraph:
    """Every third edge doubled with a second output tensor, as captured ops that read two outputs of one op."""
    twin = np.arange(0, graph.num_edges, 3)
    return graph.replace(
        src=np.concatenate([graph.src, graph.src[twin]]),
        dst=np.concatenate([graph.dst, graph.dst[twin]]),
        edge_bytes=np.concatenate([graph.edge_bytes, graph.edge_bytes[twin]]),
        edge_tensor=np.concatenate([graph.edge_tensor, graph.edge_tensor[twin] + 1]),
        edge_extra=None,
    )


def contract_cases() -> list[tuple[str, OpGraph, Cluster]]:
    """Small problems every algorithm must solve validly: (label, graph, cluster)."""
    return [
        ("training-nvlink", training_graph(layers=3, branches=2, seed=1), load_cluster("2xV100-nvlink")),
        (
            "random-pcie",
            random_dag(30, edge_prob=0.5, colocation_groups=3, seed=2, max_bytes=8 << 20),
            load_cluster("4xGPU-pcie"),
        ),
        ("kinds-mixed", with_device_kinds(training_graph(layers=2, branches=3, seed=3)), _mixed_cluster()),
        ("two-hosts", training_graph(layers=4, branches=2, seed=4), load_cluster("2x4xV100")),
        (
            "parallel-edges",
            _with_parallel_edges(training_graph(layers=2, branches=2, seed=5)),
            load_cluster("4xV100-nvlink"),
        ),
        ("empty", OpGraph([], [], [], [], [], name="empty"), load_cluster("2xV100-nvlink")),
        ("free", _free(training_graph(layers=2, branches=2, seed=6)), load_cluster("4xGPU-pcie")),
    ]


def _free(graph: OpGraph) -> OpGraph:
    """No compute and no bytes on any edge: every ratio of times or of bytes is 0 / 0."""
    return graph.replace(
        compute_s=np.zeros(graph.num_nodes),
        edge_bytes=np.zeros(graph.num_edges, dtype=np.int64),
        compute_s_by_kind=None,
    )
