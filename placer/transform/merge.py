"""Merge-and-Colocate: shrink a graph by merging its cheapest nodes into neighbours.

Placeto (Addanki et al., NeurIPS 2019, appendix A.6) reduces a graph before
its policy sees it: the node with the lowest cost (the size of its output
tensor) is merged into a neighbour, repeatedly, until the graph has a target
number of nodes or no node is cheaper than a threshold; merged nodes are then
colocated. Here a merge never creates a cycle (so the result is again a DAG
that the reference simulator can play), never joins nodes with different
``device_kinds`` or different per-kind timings, and keeps colocation: coarse
nodes holding members of one colocation group share a colocation label.

:class:`Coarsening` maps every original node to its coarse node and expands a
placement of the coarse graph back to the original graph; registered as
``merge`` (:func:`merge_transform`), the transform returns it as the detail
of a :class:`~placer.transform.base.TransformResult`.

Contract: a coarse node ``g`` of members ``M`` runs them one after another
on one device, so its time on a device is ``sum(time[M])`` (exact on every
device: only nodes of equal kinds of per-kind timing merge), its
``param_bytes`` and ``output_bytes`` are ``sum`` over ``M`` and its
``temp_bytes`` ``max`` over ``M``; it sends, to each other coarse node, every
original tensor its members send there once, at its largest edge.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import OptionError
from ..graph import OpGraph
from .base import CUT, MAX, SUM, Ensures, TransformResult, register_transform

__all__ = ["merge_and_colocate", "Coarsening", "node_cost", "merge_transform"]

# A merge is checked for cycles by a search from the merged node's other
# neighbours; past this many visited nodes it is given up as unsafe.
_SEARCH_LIMIT = 512


@dataclass
class Coarsening:
    """A coarse graph and the map from original to coarse nodes.

    Attributes
    ----------
    graph : OpGraph
        The coarse DAG: times and parameters summed over members, outputs
        summed, workspace the largest, one edge per (original tensor, coarse
        consumer) carrying that tensor's largest edge.
    group_of : ndarray of int
        Coarse node of every original node.
    """

    graph: OpGraph
    group_of: np.ndarray

    def members(self, group: int) -> np.ndarray:
        """Original node indices merged into coarse node ``group``."""
        return np.flatnonzero(self.group_of == group)

    def expand(self, coarse_device_of: np.ndarray) -> np.ndarray:
        """The device of every original node from a device per coarse node."""
        return np.asarray(coarse_device_of, dtype=np.int64)[self.group_of]


def node_cost(graph: OpGraph) -> np.ndarray:
    """Placeto's merge cost: the size of a node's output tensor (its largest outgoing edge if larger).

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0] * 3, [0, 0], [1, 2], [8, 24], output_bytes=[16, 4, 0])
    >>> node_cost(g).tolist()
    [24.0, 4.0, 0.0]
    """
    out_edge = np.zeros(graph.num_nodes, dtype=np.int64)
    np.maximum.at(out_edge, graph.src, graph.edge_bytes)
    return np.maximum(graph.output_bytes, out_edge).astype(np.float64)


def merge_and_colocate(
    graph: OpGraph, *, target_nodes: int | None = None, cost_threshold: float | None = None
) -> Coarsening:
    """Merge the cheapest node into a neighbour until ``target_nodes`` remain or none costs less than ``cost_threshold``.

    The cheapest node (by :func:`node_cost`, summed over merged members) goes
    into the successor it sends most bytes to, else into the predecessor it
    receives most bytes from, choosing the first whose merge leaves the graph
    acyclic and joins nodes of the same device kinds and per-kind timings.
    A node no neighbour accepts is left alone.

    A merge is acyclic when no other path joins the two nodes: for ``g``
    before ``h``, no successor of ``g`` besides ``h`` reaches ``h`` (a search
    that gives up past a few hundred nodes counts as a path, so an unsafe
    merge is never made). Coarse costs follow the module's contract.

    Parameters
    ----------
    graph : OpGraph
    target_nodes : int, optional
        Stop when this many nodes remain (at least 1). At least one of
        ``target_nodes`` and ``cost_threshold`` must be given.
    cost_threshold : float, optional
        Stop when the cheapest remaining node costs at least this many bytes.

    Returns
    -------
    Coarsening

    Raises
    ------
    OptionError
        If neither stopping rule is given, or one is out of range.

    References
    ----------
    Addanki et al., "Placeto: Learning Generalizable Device Placement Algorithms
    for Distributed Machine Learning", NeurIPS 2019, appendix A.6.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=4, branches=2)
    >>> c = merge_and_colocate(g, target_nodes=16)
    >>> c.graph.num_nodes, c.group_of.shape == (g.num_nodes,)
    (16, True)
    """
    if target_nodes is None and cost_threshold is None:
        raise OptionError("merge_and_colocate needs target_nodes or cost_threshold")
    if target_nodes is not None and (
        isinstance(target_nodes, bool) or not isinstance(target_nodes, (int, np.integer)) or target_nodes < 1
    ):
        raise OptionError(f"option target_nodes must be an integer >= 1, got {target_nodes!r}")
    if cost_threshold is not None and not cost_threshold >= 0:
        raise OptionError(f"option cost_threshold must be a number >= 0, got {cost_threshold!r}")
    target = 1 if target_nodes is None else int(target_nodes)
    threshold = np.inf if cost_threshold is None else float(cost_threshold)

    n = graph.num_nodes
    succ: list[dict[int, int]] = [{} for _ in range(n)]  # group -> neighbour group -> bytes between
    pred: list[dict[int, int]] = [{} for _ in range(n)]
    for s, d, b in zip(graph.src.tolist(), graph.dst.tolist(), graph.edge_bytes.tolist()):
        succ[s][d] = succ[s].get(d, 0) + b
        pred[d][s] = pred[d].get(s, 0) + b
    cost = node_cost(graph).tolist()
    kind_key = [(graph.device_kinds[i], tuple(sorted(graph.compute_s_by_kind[i] or ()))) for i in range(n)]
    # At most one colocation key per group: colocated nodes merged into unrelated neighbours would
    # otherwise tie those groups together, and chains of such ties pin much of the graph to one device.
    coloc = list(graph.colocation)
    parent = list(range(n))  # merged group -> the group it went into
    version = [0] * n
    heap = [(cost[i], i, 0) for i in range(n)]
    heapq.heapify(heap)
    alive = n

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def reaches(starts: list[int], goal: int, forward: bool) -> bool:
        """Whether ``goal`` is reachable from ``starts`` (True also when the search is cut short)."""
        adjacency = succ if forward else pred
        seen = set(starts)
        stack = list(starts)
        while stack:
            x = stack.pop()
            if x == goal:
                return True
            if len(seen) > _SEARCH_LIMIT:
                return True
            for y in adjacency[x]:
                if y not in seen:
                    seen.add(y)
                    stack.append(y)
        return False

    def acyclic_merge(g: int, h: int, g_before_h: bool) -> bool:
        first, second = (g, h) if g_before_h else (h, g)
        others = [x for x in succ[first] if x != second]
        if not others or len(pred[second]) == 1:
            return True
        return not reaches(others, second, forward=True)

    def merge(g: int, into: int) -> None:
        for nbrs, back in ((succ, pred), (pred, succ)):
            for x, b in nbrs[g].items():
                del back[x][g]
                if x != into:
                    nbrs[into][x] = nbrs[into].get(x, 0) + b
                    back[x][into] = back[x].get(into, 0) + b
            nbrs[g] = {}
        succ[into].pop(g, None)
        pred[into].pop(g, None)
        parent[g] = into
        coloc[into] = coloc[into] or coloc[g]
        cost[into] += cost[g]
        version[into] += 1
        heapq.heappush(heap, (cost[into], into, version[into]))

    while alive > target and heap:
        c, g, ver = heapq.heappop(heap)
        if parent[g] != g or ver != version[g]:
            continue
        if c >= threshold:
            break
        candidates = [(h, True) for h, _ in sorted(succ[g].items(), key=lambda kv: (-kv[1], kv[0]))]
        candidates += [(h, False) for h, _ in sorted(pred[g].items(), key=lambda kv: (-kv[1], kv[0]))]
        for h, g_before_h in candidates:
            compatible = kind_key[h] == kind_key[g] and (coloc[g] is None or coloc[h] is None or coloc[g] == coloc[h])
            if compatible and acyclic_merge(g, h, g_before_h):
                merge(g, h)
                alive -= 1
                break
    roots = np.array([find(i) for i in range(n)], dtype=np.int64)
    return _coarse_graph(graph, roots)


def _coarse_graph(graph: OpGraph, roots: np.ndarray) -> Coarsening:
    """Number the groups by their first member in topological order and build the coarse DAG."""
    first: dict[int, int] = {}
    for i in graph.topological_order.tolist():
        first.setdefault(int(roots[i]), i)
    heads = sorted(first.values())  # keep the original listing order among coarse nodes
    index_of_root = {int(roots[h]): k for k, h in enumerate(heads)}
    group_of = np.array([index_of_root[int(r)] for r in roots], dtype=np.int64)
    m = len(heads)

    def per_group(values, how=np.add):
        out = np.zeros(m, dtype=np.asarray(values).dtype)
        how.at(out, group_of, values)
        return out

    by_kind: list[dict | None] = [None] * m
    for i, kinds in enumerate(graph.compute_s_by_kind):
        if kinds:
            g = group_of[i]
            acc = by_kind[g] = by_kind[g] or {}
            for kind, t in kinds.items():
                acc[kind] = acc.get(kind, 0.0) + t
    # Colocation: coarse nodes sharing a member's colocation key must share a device.
    label = list(range(m))

    def find(x: int) -> int:
        while label[x] != x:
            label[x] = label[label[x]]
            x = label[x]
        return x

    for members in graph.colocation_groups.values():
        head = find(int(group_of[members[0]]))
        for g in np.unique(group_of[members]).tolist():
            r = find(g)
            if r != head:
                label[r] = head
    roots_of = [find(g) for g in range(m)]
    tied = np.bincount(roots_of, minlength=m)
    colocation = [f"merged:{graph.ids[heads[roots_of[g]]]}" if tied[roots_of[g]] > 1 else None for g in range(m)]
    # One coarse edge per (original tensor, coarse consumer), carrying its largest edge.
    gs, gd = group_of[graph.src], group_of[graph.dst]
    cross = np.flatnonzero(gs != gd)
    edges: dict[tuple[int, int, int], int] = {}
    for e in cross.tolist():
        key = (int(graph.src[e]), int(graph.edge_tensor[e]), int(gd[e]))
        edges[key] = max(edges.get(key, 0), int(graph.edge_bytes[e]))
    tensor_index: dict[tuple[int, int], int] = {}
    counter = np.zeros(m, dtype=np.int64)
    src, dst, nbytes, tensor = [], [], [], []
    for (s, t, d), b in sorted(edges.items()):
        key = (s, t)
        if key not in tensor_index:
            tensor_index[key] = int(counter[group_of[s]])
            counter[group_of[s]] += 1
        src.append(int(group_of[s]))
        dst.append(d)
        nbytes.append(b)
        tensor.append(tensor_index[key])
    sizes = np.bincount(group_of, minlength=m)
    coarse = OpGraph(
        [graph.ids[h] for h in heads],
        per_group(graph.compute_s),
        src,
        dst,
        nbytes,
        tensor,
        output_bytes=per_group(graph.output_bytes),
        param_bytes=per_group(graph.param_bytes),
        temp_bytes=per_group(graph.temp_bytes, np.maximum),
        flops=per_group(np.nan_to_num(graph.flops)),
        op=[graph.op[h] if sizes[g] == 1 else "merged" for g, h in enumerate(heads)],
        layer=[graph.layer[h] for h in heads],
        colocation=colocation,
        device_kinds=[graph.device_kinds[h] for h in heads],
        compute_s_by_kind=by_kind,
        name=f"{graph.name}/merged{m}",
    )
    return Coarsening(coarse, group_of)


def _merge_trials(graph: OpGraph) -> list[dict]:
    """A third of the nodes; and the median cost as the threshold."""
    cost = node_cost(graph)
    return [
        {"target_nodes": max(1, graph.num_nodes // 3)},
        {"cost_threshold": float(np.median(cost)) if cost.size else 0.0},
    ]


@register_transform(
    "merge",
    requires="target_nodes or cost_threshold (or both).",
    trials=_merge_trials,
    ensures=Ensures(
        compute=SUM,
        output_bytes=SUM,
        param_bytes=SUM,
        temp_bytes=MAX,
        transfers=CUT,
        note="Only nodes of the same device kinds and the same kinds of per-kind timing merge, so "
        "durations sum on any cluster.",
    ),
)
def merge_transform(
    graph: OpGraph, cluster: Cluster | None, *, target_nodes: int | None = None, cost_threshold: float | None = None
) -> TransformResult:
    """Placeto's Merge-and-Colocate (:func:`merge_and_colocate`): each merged node stands for its members.

    A merged node runs its members one after another on one device, so its
    time on a device is the sum of theirs, its parameters and outputs the sum
    of theirs, and its workspace the largest of theirs (one is live at a
    time); what crosses between merged nodes is what the reference model
    sends between their members.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2, branches=2)
    >>> r = merge_transform(g, None, target_nodes=8)
    >>> r.graph.num_nodes, int(r.graph.param_bytes.sum()) == int(g.param_bytes.sum())
    (8, True)
    """
    if target_nodes is not None and (isinstance(target_nodes, bool) or not isinstance(target_nodes, (int, np.integer))):
        raise OptionError(f"option target_nodes must be an integer >= 1, got {target_nodes!r}")
    if cost_threshold is not None and (
        isinstance(cost_threshold, bool) or not isinstance(cost_threshold, (int, float, np.integer, np.floating))
    ):
        raise OptionError(f"option cost_threshold must be a number >= 0, got {cost_threshold!r}")
    merged = merge_and_colocate(graph, target_nodes=target_nodes, cost_threshold=cost_threshold)
    return TransformResult.quotient(graph, merged.graph, merged.group_of, None, merged)
