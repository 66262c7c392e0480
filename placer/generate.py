"""Synthetic graphs: training steps of layered models and random DAGs.

They need no PyTorch, so tests, benchmarks and the bundled example use them
at any size (10 to 100k+ nodes), reproducibly for a seed.
"""

from __future__ import annotations

import numpy as np

from .graph import OpGraph

__all__ = ["training_graph", "random_dag"]

MiB = 1 << 20


def training_graph(layers: int = 8, branches: int = 2, *, seed: int = 0, batch: int = 32,
                   param_mib: float = 16.0, activation_mib: float = 8.0, flop_s: float = 1.2e13,
                   name: str | None = None) -> OpGraph:
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
    for l in range(layers):
        block = f"block{l}"
        outs = []
        for b in range(branches):
            params = rng.uniform(0.5, 1.5) * param_mib * MiB
            act = rng.uniform(0.5, 1.5) * activation_mib * MiB * act_scale
            fl = 2 * (params / 4) * batch * rng.uniform(2, 20)
            u = node(f"{block}.b{b}.fwd", "aten.convolution", block, fl, act, params=params,
                     temp=act * 0.25, group=f"{block}.b{b}.param")
            edge(prev, u)
            outs.append(u)
            branch_fwd.append(u)
            branch_in.append(prev)
        join = node(f"{block}.join", "aten.cat", block, sum(out_b[u] for u in outs) / 4,
                    sum(out_b[u] for u in outs))
        for u in outs:
            edge(u, join)
        joins.append(join)
        prev = join
    grad = node("loss", "aten.nll_loss", "loss", out_b[prev], 4)
    edge(prev, grad)
    for l in reversed(range(layers)):
        block = f"block{l}"
        join = joins[l]
        gjoin = node(f"{block}.join.bwd", "aten.split", block, out_b[join] / 4, out_b[join])
        edge(grad, gjoin)
        grads_in = []
        for b in range(branches):
            f = branch_fwd[l * branches + b]
            x = branch_in[l * branches + b]
            gx = node(f"{block}.b{b}.bwd_data", "aten.convolution_backward", block, flops[f], out_b[x])
            edge(gjoin, gx)
            edge(f, gx)
            gw = node(f"{block}.b{b}.bwd_weight", "aten.convolution_backward", block, flops[f], par_b[f])
            edge(gjoin, gw)
            edge(x, gw)
            upd = node(f"{block}.b{b}.update", "aten._foreach_add", block, par_b[f] / 2, 0,
                       group=f"{block}.b{b}.param")
            edge(gw, upd)
            grads_in.append(gx)
        gsum = node(f"{block}.grad_sum", "aten.add", block, out_b[grads_in[0]] / 4, out_b[grads_in[0]])
        for gx in grads_in:
            edge(gx, gsum)
        grad = gsum
    return OpGraph(ids, compute, src, dst, ebytes, output_bytes=out_b, param_bytes=par_b, temp_bytes=tmp_b,
                   flops=flops, op=op, layer=layer, colocation=coloc,
                   name=name or f"synthetic-{layers}x{branches}-bs{batch}-seed{seed}")


def random_dag(n: int, *, edge_prob: float = 0.2, max_parents: int = 4, seed: int = 0,
               max_compute_s: float = 1e-3, max_bytes: int = 64 * MiB, colocation_groups: int = 0,
               name: str | None = None) -> OpGraph:
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
    return OpGraph([f"n{i}" for i in range(n)], rng.uniform(0, max_compute_s, n), src, dst,
                   rng.integers(0, max_bytes, m), rng.integers(0, 2, m),
                   output_bytes=rng.integers(0, max_bytes, n), param_bytes=rng.integers(0, max_bytes, n),
                   temp_bytes=rng.integers(0, max_bytes // 4 + 1, n), colocation=coloc,
                   name=name or f"random-{n}-seed{seed}")
