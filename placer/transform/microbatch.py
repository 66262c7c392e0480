"""The micro-batched step: the batch cut into ``m`` micro-batches, gradients accumulated, one optimizer step.

Pipeline parallelism (GPipe, 1F1B) and gradient accumulation run one
training step as ``m`` micro-batches: every operation that works on the
batch runs once per micro-batch, on its rows of the batch, and each
micro-batch's gradients are summed into the step's before the optimizer
runs once. This transform makes that step a graph that any placement
algorithm can place and the reference model can simulate:

* every *batch-proportional* node (one that depends on a batch input, the
  forward and backward passes up to the gradients; the replicas' notion,
  :func:`~placer.transform.replicate.replica_layout`) becomes ``m`` copies,
  copy ``k`` on the rows ``[lo_k, hi_k)`` of the batch's ``B`` samples
  (:func:`~placer.transform.split.part_rows`: the first micro-batches take
  one sample more where ``m`` does not divide ``B``, as replicas do), taking
  ``(hi_k - lo_k) / B`` of the node's time (on every device kind), FLOPs,
  workspace and output; tensors between copies shrink the same way;
* every other node (parameters, optimizer state, the optimizer's arithmetic
  and its writes of the new state) stays one node, whole;
* every gradient the optimizer reads is summed over the micro-batches by a
  chain of accumulation nodes (``m - 1`` adds of the gradient's size, costed
  on the analytic roofline of every device kind, as the all-reduce's
  additions are), and what read the gradient reads the sum.

So the reference model counts each micro-batch's activations from its
forward to its backward: a tensor of micro-batch ``k`` is held from its
producer's start to its last consumer's end (FORMATS.md, rule 6), and what
a device holds at once depends on how many micro-batches the schedule has
in flight there (all of them under GPipe, at most the stages ahead under
1F1B).

Two tensors keep their whole size in every micro-batch: a gradient (of a
weight's size whatever the rows) and the output of an operation whose every
output is one (a weight gradient's ``mm``, the pick of a multi-output
backward's weight gradient). A multi-output operation that outputs an
activation's gradient and a weight's (``convolution_backward``) shrinks as
a whole, so during its run its weight gradient counts by the micro-batch's
share (the pick that holds it from then on counts whole). The accumulation
is out of place: during an add, the running sum, the micro-batch's gradient
and the new sum are held (torch's ``AccumulateGrad`` adds in place, one
gradient less for the add's duration).

Parameters a batch-proportional node holds itself (a generated graph's
forward operation holds its weights) are held once, by micro-batch 0's
copy, and every copy is colocated with it: a weight lives on one device.
A colocation group stays one group where it holds anything that is not
batch-proportional (a parameter and the operations that write it in place,
batch norm's running statistics); a group of batch-proportional nodes alone
(a multi-output operation and its picks) is one group per micro-batch.

Contract (``microbatch`` through :func:`~placer.transform.base.apply_transform`,
:func:`microbatch_transform`): a batch-proportional node's ``m`` copies share
its time, workspace and output (whole bytes cut as ``total * hi // B -
total * lo // B``, which sums to the total exactly), or each holds its whole
output where it outputs gradients only; its parameters sum to the original;
every other node is the original, whole. The accumulation nodes are added
and stand for no original node. Every copy records ``node_extra["microbatch"]``
(``k``), ``"microbatch_of"`` (the original id) and ``"microbatch_rows"``
(``[lo, hi]``); an accumulation node records ``"microbatch"`` and
``"accumulate": {"gradient": id, "tensor": t}`` (with ``"joins": g`` for the
add of group ``g``'s sum, :func:`microbatch_graph`'s ``groups``). Ids: ``mb{k}/{id}`` for the
copies, ``mb{k}/{id}.accumulate`` (``:{t}`` before it for an output other
than the first) for the add of micro-batch ``k``'s gradient; the other nodes
keep theirs.

References
----------
Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
Pipeline Parallelism", NeurIPS 2019 (micro-batches, gradients accumulated
over them, one synchronous update); Narayanan et al., "Memory-Efficient
Pipeline-Parallel DNN Training" (PipeDream-Flush, 1F1B), ICML 2021;
``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``,
``Schedule1F1B``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import OptionError
from ..graph import OpGraph
from .base import SHARE_AND_WHOLE, SHARE_OR_WHOLE, Ensures, NodeMap, TransformResult, part_times, register_transform
from .replicate import chunk_add_time, replica_layout
from .split import batch_dependent, batch_samples, fresh_id, part_rows

__all__ = [
    "MicroBatchedGraph",
    "microbatch_graph",
    "microbatch_rows",
    "check_microbatches",
    "uneven_microbatches",
    "microbatch_transform",
]


@dataclass(frozen=True, eq=False)
class MicroBatchedGraph:
    """The micro-batched step and how it maps back.

    Attributes
    ----------
    graph : OpGraph
    microbatches : int
    rows : list of (int, int)
        Rows ``[lo, hi)`` of each micro-batch, out of ``total`` (the batch's
        samples, or ``microbatches`` equal shares where the graph records no batch).
    total : int
    per_batch : ndarray of bool
        Per original node: whether it is cut into micro-batches.
    microbatch : ndarray of int
        Per new node: its micro-batch (-1 for a node that stays whole; for a group's copy of a node
        computed from the parameters alone, the group's first micro-batch).
    original : ndarray of int
        Per new node: its original node; for an accumulation node, the
        original node whose gradient it sums.
    accumulates : ndarray of bool
        Per new node: whether it is an accumulation node (added).
    """

    graph: OpGraph
    microbatches: int
    rows: list[tuple[int, int]]
    total: int
    per_batch: np.ndarray
    microbatch: np.ndarray
    original: np.ndarray
    accumulates: np.ndarray


def check_microbatches(graph: OpGraph, microbatches: object, who: str = "microbatch") -> int:
    """``microbatches`` as an int, or OptionError in one line: not a positive integer, more micro-batches
    than the batch has samples, or (for more than one) a step with no batch input to cut.

    Examples
    --------
    >>> g = OpGraph(["x", "y"], [0.0, 1.0], [0], [1], [8], op=["placeholder", "aten.relu"], extra={"batch_size": 2})
    >>> check_microbatches(g, 2)
    2
    >>> check_microbatches(g, 3)
    Traceback (most recent call last):
    ...
    placer.errors.OptionError: microbatch: 3 micro-batches of a batch of 2 samples (graph ''): at most 2, one sample each
    """
    if (
        isinstance(microbatches, (bool, np.bool_))
        or not isinstance(microbatches, (int, np.integer))
        or microbatches < 1
    ):
        raise OptionError(f"{who}: the number of micro-batches must be an integer >= 1, got {microbatches!r}")
    m = int(microbatches)
    if m == 1:
        return m
    samples = batch_samples(graph)
    if samples is not None and m > samples:
        raise OptionError(
            f"{who}: {m} micro-batches of a batch of {samples} sample{'s' if samples != 1 else ''} "
            f"(graph {graph.name!r}): at most {samples}, one sample each"
        )
    if not graph.num_nodes or not batch_dependent(graph).any():
        raise OptionError(
            f"{who}: graph {graph.name!r} has no batch input to cut into micro-batches (no "
            "placeholder without parameters that operations read, nor an operation declaring a "
            "batch dimension)"
        )
    return m


def uneven_microbatches(samples: int | None, microbatches: int) -> str | None:
    """One line saying how ``microbatches`` micro-batches share a batch of ``samples`` they do not divide,
    or None where they divide it (or the count is refused, or the batch records no samples).

    Such micro-batches are planned unevenly, as replicas are: the first ones take one sample more.

    Examples
    --------
    >>> uneven_microbatches(10, 3)
    '3 micro-batches of a batch of 10 samples are uneven: 1 of 4 samples, then 2 of 3 (the first ones one more, as replicas share a batch)'
    >>> uneven_microbatches(8, 4) is None, uneven_microbatches(None, 3) is None, uneven_microbatches(2, 3) is None
    (True, True, True)
    """
    if samples is None or not 1 < microbatches <= samples or samples % microbatches == 0:
        return None
    base, larger = divmod(samples, microbatches)
    return (
        f"{microbatches} micro-batches of a batch of {samples} samples are uneven: {larger} of {base + 1} "
        f"sample{'s' if base + 1 != 1 else ''}, then {microbatches - larger} of {base} (the first ones one "
        "more, as replicas share a batch)"
    )


def microbatch_rows(graph: OpGraph, microbatches: int) -> tuple[list[tuple[int, int]], int]:
    """Rows ``[lo, hi)`` of each micro-batch and the rows they cut: the batch's samples
    (:func:`~placer.transform.split.batch_samples`), else ``microbatches`` equal shares.

    Examples
    --------
    >>> g = OpGraph(["x"], [0.0], [], [], [], extra={"batch_size": 10})
    >>> microbatch_rows(g, 3)
    ([(0, 4), (4, 7), (7, 10)], 10)
    >>> microbatch_rows(g.replace(extra=None), 3)
    ([(0, 1), (1, 2), (2, 3)], 3)
    """
    samples = batch_samples(graph)
    total = microbatches if samples is None else samples
    return part_rows(total, microbatches), total


def _piece(total: np.ndarray, lo: int, hi: int, rows: int) -> np.ndarray:
    """Whole bytes of rows ``[lo, hi)`` of ``rows``: the pieces of all micro-batches sum to ``total``."""
    total = np.asarray(total, dtype=np.int64)
    return total * hi // rows - total * lo // rows


def _splittable(entries: list[dict] | None, lo: int, hi: int, total: int, parts: int, k: int) -> list[dict] | None:
    """A micro-batch's share of the batch dimension (rows are a multiple of the samples, a sample's in one block)."""
    if not entries:
        return entries
    out = []
    for item in entries:
        if item.get("dim") == "batch":
            size = int(item["size"])
            if size % total == 0:
                a, b = size // total * lo, size // total * hi
            else:
                a, b = part_rows(size, parts)[k]
            if b - a < 1:
                continue
            item = {**item, "size": b - a}
        out.append(item)
    return out or None


def microbatch_graph(graph: OpGraph, microbatches: int, groups: int = 1) -> MicroBatchedGraph:
    """The step as ``microbatches`` micro-batches with their gradients accumulated (see the module).

    Parameters
    ----------
    graph : OpGraph
    microbatches : int
        ``m`` >= 1; at most the batch's samples where the graph records them.
    groups : int
        ``r`` dividing ``m``: each gradient is summed over each run of ``m / r``
        consecutive micro-batches by a chain of its own (the accumulation of
        micro-batch ``k`` adds its gradient into its run's sum), and the runs'
        sums are then added in order, the add of run ``g`` recorded as the
        accumulation of the run's first micro-batch (``"joins": g``). Still ``m - 1``
        adds; replica groups of pipelines (:mod:`placer.algorithms.pipeline`) run
        each run's chain on their own devices and exchange only its sum. What the
        batch reads that is computed from the parameters and constants alone (a
        weight's transpose, a causal mask) is copied once per later run,
        ``grp{g}/{id}`` recording ``"group": g`` and ``"group_copy_of"``, and run
        ``g``'s micro-batches read run ``g``'s copy.

    Returns
    -------
    MicroBatchedGraph

    Raises
    ------
    OptionError
        As :func:`check_microbatches`.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> mb = microbatch_graph(g, 2)
    >>> sorted(mb.graph.ids[v] for v in np.flatnonzero(mb.accumulates))
    ['mb1/block0.b0.bwd_weight.accumulate', 'mb1/block1.b0.bwd_weight.accumulate']
    >>> [mb.graph.ids[v] for v in np.flatnonzero(mb.microbatch < 0)]       # whole: the updates
    ['block1.b0.update', 'block0.b0.update']
    """
    m = check_microbatches(graph, microbatches)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1 or m % groups:
        raise OptionError(
            f"microbatch: groups must be an integer >= 1 that divides the {m} micro-batches, got {groups!r}"
        )
    per_group = m // groups
    rows, total = microbatch_rows(graph, m)
    n = graph.num_nodes
    layout = replica_layout(graph, 2)  # which nodes work on the batch, and the gradients
    per_batch = layout.per_batch.copy()
    if m == 1:
        per_batch[:] = False
    shared = np.flatnonzero(~per_batch)
    cut = np.flatnonzero(per_batch)
    n_shared, n_cut = shared.size, cut.size
    new_of = np.full((m, n), -1, dtype=np.int64)  # new index of original u in micro-batch k
    new_of[:, shared] = np.arange(n_shared)
    for k in range(m):
        new_of[k, cut] = n_shared + k * n_cut + np.arange(n_cut)
    # Gradients of batch-proportional producers are summed over the micro-batches.
    grads = [g for g in layout.grad_bytes if per_batch[g[0]]]
    grad_set = set(grads)
    # Tensors that keep their whole size: gradients, and what a pick of a gradient reads.
    whole_tensor: set[tuple[int, int]] = set(grads)
    in_ptr, in_eids = graph.in_edges
    for u, t in grads:
        if graph.op[u] == "_operator.getitem":
            feeding = [e for e in in_eids[in_ptr[u] : in_ptr[u + 1]].tolist() if graph.edge_bytes[e]]
            if len(feeding) == 1 and per_batch[graph.src[feeding[0]]]:
                e = feeding[0]
                whole_tensor.add((int(graph.src[e]), int(graph.edge_tensor[e])))
    out_ptr, out_eids = graph.out_edges
    whole_output = np.zeros(n, dtype=bool)
    for u in {u for u, _ in whole_tensor}:
        sent = [
            (int(graph.edge_tensor[e])) for e in out_eids[out_ptr[u] : out_ptr[u + 1]].tolist() if graph.edge_bytes[e]
        ]
        whole_output[u] = bool(sent) and all((u, t) in whole_tensor for t in sent)

    # Colocation: a group holding anything whole (or parameters) stays one; otherwise one per micro-batch.
    labels = set(c for c in graph.colocation if c is not None)
    keeps: set[str] = set()
    for key, members in graph.colocation_groups.items():
        if (~per_batch[members]).any() or (graph.param_bytes[members] > 0).any():
            keeps.add(key)
    holds_params = {
        u: fresh_id(f"params:{graph.ids[u]}", labels)
        for u in cut.tolist()
        if graph.param_bytes[u] > 0 and graph.colocation[u] is None
    }

    ids = [graph.ids[u] for u in shared.tolist()]
    taken = set(ids)
    compute = [graph.compute_s[shared]]
    output = [graph.output_bytes[shared]]
    params = [graph.param_bytes[shared]]
    temp = [graph.temp_bytes[shared]]
    flops = [graph.flops[shared]]
    sh = shared.tolist()
    op = [graph.op[u] for u in sh]
    layer = [graph.layer[u] for u in sh]
    colocation = [graph.colocation[u] for u in sh]
    kinds = [graph.device_kinds[u] for u in sh]
    by_kind = [graph.compute_s_by_kind[u] for u in sh]
    splittable = [graph.splittable[u] for u in sh]
    extra = [graph.node_extra[u] for u in sh]
    ct = cut.tolist()
    for k, (lo, hi) in enumerate(rows):
        share = (hi - lo) / total
        ids += [fresh_id(f"mb{k}/{graph.ids[u]}", taken) for u in ct]
        compute.append(graph.compute_s[cut] * share)
        output.append(
            np.where(whole_output[cut], graph.output_bytes[cut], _piece(graph.output_bytes[cut], lo, hi, total))
        )
        params.append(graph.param_bytes[cut] if k == 0 else np.zeros(n_cut, dtype=np.int64))
        temp.append(_piece(graph.temp_bytes[cut], lo, hi, total))
        flops.append(graph.flops[cut] * share)
        op += [graph.op[u] for u in ct]
        layer += [graph.layer[u] for u in ct]
        colocation += [
            holds_params.get(u) if c is None else (c if c in keeps else f"mb{k}/{c}")
            for u, c in zip(ct, (graph.colocation[u] for u in ct))
        ]
        kinds += [graph.device_kinds[u] for u in ct]
        by_kind += [
            part_times(graph.compute_s_by_kind[u], (graph.node_extra[u] or {}).get("fixed_s"), share) for u in ct
        ]
        splittable += [_splittable(graph.splittable[u], lo, hi, total, m, k) for u in ct]
        extra += [
            {**graph.node_extra[u], "microbatch": k, "microbatch_of": graph.ids[u], "microbatch_rows": [lo, hi]}
            for u in ct
        ]
    microbatch = [np.full(n_shared, -1, dtype=np.int64)] + [np.full(n_cut, k, dtype=np.int64) for k in range(m)]
    original = [shared] + [cut] * m
    # Groups compute what the batch reads from the parameters alone (a weight's transpose, a causal mask) each
    # on their own: group g's micro-batches read group g's copy (group 0's is the node itself), so that only
    # the parameters and the gradients' sums pass between groups.
    pre = _from_parameters(graph, per_batch) if groups > 1 else np.zeros(0, dtype=np.int64)
    pr = pre.tolist()
    for g in range(1, groups):
        start = len(ids)
        ids += [fresh_id(f"grp{g}/{graph.ids[u]}", taken) for u in pr]
        for values, column in ((compute, graph.compute_s), (output, graph.output_bytes), (temp, graph.temp_bytes)):
            values.append(column[pre])
        params.append(np.zeros(pre.size, dtype=np.int64))
        flops.append(graph.flops[pre])
        op += [graph.op[u] for u in pr]
        layer += [graph.layer[u] for u in pr]
        colocation += [None] * pre.size
        kinds += [graph.device_kinds[u] for u in pr]
        by_kind += [graph.compute_s_by_kind[u] for u in pr]
        splittable += [graph.splittable[u] for u in pr]
        extra += [{**graph.node_extra[u], "group": g, "group_copy_of": graph.ids[u]} for u in pr]
        microbatch.append(np.full(pre.size, g * per_group, dtype=np.int64))
        original.append(pre)
        new_of[g * per_group : (g + 1) * per_group, pre] = start + np.arange(pre.size)
    microbatch = np.concatenate(microbatch)
    original = np.concatenate(original).astype(np.int64)

    # Edges between the nodes: within a micro-batch, from a whole node to every copy, from every copy to a
    # whole node; readers of a gradient read its sum instead.
    src, dst, ebytes = graph.src, graph.dst, graph.edge_bytes
    etensor = graph.edge_tensor
    is_grad = np.fromiter(
        ((int(u), int(t)) in grad_set for u, t in zip(src.tolist(), etensor.tolist())),
        dtype=bool,
        count=graph.num_edges,
    )
    whole_edge = np.fromiter(
        ((int(u), int(t)) in whole_tensor for u, t in zip(src.tolist(), etensor.tolist())),
        dtype=bool,
        count=graph.num_edges,
    )
    ps, pd = per_batch[src], per_batch[dst]
    e_src, e_dst, e_bytes, e_tensor = [], [], [], []
    both = np.flatnonzero(~is_grad & ~ps & ~pd)
    e_src.append(new_of[0, src[both]])
    e_dst.append(new_of[0, dst[both]])
    e_bytes.append(ebytes[both])
    e_tensor.append(etensor[both])
    into_copies = both[np.isin(dst[both], pre)]  # what each group's copies read: its own copies, the parameters
    for g in range(1, groups):
        e_src.append(new_of[g * per_group, src[into_copies]])
        e_dst.append(new_of[g * per_group, dst[into_copies]])
        e_bytes.append(ebytes[into_copies])
        e_tensor.append(etensor[into_copies])
    for k, (lo, hi) in enumerate(rows):
        sel = np.flatnonzero(~is_grad & (ps | pd))  # anything touching a copy: once per micro-batch
        e_src.append(new_of[k, src[sel]])
        e_dst.append(new_of[k, dst[sel]])
        nbytes = np.where(ps[sel] & ~whole_edge[sel], _piece(ebytes[sel], lo, hi, total), ebytes[sel])
        e_bytes.append(nbytes)
        e_tensor.append(etensor[sel])

    # The accumulation chains, then the readers of each gradient read its chain's last node.
    acc_ids, acc_compute, acc_bykind, acc_bytes, acc_kinds, acc_extra, acc_of, acc_mb = [], [], [], [], [], [], [], []
    a_src, a_dst, a_bytes, a_tensor = [], [], [], []
    base = len(ids)
    final: dict[tuple[int, int], tuple[int, int]] = {}
    for u, t in grads:
        size = int(layout.grad_bytes[(u, t)])
        seconds, times = chunk_add_time(size)
        name = graph.ids[u] + (f":{t}" if t else "")

        def add(k: int, running: tuple[int, int], more: tuple[int, int], joins: int = 0) -> tuple[int, int]:
            """The accumulation node of micro-batch ``k``: ``running + more``."""
            v = base + len(acc_ids)
            acc_ids.append(fresh_id(f"mb{k}/{name}.accumulate", taken))
            acc_compute.append(seconds)
            acc_bykind.append(dict(times))
            acc_bytes.append(size)
            acc_kinds.append(graph.device_kinds[u])
            what = {"gradient": graph.ids[u], "tensor": t, **({"joins": joins} if joins else {})}
            acc_extra.append({"microbatch": k, "accumulate": what})
            acc_of.append(u)
            acc_mb.append(k)
            for s, tt in (running, more):
                a_src.append(s)
                a_dst.append(v)
                a_bytes.append(size)
                a_tensor.append(tt)
            return (v, 0)

        total_sum = None
        for g in range(groups):
            first = g * per_group
            last = (int(new_of[first, u]), t)
            for k in range(first + 1, first + per_group):
                last = add(k, last, (int(new_of[k, u]), t))
            total_sum = last if total_sum is None else add(first, total_sum, last, joins=g)
        final[(u, t)] = total_sum
    for e in np.flatnonzero(is_grad).tolist():
        s, tt = final[(int(src[e]), int(etensor[e]))]
        v = int(dst[e])
        for k in range(m if per_batch[v] else 1):
            a_src.append(s)
            a_dst.append(int(new_of[k, v]))
            a_bytes.append(int(ebytes[e]))
            a_tensor.append(tt)
    n_acc = len(acc_ids)
    ids += acc_ids
    new = OpGraph(
        ids,
        np.concatenate(compute + [np.asarray(acc_compute, dtype=np.float64)]),
        np.concatenate(e_src + [_as_int(a_src)]),
        np.concatenate(e_dst + [_as_int(a_dst)]),
        np.concatenate(e_bytes + [_as_int(a_bytes)]),
        np.concatenate(e_tensor + [_as_int(a_tensor)]),
        output_bytes=np.concatenate(output + [_as_int(acc_bytes)]),
        param_bytes=np.concatenate(params + [np.zeros(n_acc, dtype=np.int64)]),
        temp_bytes=np.concatenate(temp + [np.zeros(n_acc, dtype=np.int64)]),
        flops=np.concatenate(flops + [np.asarray([b / 4 for b in acc_bytes], dtype=np.float64)]),
        op=op + ["aten.add"] * n_acc,
        layer=layer + [graph.layer[u] for u in acc_of],
        colocation=colocation + [None] * n_acc,
        device_kinds=kinds + acc_kinds,
        compute_s_by_kind=by_kind + acc_bykind,
        splittable=splittable + [None] * n_acc,
        node_extra=extra + acc_extra,
        name=graph.name,
        extra={
            **graph.extra,
            "microbatches": {
                "count": m,
                "rows": [list(r) for r in rows],
                "total": total,
                **({"groups": groups} if groups > 1 else {}),
            },
        },
    )
    accumulates = np.zeros(new.num_nodes, dtype=bool)
    accumulates[base:] = True
    return MicroBatchedGraph(
        new,
        m,
        rows,
        total,
        per_batch,
        np.concatenate([microbatch, _as_int(acc_mb)]),
        np.concatenate([original, _as_int(acc_of)]),
        accumulates,
    )


def _from_parameters(graph: OpGraph, per_batch: np.ndarray) -> np.ndarray:
    """The nodes, in index order, that compute from the parameters and constants alone what a
    batch-proportional node reads: not sources, not on the batch, holding no parameters or colocation (state
    and its writers stay whole), and read by a batch-proportional node or by another such node.

    Examples
    --------
    >>> g = OpGraph(["w", "wt", "x", "y"], [0.0, 1.0, 0.0, 1.0], [0, 1, 2], [1, 3, 3], [4, 4, 4],
    ...             param_bytes=[4, 0, 0, 0], op=["placeholder", "aten.t", "placeholder", "aten.mm"],
    ...             extra={"batch_inputs": ["x"]})
    >>> _from_parameters(g, np.array([False, False, True, True])).tolist()
    [1]
    """
    n = graph.num_nodes
    candidate = (
        ~per_batch
        & ~batch_dependent(graph)
        & (np.bincount(graph.dst, minlength=n) > 0)
        & (graph.param_bytes == 0)
        & np.array([c is None for c in graph.colocation], dtype=bool)
    )
    needed = np.zeros(n, dtype=bool)
    ptr, eids = graph.out_edges
    for u in graph.topological_order[::-1].tolist():
        if candidate[u]:
            readers = graph.dst[eids[ptr[u] : ptr[u + 1]]]
            needed[u] = bool((per_batch[readers] | needed[readers]).any())
    return np.flatnonzero(needed)


def _as_int(values: list) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _trials(graph: OpGraph) -> list[dict]:
    """Two and three micro-batches where the step has a batch to cut (and samples for three), and four in two
    groups (samples for four)."""
    if not graph.num_nodes or not batch_dependent(graph).any():
        return []
    samples = batch_samples(graph)
    trials = [{"microbatches": m} for m in (2, 3) if samples is None or m <= samples]
    return trials + ([{"microbatches": 4, "groups": 2}] if samples is None or samples >= 4 else [])


@register_transform(
    "microbatch",
    requires="the step has a batch input; microbatches >= 1 and at most the batch's samples where the graph "
    "records them; groups divides microbatches.",
    trials=_trials,
    ensures=Ensures(
        compute=SHARE_AND_WHOLE,
        output_bytes=SHARE_OR_WHOLE,
        param_bytes=SHARE_OR_WHOLE,
        temp_bytes=SHARE_OR_WHOLE,
        transfers=None,
        note="A batch-proportional node's micro-batches share its work (each paying its fixed part whole, "
        "part_times), workspace and output by their rows of the batch (an output of gradients alone is whole "
        "in each), micro-batch 0 holding its parameters; any other node is the original. A tensor between "
        "copies shrinks with its producer's share (a gradient does not). Added: the accumulation nodes, which "
        "sum each gradient over the micro-batches; readers of a gradient read the sum.",
    ),
)
def microbatch_transform(
    graph: OpGraph, cluster: Cluster | None, *, microbatches: int, groups: int = 1
) -> TransformResult:
    """The micro-batched step (:func:`microbatch_graph`): node ``u``'s copies stand for ``u``.

    Micro-batch ``k`` is copy ``k``; a node that stays whole is copy 0; an
    accumulation node is added, stands for no original node, and is the copy
    of the micro-batch whose gradient it adds. One micro-batch is the step itself.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> r = microbatch_transform(g, None, microbatches=2)
    >>> [r.graph.ids[v] for v in r.image[0]], int(r.added.sum())
    (['mb0/input', 'mb1/input'], 2)
    """
    mb = microbatch_graph(graph, microbatches, groups)
    if mb.microbatches == 1:
        return TransformResult.identity(graph, detail=mb)
    new = mb.graph
    origin = NodeMap.from_groups(
        [[] if a else [u] for u, a in zip(mb.original.tolist(), mb.accumulates.tolist())], graph.num_nodes
    )
    return TransformResult(
        new, graph, origin, origin.inverse(), mb.accumulates.copy(), np.maximum(mb.microbatch, 0), mb
    )
