"""Celeritas operation fusion: CPD-TOPO ordering and the optimal sequential partition.

Celeritas fuses a large graph into a coarse one before placing it. The nodes
are first laid out in a topological order that keeps the critical path
together (CPD-TOPO: depth first, children of the node just output pushed to
the head of the queue, the child with the longest path through it on top).
Then Kernighan's sequential-partition dynamic programme cuts that sequence
into contiguous clusters so that the communication crossing the cuts is
minimal, with at most ``R`` nodes (the exploration range) and ``M`` bytes
(the memory cap) per cluster. Contiguous pieces of a topological order never
form a cycle (the paper's Lemma 2), so the coarse graph is a DAG.

Costs follow the paper's linear communication model: a node weighs its mean
duration over the cluster's devices, an edge ``latency + bytes / bandwidth``
with the mean latency and inverse bandwidth of the cluster's links.

Contract (``fuse`` through :func:`~placer.transform.base.apply_transform`,
:func:`fuse_transform`): a cluster of members ``M`` runs them one after
another, so its duration on every device is ``sum`` over ``M`` (exact per
kind where a kind's devices share one speed), its parameters and outputs
``sum`` over ``M`` and its workspace ``max`` over ``M``; between two
clusters it sends each original tensor once, as the reference model does.
The fused graph carries no colocation and no device kinds:
:attr:`FusedGraph.allowed` holds the devices each cluster may use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import OptionError
from ..graph import OpGraph, static_footprint
from ..paths import bottom_levels, top_levels
from .base import CUT, MAX, SUM, Ensures, TransformResult, register_transform
from .coarsen import summed_times_by_kind

__all__ = [
    "FusedGraph",
    "fuse",
    "link_costs",
    "ccr",
    "cpath",
    "cpd_topo_order",
    "dfs_topo_order",
    "head_first_order",
    "optimal_breakpoints",
    "group_allowed",
    "fuse_transform",
    "fuse_in_order",
]


def link_costs(graph: OpGraph, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Node and edge weights of the paper's cost model on ``cluster``.

    Returns
    -------
    node_w : ndarray
        Mean duration of each node over the devices.
    edge_c : ndarray
        ``latency + bytes * seconds_per_byte`` of each edge, with the mean over
        the connected device pairs (0 on a one-device cluster).

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> cluster = PRESETS["2xV100-nvlink"]()
    >>> node_w, edge_c = link_costs(OpGraph(["a", "b"], [2.0, 4.0], [0], [1], [0]), cluster)
    >>> node_w.tolist(), bool(edge_c[0] == cluster.latency[0, 1])    # an empty edge costs the latency
    ([2.0, 4.0], True)
    """
    node_w = graph.durations(cluster).mean(axis=1) if graph.num_nodes else np.zeros(0)
    latency, inverse = _mean_link(cluster)
    return node_w, latency + graph.edge_bytes * inverse


def _mean_link(cluster: Cluster) -> tuple[float, float]:
    linked = cluster.channel_index >= 0
    if not linked.any():
        return 0.0, 0.0
    return float(cluster.latency[linked].mean()), float(cluster.inverse_bandwidth[linked].mean())


def ccr(node_w: np.ndarray, edge_c: np.ndarray) -> float:
    """Communication-to-computation ratio (the paper's Equation 1): summed edge over summed node weight.

    Examples
    --------
    >>> ccr(np.array([1.0, 3.0]), np.array([2.0])), ccr(np.zeros(2), np.zeros(1)), ccr(np.zeros(1), np.ones(1))
    (0.5, 0.0, inf)
    """
    total = float(np.sum(node_w))
    comm = float(np.sum(edge_c))
    return comm / total if total > 0 else (0.0 if comm == 0 else float("inf"))


def cpath(graph: OpGraph, node_w: np.ndarray, edge_c: np.ndarray) -> np.ndarray:
    """``tlevel + blevel`` of every node (Equations 2 and 3): the longest path through it."""
    return top_levels(graph, node_w, edge_c) + bottom_levels(graph, node_w, edge_c)


def head_first_order(graph: OpGraph, priority: np.ndarray) -> np.ndarray:
    """Topological order that outputs the head of a queue and pushes newly ready children to its head.

    The sources start the queue by decreasing ``priority``; the children of
    the node just output are visited by increasing ``priority`` and each one
    that becomes ready is pushed to the head, so the highest-priority child
    comes out next. Ties go to the lower node index. O(V + E) after one sort
    of the edges by (source, child priority).

    Returns
    -------
    ndarray of int
        Node indices in output order.

    Examples
    --------
    From ``a``, whose children ``b`` and ``c`` join in ``d``, the child of the
    higher priority comes first:

    >>> g = OpGraph(["a", "b", "c", "d"], [1.0] * 4, [0, 0, 1, 2], [1, 2, 3, 3], [8] * 4)
    >>> head_first_order(g, np.array([0.0, 1.0, 2.0, 0.0])).tolist()
    [0, 2, 1, 3]
    """
    n = graph.num_nodes
    priority = np.asarray(priority, dtype=np.float64)
    index = np.arange(n)
    # Children of each node by increasing (priority, -index): pushed in that order, the last one is on top.
    edge_order = np.lexsort((-graph.dst, priority[graph.dst], graph.src))
    children = graph.dst[edge_order].tolist()
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.src, minlength=n), out=ptr[1:])
    ptr = ptr.tolist()
    indegree = np.bincount(graph.dst, minlength=n).tolist()
    sources = index[np.asarray(indegree, dtype=np.int64) == 0] if n else index
    stack = sources[np.lexsort((-sources, priority[sources]))].tolist()  # the head is the end of the list
    out: list[int] = []
    while stack:
        u = stack.pop()
        out.append(u)
        for k in range(ptr[u], ptr[u + 1]):
            v = children[k]
            indegree[v] -= 1
            if indegree[v] == 0:
                stack.append(v)
    return np.asarray(out, dtype=np.int64)


def dfs_topo_order(graph: OpGraph) -> np.ndarray:
    """DFS-TOPO (Section 4.2.2): ready children go to the head of the queue, first-listed child first."""
    return head_first_order(graph, -np.arange(graph.num_nodes, dtype=np.float64))


def cpd_topo_order(graph: OpGraph, node_w: np.ndarray, edge_c: np.ndarray) -> np.ndarray:
    """CPD-TOPO (Algorithm 1, function CPD_Topo): DFS-TOPO with children and sources ranked by cpath."""
    return head_first_order(graph, cpath(graph, node_w, edge_c))


def group_allowed(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Boolean ``(nodes, devices)``: devices a node may use, given its kinds and those of its colocation group."""
    allowed = graph.allowed(cluster)
    for members in graph.colocation_groups.values():
        allowed[members] = allowed[members].all(axis=0)
    return allowed


def optimal_breakpoints(
    n: int,
    src_pos: np.ndarray,
    dst_pos: np.ndarray,
    edge_c: np.ndarray,
    node_mem: np.ndarray,
    *,
    exploration_range: int,
    memory_cap: float,
    device_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Kernighan's optimal sequential partition (Equations 4-6, function Optimal_BP), in O(V * R).

    The sequence ``0 .. n-1`` is cut into contiguous clusters ``[b_k, b_{k+1})``
    minimising the summed cost of the edges that cross a cut, subject to at
    most ``exploration_range`` nodes and ``memory_cap`` bytes per cluster (a
    single node over the cap forms a cluster alone) and, with ``device_mask``,
    one device allowed for every member.

    ``S(j) = min over i of S(i) + cost(i, j)`` where ``cost(i, j)`` sums the
    edges from ``[i, j)`` to ``[j, n)``. For the current ``j`` the programme
    keeps ``W[k]``, the cost of the edges from ``k`` to ``[j, n)``; ``cost(i, j)``
    is then a suffix sum of ``W`` over the window (the recursion of Equation 5).

    Parameters
    ----------
    n : int
    src_pos, dst_pos : ndarray of int
        Edge endpoints as positions in the sequence, ``src_pos < dst_pos``.
    edge_c : ndarray of float
    node_mem : ndarray
        Memory of each position.
    exploration_range, memory_cap
        ``R`` and ``M`` of Equation 6.
    device_mask : ndarray of int64, optional
        Bit set of the devices each position may use.

    Returns
    -------
    ndarray of int
        The breakpoints ``0 = b_0 < b_1 < ... < b_K = n``.

    Examples
    --------
    Four positions, clusters of at most two: cutting at 2 crosses the edges
    ``0 -> 2`` and ``1 -> 3`` (cost 1 + 5), which beats every other cut:

    >>> optimal_breakpoints(4, np.array([0, 0, 1, 2]), np.array([1, 2, 3, 3]), np.array([5.0, 1.0, 5.0, 1.0]),
    ...                     np.zeros(4), exploration_range=2, memory_cap=1e9).tolist()
    [0, 2, 4]
    """
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    window = int(exploration_range)
    out_c = np.bincount(src_pos, weights=edge_c, minlength=n)
    by_dst = np.argsort(dst_pos, kind="stable")
    in_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_pos, minlength=n), out=in_ptr[1:])
    in_src, in_c = src_pos[by_dst], edge_c[by_dst]
    cum_mem = np.concatenate([[0.0], np.cumsum(np.asarray(node_mem, dtype=np.float64))])
    ends = np.arange(n + 1)
    lowest = np.maximum(ends - window, np.searchsorted(cum_mem, cum_mem - memory_cap, side="left"))
    lowest = np.minimum(lowest, ends - 1).tolist()
    in_ptr, in_src, in_c = in_ptr.tolist(), in_src.tolist(), in_c.tolist()
    best = np.zeros(n + 1)
    previous = np.zeros(n + 1, dtype=np.int64)
    pending = out_c.copy()  # W[k] for k < j: cost of the edges from k to the positions >= j
    for j in range(1, n + 1):
        for e in range(in_ptr[j - 1], in_ptr[j]):  # edges into j-1 no longer cross a cut at j
            pending[in_src[e]] -= in_c[e]
        lo = lowest[j]
        if device_mask is not None:
            common = np.bitwise_and.accumulate(device_mask[lo:j][::-1])
            empty = np.flatnonzero(common == 0)
            if empty.size:
                lo = j - int(empty[0])
        cost = np.cumsum(pending[lo:j][::-1])[::-1]
        candidates = best[lo:j] + cost
        # Among (rounding-)equal costs take the earliest breakpoint: the fewest, largest clusters.
        k = int(np.argmax(candidates <= candidates.min() * (1 + 1e-9) + 1e-15))
        best[j] = candidates[k]
        previous[j] = lo + k
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(previous[cuts[-1]]))
    return np.asarray(cuts[::-1], dtype=np.int64)


@dataclass
class FusedGraph:
    """A graph fused into clusters, and how to map results back.

    Attributes
    ----------
    graph : OpGraph
        The original graph.
    coarse : OpGraph
        One node per cluster (``cluster<k>``); its compute is the members' sum on
        every device, its edges carry the bytes of one transfer per (tensor,
        destination cluster) crossing between clusters.
    cluster_of : ndarray of int
        Cluster of every original node.
    members : list of ndarray
        Original nodes of each cluster, in CPD-TOPO order.
    order : ndarray of int
        The CPD-TOPO order of the original nodes.
    position : ndarray of int
        Position of every original node in ``order``.
    allowed : ndarray of bool, shape (clusters, devices)
        Devices every member (and its colocation group) may use.
    ccr_before, ccr_after : float
        Communication-to-computation ratio of the original and of the coarse graph.
    memory_cap : float
        ``M``: the most bytes of static footprint in a cluster of two nodes or more.
    """

    graph: OpGraph
    coarse: OpGraph
    cluster_of: np.ndarray
    members: list[np.ndarray]
    order: np.ndarray
    position: np.ndarray
    allowed: np.ndarray
    ccr_before: float
    ccr_after: float
    memory_cap: float

    @property
    def num_clusters(self) -> int:
        return self.coarse.num_nodes

    def map_back(self, values: np.ndarray) -> np.ndarray:
        """Per-cluster values (e.g. a device per cluster) as per-original-node values."""
        return np.asarray(values)[self.cluster_of]


def fuse(
    graph: OpGraph, cluster: Cluster, *, exploration_range: int = 200, memory_fraction: float = 0.25
) -> FusedGraph:
    """Optimal Operation Fusion (Algorithm 1): CPD-TOPO order, optimal breakpoints, coarse DAG.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
        Supplies the cost model (mean durations and links) and memory.
    exploration_range : int
        ``R``: the most nodes per cluster (the paper uses 200).
    memory_fraction : float
        ``M`` as a share of the smallest device memory (the paper uses 0.25);
        memory is a node's static footprint (parameters, output, workspace).

    Returns
    -------
    FusedGraph

    Raises
    ------
    OptionError
        ``exploration_range`` below 1 or ``memory_fraction`` not in (0, 1].

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> fused = fuse(training_graph(layers=4), load_cluster("2xV100-nvlink"), exploration_range=8)
    >>> fused.num_clusters < fused.graph.num_nodes and fused.ccr_after <= fused.ccr_before
    True

    References
    ----------
    Zhang et al., "Celeritas: Fast Optimizer for Large Dataflow Graphs", Section 5.1 and
    Algorithm 1; Kernighan, "Optimal sequential partitions of graphs", J. ACM 18(1), 1971.
    """
    _check_fusion_options(exploration_range, memory_fraction)
    node_w, edge_c = link_costs(graph, cluster)
    order = cpd_topo_order(graph, node_w, edge_c)
    return _fuse_along(graph, cluster, order, node_w, edge_c, int(exploration_range), memory_fraction)


def fuse_in_order(
    graph: OpGraph, cluster: Cluster, order: np.ndarray, *, exploration_range: int = 200, memory_fraction: float = 0.25
) -> FusedGraph:
    """Optimal sequential partition of a topological ``order`` given by the caller, and its coarse DAG.

    :func:`fuse` with the CPD-TOPO order replaced: contiguous pieces of any
    topological order form a DAG (the paper's Lemma 2), so the caller may
    lay the nodes out another way (e.g. each node that does no work moved
    next to its first consumer) and still get a coarse DAG.

    Parameters
    ----------
    graph, cluster, exploration_range, memory_fraction
        As for :func:`fuse`.
    order : ndarray of int
        A topological order of ``graph``'s nodes.

    Returns
    -------
    FusedGraph
        Its ``order`` is ``order``.

    Raises
    ------
    OptionError
        As :func:`fuse`, or ``order`` not a topological order of the graph.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> graph, cluster = training_graph(layers=4), load_cluster("2xV100-nvlink")
    >>> fused = fuse_in_order(graph, cluster, dfs_topo_order(graph), exploration_range=8)
    >>> bool((fused.order == dfs_topo_order(graph)).all())
    True
    """
    _check_fusion_options(exploration_range, memory_fraction)
    n = graph.num_nodes
    order = np.asarray(order, dtype=np.int64)
    position = np.full(n, -1, dtype=np.int64)
    if order.shape != (n,) or np.any(order < 0) or np.any(order >= n):
        raise OptionError(f"order must list each of the {n} nodes once")
    position[order] = np.arange(n)
    if np.any(position < 0) or np.any(position[graph.src] >= position[graph.dst]):
        raise OptionError("order must be a topological order of the graph, each node listed once")
    node_w, edge_c = link_costs(graph, cluster)
    return _fuse_along(graph, cluster, order, node_w, edge_c, int(exploration_range), memory_fraction)


def _fuse_along(
    graph: OpGraph,
    cluster: Cluster,
    order: np.ndarray,
    node_w: np.ndarray,
    edge_c: np.ndarray,
    exploration_range: int,
    memory_fraction: float,
) -> FusedGraph:
    """The optimal fusion of ``graph`` along the topological ``order`` (:func:`optimal_breakpoints`)."""
    n = graph.num_nodes
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    allowed = group_allowed(graph, cluster)
    mask = None
    if not allowed.all():
        # Devices differ only by kind here, so one bit per distinct column of ``allowed`` is enough.
        columns = np.unique(allowed, axis=1)
        mask = (columns[order].astype(np.int64) << np.arange(columns.shape[1], dtype=np.int64)).sum(axis=1)
    memory_cap = float(memory_fraction) * float(cluster.memory.min())
    cuts = optimal_breakpoints(
        n,
        position[graph.src],
        position[graph.dst],
        edge_c,
        static_footprint(graph)[order],
        exploration_range=exploration_range,
        memory_cap=memory_cap,
        device_mask=mask,
    )
    sizes = np.diff(cuts)
    cluster_of = np.empty(n, dtype=np.int64)
    cluster_of[order] = np.repeat(np.arange(sizes.size), sizes)
    members = np.split(order, cuts[1:-1]) if n else []
    coarse = _coarse_graph(graph, cluster, cluster_of, sizes.size)
    coarse_allowed = np.ones((sizes.size, cluster.num_devices), dtype=bool)
    np.logical_and.at(coarse_allowed, cluster_of, allowed)
    coarse_w, coarse_c = link_costs(coarse, cluster)
    return FusedGraph(
        graph,
        coarse,
        cluster_of,
        members,
        order,
        position,
        coarse_allowed,
        ccr(node_w, edge_c),
        ccr(coarse_w, coarse_c),
        memory_cap,
    )


def _check_fusion_options(exploration_range: int, memory_fraction: float) -> None:
    """Raise OptionError as :func:`fuse` does for a bad ``exploration_range`` or ``memory_fraction``."""
    if (
        isinstance(exploration_range, bool)
        or not isinstance(exploration_range, (int, np.integer))
        or exploration_range < 1
    ):
        raise OptionError(f"option exploration_range must be an integer >= 1, got {exploration_range!r}")
    if not (isinstance(memory_fraction, (int, float)) and 0 < memory_fraction <= 1):
        raise OptionError(
            f"option memory_fraction must be in (0, 1], a share of the smallest device's memory, "
            f"got {memory_fraction!r}"
        )


def _coarse_graph(graph: OpGraph, cluster: Cluster, cluster_of: np.ndarray, k: int) -> OpGraph:
    """The quotient graph: one node per cluster, one edge per pair of clusters with data between them."""
    src_c, dst_c = cluster_of[graph.src], cluster_of[graph.dst]
    cut = np.flatnonzero(src_c != dst_c)
    # One transfer per (producer, tensor, destination cluster), of its largest edge, as the reference model sends.
    s, t, d, b = graph.src[cut], graph.edge_tensor[cut], dst_c[cut], graph.edge_bytes[cut]
    by_key = np.lexsort((b, d, t, s))
    s, t, d, b = s[by_key], t[by_key], d[by_key], b[by_key]
    last = np.ones(s.size, dtype=bool)
    if s.size:
        last[:-1] = (s[1:] != s[:-1]) | (t[1:] != t[:-1]) | (d[1:] != d[:-1])
    pair = cluster_of[s[last]] * k + d[last]
    pairs, inverse = np.unique(pair, return_inverse=True)
    pair_bytes = np.bincount(inverse, weights=b[last], minlength=pairs.size).astype(np.int64)
    by_order = np.argsort(cluster_of, kind="stable")
    members = np.split(by_order, np.flatnonzero(np.diff(cluster_of[by_order])) + 1) if k else []
    by_kind = summed_times_by_kind(graph, members, cluster)
    temp = np.zeros(k, dtype=np.int64)
    np.maximum.at(temp, cluster_of, graph.temp_bytes)
    return OpGraph(
        [f"cluster{c}" for c in range(k)],
        np.bincount(cluster_of, weights=graph.compute_s, minlength=k),
        pairs // k if k else pairs,
        pairs % k if k else pairs,
        pair_bytes,
        output_bytes=np.bincount(cluster_of, weights=graph.output_bytes, minlength=k).astype(np.int64),
        param_bytes=np.bincount(cluster_of, weights=graph.param_bytes, minlength=k).astype(np.int64),
        temp_bytes=temp,
        compute_s_by_kind=by_kind,
        name=f"{graph.name}-fused",
    )


@register_transform(
    "fuse",
    needs_cluster=True,
    requires="A cluster: the cost model weighs nodes and edges on its devices.",
    trials=lambda graph: [{"exploration_range": 4}, {}],
    ensures=Ensures(
        compute=SUM,
        output_bytes=SUM,
        param_bytes=SUM,
        temp_bytes=MAX,
        transfers=CUT,
        constraints=False,
        note="The fused graph carries no colocation and no device kinds: FusedGraph.allowed (the "
        "detail) holds the devices each cluster may use. Durations sum on the cluster given "
        "where each kind's devices share one speed.",
    ),
)
def fuse_transform(
    graph: OpGraph, cluster: Cluster, *, exploration_range: int = 200, memory_fraction: float = 0.25
) -> TransformResult:
    """Celeritas's Optimal Operation Fusion (:func:`fuse`): each cluster node stands for its members.

    A cluster is a contiguous piece of a topological order (so the fused
    graph is acyclic, the paper's Lemma 2), run one member after another:
    its time on every device and its parameters and outputs are its members'
    sums, its workspace their largest; between two clusters it sends one
    transfer per (producer, tensor, consuming cluster), as the reference
    model does, summed into one edge per pair of clusters.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=4)
    >>> r = fuse_transform(g, load_cluster("2xV100-nvlink"), exploration_range=8)
    >>> r.graph.num_nodes == r.detail.num_clusters < g.num_nodes
    True
    >>> bool(np.isclose(r.graph.compute_s.sum(), g.compute_s.sum()))
    True
    """
    fused = fuse(graph, cluster, exploration_range=exploration_range, memory_fraction=memory_fraction)
    return TransformResult.quotient(graph, fused.coarse, fused.cluster_of, fused.members, fused)
