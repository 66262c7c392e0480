"""The data-parallel graph: one replica of the step per device, each on 1/n of the batch, gradients all-reduced.

Strong scaling: the global batch stays fixed, so every batch-proportional
operation of a replica (forward and backward, the nodes that depend on the
batch up to the gradients) takes 1/n of the original time and memory, while
parameters, optimizer state, the optimizer's own arithmetic and its writes of
the new state stay whole in every replica (a sharded optimizer divides the
last three among the replicas).

Gradients are found where the optimizer reads them: walking back from every
in-place state write (a colocation group that holds parameters or optimizer
state) along batch-dependent edges of the state's size, through the
optimizer's element-wise arithmetic (element-wise ops, views and copies whose
batch-dependent inputs all have the state's size), to the first node that is
not: the backward operation that produced the gradient.

They are reduced as PyTorch DDP does: in buckets of about 25 MiB (the first
1 MiB), filled in the order the gradients are produced (a gradient computed after a reader of
another in the bucket, as when one parameter group's update feeds the next
group's gradient, starts a new one), each bucket by a ring all-reduce of
``2 (n - 1)`` steps (Patarasuk and Yuan 2009). Step ``s`` of a bucket on
replica ``i`` is a node that receives ``1/n`` of the bucket from step
``s - 1`` on replica ``i - 1``, so the ring's traffic travels on the
channels and queues there like any other transfer. The first ``n - 1``
steps add a chunk (reduce-scatter), the others copy one (all-gather). Every
reader of a gradient then reads the bucket's last step on its own replica.
Where every pair of devices has a link of its own, or hosts share a network,
a ``direct`` collective exchanges slices with every replica of a host at once,
then between hosts (:func:`collective_stages`).

Contract (``replicate`` through :func:`~placer.transform.base.apply_transform`,
:func:`replicate_transform`): replica ``k`` works on ``b_k`` of the ``B``
samples, ``sum_k b_k = B``, so a batch-proportional node's replicas take
shares ``b_k / B`` of its time (on every device) and memory that sum to the
whole (whole bytes round by at most one per replica), and every other node is
whole in each replica; a sharded optimizer's arithmetic and state are shared
the same way. The all-reduce steps are added nodes that stand for no
original node.

Every node records ``node_extra["replica"]`` (its replica) and
``"replica_of"`` (the original id); all-reduce steps record
``"allreduce": {"bucket": b, "step": s, "gradients": [ids], "collective": c}``
and the id ``r{k}/allreduce{b}.step{s}`` (with ``~1``, ``~2``, ... where the
id is a replica of one of the graph's own nodes already).

References
----------
Yi et al., FastT, CoNEXT 2020, Section 5.2 (the data-parallel start graph);
Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
Training", VLDB 2020 (gradient buckets, 25 MiB); Patarasuk and Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations",
JPDC 2009 (the ring); Thakur, Rabenseifner and Gropp, "Optimization of
collective communication operations in MPICH", IJHPCA 2005 (reduce-scatter
then all-gather, by direct exchanges); Jia et al., "Highly scalable deep
learning training system with mixed-precision", 2018 (hierarchical
all-reduce: within hosts, then between them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..cluster import Cluster
from ..cost.analytic import DEVICE_SPECS, node_time_s
from ..errors import OptionError
from ..graph import OpGraph
from .base import SHARE_AND_WHOLE, SHARE_OR_WHOLE, Ensures, NodeMap, TransformResult, part_times, register_transform
from .split import NODE_DEFAULTS, batch_dependent, fresh_id, part_rows

__all__ = [
    "data_parallel_graph",
    "replicated_node",
    "gradients",
    "replica_layout",
    "chunk_add_time",
    "DataParallelGraph",
    "ReplicaLayout",
    "Stage",
    "collective_stages",
    "input_transfers",
    "chunk_copy_time",
    "BUCKET_BYTES",
    "FIRST_BUCKET_BYTES",
    "COLLECTIVES",
    "GRADIENTS",
    "UPDATED",
    "replicate_transform",
]

BUCKET_BYTES = 25 << 20
#: The first bucket's size (DDP's ``_DEFAULT_FIRST_BUCKET_BYTES``): the last layers' gradients, reduced first.
FIRST_BUCKET_BYTES = 1 << 20
#: What an optimizer's update is made of: element-wise arithmetic, views and copies (aten names, the
#: ``_foreach_`` forms included). The walk back from a state write passes only through these: a matmul
#: whose inputs happen to have the state's size (BERT-large at batch 16 x 64 tokens, hidden 1024, has
#: activations of a weight's size) made the gradient, however its inputs look.
OPTIMIZER_OPS = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "neg",
        "abs",
        "sign",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "pow",
        "exp",
        "log",
        "lerp",
        "addcmul",
        "addcdiv",
        "maximum",
        "minimum",
        "clamp",
        "clamp_min",
        "clamp_max",
        "where",
        "copy",
        "clone",
        "detach",
        "alias",
        "_to_copy",
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "squeeze",
        "unsqueeze",
        "zeros_like",
        "ones_like",
        "fill",
        "sgn",
    }
)


def _optimizer_op(op: str | None) -> bool:
    """Whether a node of this op may be optimizer arithmetic (unnamed ops of generated graphs may)."""
    if op is None:
        return True
    name = op.rsplit(".", 1)[-1].removeprefix("_foreach_").rstrip("_")
    return name in OPTIMIZER_OPS


@dataclass
class DataParallelGraph:
    """The replicated graph and how it maps back.

    Attributes
    ----------
    graph : OpGraph
    replica : ndarray of int
        Replica of every node (all-reduce steps included).
    original : ndarray of int
        Index in the original graph of every node, -1 for all-reduce steps.
    """

    graph: OpGraph
    replica: np.ndarray
    original: np.ndarray


def gradients(graph: OpGraph) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The gradient tensors the optimizer reads, and the optimizer's own nodes.

    Returns
    -------
    grads : list of (node, tensor)
        Producer and output index of every gradient, in topological order of the producers.
    optimizer : ndarray of bool
        Nodes between a gradient and the state write (element-wise optimizer arithmetic).
    """
    walks, optimizer = _state_writes(graph)
    return _in_topological_order(graph, walks), optimizer


def _in_topological_order(graph: OpGraph, walks: dict) -> list[tuple[int, int]]:
    """Every gradient the state writes derive from, in topological order of their producers."""
    found = set().union(*(grads for _, grads in walks.values()))
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    return sorted(found, key=lambda g: (position[g[0]], g[1]))


def _state_writes(graph: OpGraph) -> tuple[dict[str, tuple[list[int], set[tuple[int, int]]]], np.ndarray]:
    """Per colocation group holding state: its write nodes and the gradients they derive from; the optimizer."""
    n = graph.num_nodes
    batch = batch_dependent(graph)
    ptr, eids = graph.in_edges
    src, nbytes, tensor = graph.src, graph.edge_bytes, graph.edge_tensor
    optimizer = np.zeros(n, dtype=bool)
    walks: dict[str, tuple[list[int], set[tuple[int, int]]]] = {}
    for key, members in graph.colocation_groups.items():
        size = int(graph.param_bytes[members].max())
        if size <= 0:
            continue
        inside = set(members.tolist())

        def feeding(v: int) -> list[int]:
            """In-edges of v that carry a batch-dependent tensor from outside the group (an edge of 0 bytes
            carries none: it orders, or holds a view's base)."""
            return [
                e
                for e in eids[ptr[v] : ptr[v + 1]].tolist()
                if batch[src[e]] and nbytes[e] and int(src[e]) not in inside
            ]

        writers = [w for w in members.tolist() if any(nbytes[e] == size for e in feeding(w))]
        stack = [e for w in writers for e in feeding(w) if nbytes[e] == size]
        seen: set[int] = set()
        found: set[tuple[int, int]] = set()
        while stack:
            e = stack.pop()
            u = int(src[e])
            further = feeding(u)
            # Element-wise optimizer arithmetic reads only state-sized batch-dependent tensors;
            # the first node that reads anything else (activations) produced the gradient, and so
            # did a sum of gradients alone (a tied weight's, which backward accumulates).
            if (
                further
                and _optimizer_op(graph.op[u])
                and all(nbytes[f] == size for f in further)
                and not _accumulates(graph, u, further)
            ):
                if u not in seen:
                    seen.add(u)
                    optimizer[u] = True
                    stack.extend(further)
            else:
                found.add((u, int(tensor[e])))
        walks[key] = (writers, found)
    return walks, optimizer


def _accumulates(graph: OpGraph, u: int, feeding: list[int]) -> bool:
    """Whether node ``u`` sums gradients: an ``add`` whose every tensor input is one of ``feeding`` (its
    batch-dependent inputs of the state's size), as backward sums a tied weight's gradients. An
    optimizer's arithmetic always reads state too (the parameter, a moment, the learning rate)."""
    op = graph.op[u]
    if op is None or op.rsplit(".", 1)[-1].removeprefix("_foreach_").rstrip("_") != "add" or len(feeding) < 2:
        return False
    ptr, eids = graph.in_edges
    return all(e in feeding for e in eids[ptr[u] : ptr[u + 1]].tolist() if graph.edge_bytes[e])


def _optimizer_arithmetic(graph: OpGraph, optimizer: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """The optimizer's element-wise nodes, with those on its state alone (Adam's ``exp_avg_sq * beta2``).

    Walks back from the optimizer's nodes (which read the gradient) through
    element-wise operations on state that does not depend on the batch, as
    long as they produce a tensor of the size their reader takes.
    """
    out = optimizer.copy()
    ptr, eids = graph.in_edges
    stack = np.flatnonzero(optimizer).tolist()
    while stack:
        v = stack.pop()
        for e in eids[ptr[v] : ptr[v + 1]].tolist():
            u = int(graph.src[e])
            if (
                not out[u]
                and not batch[u]
                and graph.op[u] not in (None, "placeholder")
                and _optimizer_op(graph.op[u])
                and graph.output_bytes[u] == graph.edge_bytes[e] > 0
            ):
                out[u] = True
                stack.append(u)
    return out


@dataclass
class ReplicaLayout:
    """How a graph is replicated: which nodes shrink, and the gradient buckets.

    Attributes
    ----------
    replicas : int
    sharded : bool
        Whether the optimizer is sharded (ZeRO stage 1) rather than replicated.
    factor : ndarray of float
        Share of its original time and memory each replica of a node takes (1/replicas or 1).
    per_batch : ndarray of bool
        Nodes that shrink because they work on the batch (their batch dimension is cut).
    param_factor : ndarray of float
        Share of its ``param_bytes`` each replica holds (a sharded optimizer's state: 1/replicas).
    is_grad_edge : ndarray of bool
        Edges that read a gradient (they read the reduced bucket instead).
    buckets : list of list of (node, tensor)
        Gradients in the order they are reduced, about ``bucket_bytes`` a bucket.
    grad_bytes : dict
        Size of every gradient.
    updated : dict
        Gradient -> the node that writes the parameter it updates (sharded layouts only): the
        all-gather sends its new value on.
    """

    replicas: int
    sharded: bool
    factor: np.ndarray
    per_batch: np.ndarray
    param_factor: np.ndarray
    is_grad_edge: np.ndarray
    buckets: list[list[tuple[int, int]]]
    grad_bytes: dict[tuple[int, int], int]
    updated: dict[tuple[int, int], int]

    def bucket_bytes(self, b: int) -> int:
        return sum(self.grad_bytes[g] for g in self.buckets[b])

    def stage_compute(self, stage: "Stage") -> tuple[float, dict[str, float] | None]:
        """Time of one replica's node of ``stage``: adding what it received, chunk by chunk, or packing a bucket."""
        if not stage.adds and not stage.copy_bytes:
            return 0.0, None
        parts = [(stage.adds, chunk_add_time(stage.add_bytes))] if stage.adds else []
        if stage.copy_bytes:
            parts.append((1, chunk_copy_time(stage.copy_bytes)))
        by_kind = {kind: sum(count * times[kind] for count, (_, times) in parts) for kind in parts[0][1][1]}
        return sum(count * seconds for count, (seconds, _) in parts), by_kind


def input_transfers(stage: "Stage", k: int) -> list[tuple[int, int]]:
    """What replica ``k``'s node of ``stage`` receives from other replicas: (replica, bytes) each."""
    return [(q, amount) for _, q, amount in stage.inputs[k] if q != k]


#: Where a :class:`Stage`'s input comes from besides an earlier stage: the bucket's gradients, or the
#: parameters a sharded optimizer updated (each tensor's share of ``amount``-th).
GRADIENTS, UPDATED = -1, -2
#: Collectives that reduce the gradients: PyTorch DDP's (NCCL's) ring, or direct exchanges within each
#: host, then between hosts.
COLLECTIVES = ("ring", "direct")


@dataclass(frozen=True)
class Stage:
    """One step of a bucket's collective: a node on every replica.

    Attributes
    ----------
    op : str
    adds : int
        Received chunks the node adds into its own, of ``add_bytes`` each.
    add_bytes, output_bytes : int
    inputs : list of list of (source, replica, amount)
        Per replica, what its node reads: ``source`` is an earlier stage
        (``amount``: bytes read) or, on the replica itself, :data:`GRADIENTS` /
        :data:`UPDATED` (every tensor of the bucket, ``1/amount`` of it; whole for 1).
    copy_bytes : int
        Bytes the node copies into a flat buffer (a bucket of gradients).
    role : str
        What the step does to the bucket, for the runtime that executes it: ``pack``
        (the gradients into a flat buffer), ``shard`` (the updated parameters of a sharded
        optimizer into it), ``ring_reduce`` / ``ring_gather`` (one ring step),
        ``within_reduce`` / ``across_reduce`` / ``across_gather`` / ``within_gather``
        (a direct exchange within or between hosts).
    step : int
        The ring step of its role (0 first); 0 for the others.
    """

    op: str
    adds: int
    add_bytes: int
    output_bytes: int
    inputs: list[list[tuple[int, int, int]]]
    copy_bytes: int = 0
    role: str = "pack"
    step: int = 0


def _check_collective(collective: str, hosts: list[list[int]] | None, replicas: int) -> None:
    """OptionError unless ``collective`` is known and ``hosts`` (if given) splits the replicas into hosts of one size."""
    if collective not in COLLECTIVES:
        raise OptionError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}")
    if hosts is not None and (
        sorted(k for members in hosts for k in members) != list(range(replicas))
        or len({len(members) for members in hosts}) != 1
    ):
        raise OptionError(f"hosts must split replicas 0..{replicas - 1} into hosts of one size, got {hosts!r}")


def collective_stages(
    layout: ReplicaLayout, b: int, collective: str = "ring", hosts: list[list[int]] | None = None
) -> tuple[list[Stage], int]:
    """The stages that reduce bucket ``b`` on every replica, and the one whose output the optimizer reads.

    ``ring``: ``2 (n - 1)`` steps, step ``s`` on replica ``k`` receiving
    1/n of the bucket from step ``s - 1`` on replica ``k - 1`` (reduce-scatter
    then all-gather; Patarasuk and Yuan 2009), as NCCL's ring. ``direct``:
    each replica receives its 1/m slice of the bucket from every other replica
    of its host (m per host) at once and adds them, then its 1/n part of that
    slice from the replicas of the same rank on the other hosts; the
    all-gather retraces the two steps (a two-shot all-reduce within a host,
    hierarchical between hosts). On links of their own per pair of devices
    every replica then sends on n - 1 links at once, where the ring uses one,
    and between hosts the bucket crosses the network once per direction,
    where the ring sends ``2 (n - 1) / n`` of it. ``hosts`` lists the replicas
    of each host (equal sizes; default one host).

    Either starts by copying the bucket's gradients into one flat buffer, as
    DDP does, so that each step sends one slice of it rather than a piece of
    every gradient; a sharded optimizer's all-gather sends the flat shard it
    updated (as ZeRO's partitions).
    """
    r = layout.replicas
    total = layout.bucket_bytes(b)
    stages: list[Stage] = []

    def append(stage: Stage) -> int:
        stages.append(stage)
        return len(stages) - 1

    # As DDP, the gradients are copied into one flat bucket, whose slices the collective sends; a sharded
    # optimizer updates a flat shard of it, which the all-gather sends on.
    source = append(Stage("bucket.pack", 0, 0, total, [[(GRADIENTS, k, 1)] for k in range(r)], copy_bytes=total))

    def shard() -> int:
        return append(Stage("shard.pack", 0, 0, -(-total // r), [[(UPDATED, k, r)] for k in range(r)], role="shard"))

    if collective == "ring":
        chunk = -(-total // r)
        own = total
        for s in range(2 * (r - 1)):
            reduce = s < r - 1
            if layout.sharded and s == r - 1:
                reduced, source, own = source, shard(), chunk
            op = (
                ("reduce_scatter.add" if reduce else "all_gather.copy")
                if layout.sharded
                else ("allreduce.add" if reduce else "allreduce.copy")
            )
            inputs = [[(source, k, own), (source, (k - 1) % r, chunk)] for k in range(r)]
            role, step = ("ring_reduce", s) if reduce else ("ring_gather", s - (r - 1))
            source, own = (
                append(Stage(op, int(reduce), chunk, total if s == 2 * r - 3 else chunk, inputs, role=role, step=step)),
                chunk,
            )
        return stages, (reduced if layout.sharded else source)
    hosts = hosts or [list(range(r))]
    m = len(hosts[0])
    host_of = {k: h for h, members in enumerate(hosts) for k in members}
    rank = {k: a for members in hosts for a, k in enumerate(members)}
    within = [hosts[host_of[k]] for k in range(r)]
    across = [[members[rank[k]] for members in hosts] for k in range(r)]
    piece, part = -(-total // m), -(-total // r)
    # Reduce-scatter within each host, then between hosts (either is skipped where it has one replica).
    own = total
    for peers, size, role in ((within, piece, "within_reduce"), (across, part, "across_reduce")):
        if len(peers[0]) > 1:
            inputs = [[(source, q, own if q == k else size) for q in peers[k]] for k in range(r)]
            source, own = append(Stage("reduce_scatter.add", len(peers[0]) - 1, size, size, inputs, role=role)), size
    reduced = source
    # All-gather: between hosts, then within each host.
    if layout.sharded:
        source = shard()
    amount = part
    for peers, size, role in ((across, piece, "across_gather"), (within, total, "within_gather")):
        if len(peers[0]) > 1:
            inputs = [[(source, q, amount) for q in peers[k]] for k in range(r)]
            source, amount = append(Stage("all_gather.copy", 0, 0, size, inputs, role=role)), size
    return stages, (reduced if layout.sharded else source)


def replica_layout(
    graph: OpGraph,
    replicas: int,
    bucket_bytes: int = BUCKET_BYTES,
    *,
    shard_optimizer: bool = False,
    first_bucket_bytes: int = FIRST_BUCKET_BYTES,
) -> ReplicaLayout:
    """The gradients, their buckets and each node's share of the work for ``replicas`` replicas.

    Raises
    ------
    OptionError
        If ``replicas`` < 1 or ``bucket_bytes`` < 1.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> layout = replica_layout(g, 2)
    >>> [g.ids[i] for i in np.flatnonzero(layout.factor == 1.0)]       # whole in each replica: the updates
    ['block1.b0.update', 'block0.b0.update']
    >>> len(layout.buckets), layout.bucket_bytes(0) <= FIRST_BUCKET_BYTES or len(layout.buckets[0]) == 1
    (2, True)
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise OptionError(f"replicas must be an integer >= 1, got {replicas!r}")
    if bucket_bytes < 1:
        raise OptionError(f"bucket_bytes must be >= 1, got {bucket_bytes!r}")
    r, n = replicas, graph.num_nodes
    sharded = shard_optimizer and r > 1
    batch = batch_dependent(graph)
    walks, optimizer = _state_writes(graph) if r > 1 else ({}, np.zeros(n, dtype=bool))
    grads = _in_topological_order(graph, walks)
    # The optimizer's state writes depend on the batch through the gradient, yet write whole tensors.
    writes = np.zeros(n, dtype=bool)
    for writers, _ in walks.values():
        writes[writers] = True
    per_batch = batch & ~optimizer & ~writes
    factor = np.where(per_batch, 1.0 / r, 1.0)
    param_factor = np.ones(n)
    updated: dict[tuple[int, int], int] = {}
    if sharded:
        # ZeRO stage 1: every replica runs the optimizer on its 1/r of every parameter.
        arithmetic = _optimizer_arithmetic(graph, optimizer, batch) | writes
        factor[arithmetic] = 1.0 / r
        ptr, eids = graph.out_edges
        for key, (writers, found) in walks.items():
            members = graph.colocation_groups[key]
            inside = set(members.tolist())
            readers = {int(graph.dst[e]) for m in members.tolist() for e in eids[ptr[m] : ptr[m + 1]].tolist()}
            if all(arithmetic[v] or v in inside for v in readers):
                param_factor[members] = 1.0 / r  # optimizer state, which only the optimizer reads
            else:
                for g in found:  # a parameter, which the step reads too
                    updated.setdefault(g, max(writers))
        first_write: dict[tuple[int, int], int] = {}
        for writers, found in walks.values():
            for g in found:
                first_write[g] = min(first_write.get(g, n), *writers)
        for g in grads:  # a gradient no parameter's update was traced to: its first state write
            updated.setdefault(g, first_write[g])
    grad_set = set(grads)
    is_grad_edge = np.fromiter(
        ((u, t) in grad_set for u, t in zip(graph.src.tolist(), graph.edge_tensor.tolist())),
        dtype=bool,
        count=graph.num_edges,
    )
    grad_bytes = {}
    for e in np.flatnonzero(is_grad_edge).tolist():
        g = (int(graph.src[e]), int(graph.edge_tensor[e]))
        grad_bytes[g] = max(grad_bytes.get(g, 0), int(graph.edge_bytes[e]))
    # A bucket is reduced once all its gradients are, and its readers wait for it: a gradient computed
    # after a reader of another (one parameter group's update feeding the next one's gradient) starts a
    # bucket of its own, or the bucket would wait on its own readers. Buckets follow the producers'
    # topological order, so they never wait on one another in a circle either.
    after = _reads_reduced(graph, grads, is_grad_edge)
    buckets: list[list[tuple[int, int]]] = []
    filled, first = bucket_bytes, 0
    for i, g in enumerate(grads):
        # The first bucket is small, as DDP's: its reduction starts while backward goes on.
        cap = min(bucket_bytes, first_bucket_bytes) if len(buckets) == 1 else bucket_bytes
        if (filled + grad_bytes[g] > cap and filled > 0) or after[g[0]] >= first:
            buckets.append([])
            filled, first = 0, i
        buckets[-1].append(g)
        filled += grad_bytes[g]
    return ReplicaLayout(r, sharded, factor, per_batch, param_factor, is_grad_edge, buckets, grad_bytes, updated)


def _reads_reduced(graph: OpGraph, grads: list[tuple[int, int]], is_grad_edge: np.ndarray) -> list[int]:
    """Per node, the highest index into ``grads`` of a gradient whose reader it is or depends on; -1 for none.

    A gradient whose producer has a value ``>= i`` cannot share a bucket with gradient ``i``: it is
    computed after the reduced bucket is read.
    """
    after = [-1] * graph.num_nodes
    if not grads:
        return after
    index = {g: i for i, g in enumerate(grads)}
    src, dst, tensor = graph.src.tolist(), graph.dst.tolist(), graph.edge_tensor.tolist()
    for e in np.flatnonzero(is_grad_edge).tolist():
        after[dst[e]] = max(after[dst[e]], index[(src[e], tensor[e])])
    ptr, eids = graph.out_edges
    ptr, eids = ptr.tolist(), eids.tolist()
    for u in graph.topological_order.tolist():
        a = after[u]
        if a >= 0:
            for k in range(ptr[u], ptr[u + 1]):
                v = dst[eids[k]]
                if after[v] < a:
                    after[v] = a
    return after


def data_parallel_graph(
    graph: OpGraph,
    replicas: int,
    *,
    bucket_bytes: int = BUCKET_BYTES,
    shard_optimizer: bool = False,
    collective: str = "ring",
    hosts: list[list[int]] | None = None,
    first_bucket_bytes: int = FIRST_BUCKET_BYTES,
    collective_cost: dict | None = None,
) -> DataParallelGraph:
    """``replicas`` copies of the step on 1/``replicas`` of the batch each, with all-reduces of the gradients.

    Parameters
    ----------
    graph : OpGraph
    replicas : int
        Number of replicas (devices), >= 1.
    bucket_bytes : int
        Gradients are reduced in buckets of about this many bytes.
    shard_optimizer : bool
        ZeRO stage 1 (Rajbhandari et al., SC 2020): each bucket is
        reduce-scattered (the first ``n - 1`` ring steps), every replica
        updates its 1/n of each parameter (the optimizer's nodes take 1/n of
        the time, its state 1/n of the memory), and the updated parameters
        are all-gathered (the other ``n - 1`` steps, fed by each parameter's
        write). Same ring traffic as the all-reduce, 1/n of the optimizer.
    collective : {"ring", "direct"}
        How each bucket is reduced (:func:`collective_stages`).
    hosts : list of list of int, optional
        The replicas of each host, for ``direct`` (equal sizes; default one host).
    first_bucket_bytes : int
        The first bucket's size, as DDP's (1 MiB): the last layers' gradients,
        whose reduction then starts while backward goes on.
    collective_cost : dict, optional
        The measured ``torch.distributed`` collectives the buckets run as and
        the link their messages take (:func:`collective_cost`): each bucket's
        steps then also take, as their replica's work, the time the measured
        collective needs beyond its messages over the link
        (:func:`collective_excess`). Recorded in the graph's
        ``extra["data_parallel"]``.

    Returns
    -------
    DataParallelGraph

    Raises
    ------
    OptionError
        If ``replicas`` < 1, ``bucket_bytes`` < 1, ``collective`` is unknown, or
        ``hosts`` does not split the replicas into hosts of one size.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> dp = data_parallel_graph(g, 2)
    >>> [g.ids[u] for u, _ in gradients(g)[0]]
    ['block1.b0.bwd_weight', 'block0.b0.bwd_weight']
    >>> dp.graph.num_nodes - 2 * g.num_nodes     # two ~16 MiB buckets: a pack and 2 (n - 1) steps on each replica
    12
    """
    layout = replica_layout(
        graph, replicas, bucket_bytes, shard_optimizer=shard_optimizer, first_bucket_bytes=first_bucket_bytes
    )
    _check_collective(collective, hosts, replicas)
    n, r = graph.num_nodes, replicas
    scaled = layout.per_batch
    samples = _replica_samples(graph, r)
    param_bytes = np.rint(graph.param_bytes * layout.param_factor).astype(np.int64).tolist()
    fields: dict[str, list] = {k: [] for k in _DEFAULTS}
    ids: list[str] = []
    replica_of: list[int] = []
    original: list[int] = []
    keep = np.flatnonzero(~layout.is_grad_edge)  # readers of a gradient read the all-reduced bucket instead
    columns: dict[float, tuple] = {}

    def scaled_columns(share: float) -> tuple:
        """A replica's columns for its share of the batch, built once per share (at most two: the batch
        may not divide by the replicas), a column at a time (graphs of 10^5 nodes)."""
        if share not in columns:
            factor = np.where(scaled, share, layout.factor)
            # Per-kind times scaled once: the replicas share the dicts (a graph's are never changed in place).
            by_kind = [
                part_times(times, (extra or {}).get("fixed_s"), f)
                for times, extra, f in zip(graph.compute_s_by_kind, graph.node_extra, factor.tolist())
            ]
            # Tensors out of a scaled node shrink with the batch (no kept edge carries a gradient).
            columns[share] = (
                (graph.compute_s * factor).tolist(),
                np.rint(graph.output_bytes * factor).astype(np.int64).tolist(),
                np.rint(graph.temp_bytes * factor).astype(np.int64).tolist(),
                (graph.flops * factor).tolist(),
                by_kind,
                np.rint(graph.edge_bytes[keep] * factor[graph.src[keep]]).astype(np.int64),
            )
        return columns[share]

    ebytes = []
    for k in range(r):
        share = 1.0 / r if samples is None else samples[k] / sum(samples)
        compute_s, output_bytes, temp_bytes, flops, by_kind, kept_bytes = scaled_columns(share)
        ebytes.append(kept_bytes)
        ids += [f"r{k}/{x}" for x in graph.ids]
        fields["compute_s"] += compute_s
        fields["output_bytes"] += output_bytes
        fields["param_bytes"] += param_bytes
        fields["temp_bytes"] += temp_bytes
        fields["flops"] += flops
        fields["op"] += graph.op
        fields["layer"] += graph.layer
        fields["colocation"] += [None if c is None else f"r{k}/{c}" for c in graph.colocation]
        fields["device_kinds"] += graph.device_kinds
        fields["compute_s_by_kind"] += by_kind
        fields["splittable"] += [
            _replica_splittable(sp, k, r, samples) if sc else sp for sp, sc in zip(graph.splittable, scaled.tolist())
        ]
        fields["node_extra"] += [
            {**extra, "replica": k, "replica_of": x} for extra, x in zip(graph.node_extra, graph.ids)
        ]
        replica_of += [k] * n
        original += range(n)
    base = np.arange(r * n, dtype=np.int64).reshape(r, n)

    def add(node_id: str, rep: int, **values) -> int:
        ids.append(node_id)
        for key in fields:
            fields[key].append(values.get(key, _DEFAULTS[key]))
        replica_of.append(rep)
        original.append(-1)
        return len(ids) - 1

    src = [base[k, graph.src[keep]] for k in range(r)]
    dst = [base[k, graph.dst[keep]] for k in range(r)]
    etensor = [graph.edge_tensor[keep]] * r
    extra_src: list[int] = []
    extra_dst: list[int] = []
    extra_bytes: list[int] = []
    extra_tensor: list[int] = []

    last_step: dict[tuple[int, int], int] = {}  # (bucket, replica) -> node of the stage the readers read
    taken = set(ids)  # the steps' ids are new, whatever the graph's are named
    for b, members in enumerate(layout.buckets):
        names = [graph.ids[u] + (f":{t}" if t else "") for u, t in members]
        stages, reduced = collective_stages(layout, b, collective, hosts)
        excess = collective_excess(stages, layout.bucket_bytes(b), r, layout.sharded, collective_cost)
        stage_node = np.empty((r, len(stages)), dtype=np.int64)
        for s, stage in enumerate(stages):
            cost, by_kind = layout.stage_compute(stage)
            if excess[s]:
                cost += excess[s]
                by_kind = {kind: t + excess[s] for kind, t in (by_kind or {}).items()} or None
            for k in range(r):
                stage_node[k, s] = add(
                    fresh_id(f"r{k}/allreduce{b}.step{s}", taken),
                    k,
                    compute_s=cost,
                    compute_s_by_kind=by_kind and dict(by_kind),
                    output_bytes=stage.output_bytes,
                    op=stage.op,
                    node_extra={
                        "replica": k,
                        "allreduce": {
                            "bucket": b,
                            "step": s,
                            "gradients": names,
                            "sharded": layout.sharded,
                            "collective": collective,
                        },
                    },
                )
            for k in range(r):
                for source, q, amount in stage.inputs[k]:
                    if source >= 0:
                        extra_src.append(stage_node[q, source])
                        extra_dst.append(stage_node[k, s])
                        extra_bytes.append(amount)
                        extra_tensor.append(0)
                        continue
                    for g in members:
                        u, t = g if source == GRADIENTS else (layout.updated[g], 0)
                        extra_src.append(base[q, u])
                        extra_dst.append(stage_node[k, s])
                        extra_bytes.append(-(-layout.grad_bytes[g] // amount))
                        extra_tensor.append(t)
        for k in range(r):
            last_step[(b, k)] = int(stage_node[k, reduced])
    # Readers of each gradient read their replica's reduced bucket (a sharded optimizer: its shard of it).
    bucket_of = {g: b for b, members in enumerate(layout.buckets) for g in members}
    for e in np.flatnonzero(layout.is_grad_edge).tolist():
        b = bucket_of[(int(graph.src[e]), int(graph.edge_tensor[e]))]
        nbytes = int(graph.edge_bytes[e])
        for k in range(r):
            extra_src.append(last_step[(b, k)])
            extra_dst.append(base[k, graph.dst[e]])
            extra_bytes.append(-(-nbytes // r) if layout.sharded else nbytes)
            extra_tensor.append(0)
    out = OpGraph(
        ids,
        fields["compute_s"],
        np.concatenate(src + [np.asarray(extra_src, dtype=np.int64)]),
        np.concatenate(dst + [np.asarray(extra_dst, dtype=np.int64)]),
        np.concatenate(ebytes + [np.asarray(extra_bytes, dtype=np.int64)]),
        np.concatenate(etensor + [np.asarray(extra_tensor, dtype=np.int64)]),
        output_bytes=fields["output_bytes"],
        param_bytes=fields["param_bytes"],
        temp_bytes=fields["temp_bytes"],
        flops=fields["flops"],
        op=fields["op"],
        layer=fields["layer"],
        colocation=fields["colocation"],
        device_kinds=fields["device_kinds"],
        compute_s_by_kind=fields["compute_s_by_kind"],
        splittable=fields["splittable"],
        node_extra=fields["node_extra"],
        name=graph.name,
        extra={
            **graph.extra,
            "data_parallel": {
                "replicas": r,
                "buckets": len(layout.buckets),
                "sharded_optimizer": layout.sharded,
                "bucket_bytes": int(bucket_bytes),
                "first_bucket_bytes": int(first_bucket_bytes),
                "hosts": hosts,
                **({"collective_cost": collective_cost} if collective_cost else {}),
            },
        },
    )
    return DataParallelGraph(out, np.asarray(replica_of, dtype=np.int64), np.asarray(original, dtype=np.int64))


_DEFAULTS = {"compute_s": 0.0, **NODE_DEFAULTS}


def collective_cost(cluster: Cluster | None, devices: Sequence[int]) -> dict | None:
    """What the buckets' collectives cost among ``devices``, where a calibration measured them: the
    ``extra["collectives"]`` of the channels between them (:func:`~placer.harness.calibrate.apply_calibration`)
    with those channels' ``link`` (latency and bandwidth). None where a pair has no channel or one carries
    no measured collectives, or the channels differ (the collective's cost is then its messages').

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> collective_cost(load_cluster("2xcpu"), [0, 1]) is None     # not calibrated
    True
    """
    if cluster is None or len(devices) < 2:
        return None
    found = set()
    for i in devices:
        for j in devices:
            if i == j:
                continue
            c = int(cluster.channel_index[i, j])
            if c < 0 or "collectives" not in cluster.channels[c].extra:
                return None
            channel = cluster.channels[c]
            link = {
                "latency_s": float(channel.latency_s),
                "bandwidth_bytes_per_s": float(channel.bandwidth_bytes_per_s),
            }
            found.add(json.dumps({**channel.extra["collectives"], "link": link}, sort_keys=True))
    return json.loads(found.pop()) if len(found) == 1 else None


def collective_excess(
    stages: Sequence["Stage"], bucket_bytes: int, replicas: int, sharded: bool, cost: dict | None
) -> list[float]:
    """Seconds each step of a bucket's collective takes, as its replica's work, beyond its messages.

    A bucket's collective runs on one process per device as one ``torch.distributed`` call
    (:mod:`placer.runtime.replicas`): an all-reduce, or with a sharded optimizer an all-reduce then
    an all-gather of the updated shards. The reference model charges its steps' messages to the
    link, ``latency + bytes / bandwidth`` each; the measured call takes
    ``T(S) = latency_k + S / bandwidth_k`` on a bucket of ``S`` bytes (scaled by
    ``(r - 1) / r`` against the ranks it was measured on, as a ring's traffic). What ``T``
    exceeds the messages by (gloo's reductions and copies on the ranks' own cores, its
    threads' hand-offs) is spread over the phase's steps, which the replica's device then
    runs: the phase then takes at least ``T``. Steps that pack a buffer take none.

    Parameters
    ----------
    stages : sequence of Stage
        The bucket's steps (:func:`collective_stages`).
    bucket_bytes, replicas, sharded
        The bucket's size, the replicas, whether the optimizer is sharded.
    cost : dict or None
        :func:`collective_cost`'s; None: no step takes any.

    Returns
    -------
    list of float
        Per step, seconds.

    Examples
    --------
    A 2-rank all-reduce of 16 MB measured at 13 ms over a 4 GB/s link whose two messages
    take 4 ms: each of the two steps takes 4.5 ms more.

    >>> cost = {"ranks": 2, "all_reduce": {"latency_s": 0.0, "bandwidth_bytes_per_s": 16e6 / 13e-3},
    ...         "all_gather": {"latency_s": 0.0, "bandwidth_bytes_per_s": 1e9},
    ...         "link": {"latency_s": 0.0, "bandwidth_bytes_per_s": 4e9}}
    >>> ring = [Stage("bucket.pack", 0, 0, 16_000_000, [[(GRADIENTS, 0, 1)], [(GRADIENTS, 1, 1)]]),
    ...         Stage("allreduce.add", 1, 8_000_000, 8_000_000, [[(0, 0, 16_000_000), (0, 1, 8_000_000)],
    ...               [(0, 1, 16_000_000), (0, 0, 8_000_000)]], role="ring_reduce"),
    ...         Stage("allreduce.copy", 0, 8_000_000, 16_000_000, [[(1, 0, 8_000_000), (1, 1, 8_000_000)],
    ...               [(1, 1, 8_000_000), (1, 0, 8_000_000)]], role="ring_gather")]
    >>> [round(x * 1e3, 3) for x in collective_excess(ring, 16_000_000, 2, False, cost)]
    [0.0, 4.5, 4.5]
    """
    out = [0.0] * len(stages)
    if not cost or replicas < 2:
        return out
    link = cost["link"]
    ranks = max(2, int(cost["ranks"]))  # a collective needs two ranks to have been measured
    scale = ((replicas - 1) / replicas) / ((ranks - 1) / ranks)

    def measured(kind: str) -> float:
        fit = cost[kind]
        return fit["latency_s"] + scale * bucket_bytes / fit["bandwidth_bytes_per_s"]

    def messages(stage: "Stage") -> float:
        """The longest message into one replica's step (a ring sends one; a direct exchange sends on
        links of its own at once)."""
        amounts = [amount for k in range(replicas) for _, amount in input_transfers(stage, k)]
        return max((link["latency_s"] + a / link["bandwidth_bytes_per_s"] for a in amounts), default=0.0)

    steps = [s for s, stage in enumerate(stages) if stage.role.endswith(("_reduce", "_gather"))]
    phases = (
        [
            ("all_reduce", [s for s in steps if stages[s].role.endswith("_reduce")]),
            ("all_gather", [s for s in steps if stages[s].role.endswith("_gather")]),
        ]
        if sharded
        else [("all_reduce", steps)]
    )
    for kind, members in phases:
        if members:
            extra = max(0.0, measured(kind) - sum(messages(stages[s]) for s in members))
            for s in members:
                out[s] = extra / len(members)
    return out


def replicated_node(graph: OpGraph) -> int | None:
    """The first node of ``graph`` that belongs to a data-parallel replica or its all-reduce (None: the
    graph replicates nothing).

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> replicated_node(g), replicated_node(data_parallel_graph(g, 2).graph)
    (None, 0)
    """
    return next((i for i, extra in enumerate(graph.node_extra) if "replica_of" in extra or "allreduce" in extra), None)


def _replica_samples(graph: OpGraph, replicas: int) -> list[int] | None:
    """The samples of each replica's slice of the batch where the graph records its ``batch_size`` (a
    capture's: the first replicas take one more where it does not divide), else None (a 1/replicas share)."""
    batch = graph.extra.get("batch_size")
    if batch is None:
        return None
    return [hi - lo for lo, hi in part_rows(int(batch), replicas)]


def _replica_splittable(
    splittable: list[dict] | None, replica: int, replicas: int, samples: list[int] | None = None
) -> list[dict] | None:
    """A replica's share of the batch dimension (the other dimensions keep their extent): the rows of its
    ``samples`` (rows are a multiple of the batch, a sample's rows in one block), else a 1/replicas part."""
    if not splittable:
        return splittable
    out = []
    for item in splittable:
        if item.get("dim") == "batch":
            size = int(item["size"])
            if samples is None or size % sum(samples):
                lo, hi = part_rows(size, replicas)[replica]
            else:
                per_sample = size // sum(samples)
                lo, hi = per_sample * sum(samples[:replica]), per_sample * sum(samples[: replica + 1])
            if hi - lo < 1:
                continue
            item = {**item, "size": hi - lo}
        out.append(item)
    return out or None


def chunk_add_time(chunk: int) -> tuple[float, dict[str, float]]:
    """Roofline time of adding a received chunk into the local one (read two, write one).

    Returns the V100 time (``compute_s``, the presets' speed-1.0 kind) and the time on every kind.
    """
    return _roofline_times(chunk / 4, 3.0 * chunk)


def chunk_copy_time(nbytes: int) -> tuple[float, dict[str, float]]:
    """Roofline time of copying ``nbytes`` into a flat buffer (read and write them), as :func:`chunk_add_time`."""
    return _roofline_times(0.0, 2.0 * nbytes)


@lru_cache(maxsize=2048)
def _roofline_times(flops: float, nbytes: float) -> tuple[float, dict[str, float]]:

    times = {k: float(node_time_s(k, flops, nbytes)) for k in DEVICE_SPECS}
    return times["V100"], times


@register_transform(
    "replicate",
    requires="replicas >= 1; hosts, if given, splits the replicas into hosts of one size (for the direct collective).",
    trials=lambda graph: [
        {"replicas": 2},
        {"replicas": 3, "shard_optimizer": True},
        {"replicas": 4, "collective": "direct", "hosts": [[0, 1], [2, 3]]},
    ],
    ensures=Ensures(
        compute=SHARE_AND_WHOLE,
        output_bytes=SHARE_OR_WHOLE,
        param_bytes=SHARE_OR_WHOLE,
        temp_bytes=SHARE_OR_WHOLE,
        transfers=None,
        note="A batch-proportional node's replicas share its work (each paying its fixed part whole, part_times) "
        "and memory by their slices of the batch; any other node is whole in every replica (a sharded "
        "optimizer's arithmetic and state are shared instead). A tensor shrinks with its producer's share. "
        "Added: the all-reduce steps of every gradient bucket, which stand for no original node; readers of a "
        "gradient read their replica's reduced bucket instead.",
    ),
)
def replicate_transform(
    graph: OpGraph,
    cluster: Cluster | None,
    *,
    replicas: int,
    bucket_bytes: int = BUCKET_BYTES,
    shard_optimizer: bool = False,
    collective: str = "ring",
    hosts: list | None = None,
    first_bucket_bytes: int = FIRST_BUCKET_BYTES,
) -> TransformResult:
    """The data-parallel graph (:func:`data_parallel_graph`): node ``u``'s replicas stand for ``u``.

    Strong scaling: replica ``k`` of ``r`` works on ``b_k`` of the batch's
    ``B`` samples (``sum_k b_k = B``; ``b_k / B = 1 / r`` where the graph
    records no batch size), so a batch-proportional node's replicas take
    ``b_k / B`` of its time and memory, which sum to the whole, while every
    other node (parameters, optimizer state and arithmetic, their writes) is
    whole in each. Replica ``k`` is copy ``k``; the all-reduce steps are added
    and stand for no original node.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=1)
    >>> r = replicate_transform(g, None, replicas=2)
    >>> [r.graph.ids[v] for v in r.image[0]], int(r.added.sum())
    (['r0/input', 'r1/input'], 12)
    """
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)):
        raise OptionError(f"option replicas of transform 'replicate' must be an integer >= 1, got {replicas!r}")
    if hosts is not None and not (
        isinstance(hosts, (list, tuple))
        and all(
            isinstance(members, (list, tuple))
            and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in members)
            for members in hosts
        )
    ):
        raise OptionError(f"option hosts of transform 'replicate' must be lists of replica numbers, got {hosts!r}")
    dp = data_parallel_graph(
        graph,
        int(replicas),
        bucket_bytes=bucket_bytes,
        shard_optimizer=shard_optimizer,
        collective=collective,
        hosts=None if hosts is None else [list(h) for h in hosts],
        first_bucket_bytes=first_bucket_bytes,
    )
    new = dp.graph
    # Each new node's original from the replication's record; each original's replicas by their ids.
    origin = NodeMap.from_groups([[u] if u >= 0 else [] for u in dp.original.tolist()], graph.num_nodes)
    image = NodeMap.from_groups(
        [[new.index[f"r{k}/{x}"] for k in range(int(replicas))] for x in graph.ids], new.num_nodes
    )
    return TransformResult(new, graph, origin, image, dp.original < 0, dp.replica, dp)
