"""Acyclic graph coarsening by batch merging of matched edges (Pesto, Section 3.3).

Exact solvers cannot take tens of thousands of operations, so Pesto merges
operations along edges until the graph is small, and must never create a
cycle (a coarse graph with a cycle has no schedule). Merging edges one at a
time needs a path test per merge (Theorem 3.2); Pesto instead merges a whole
matching per round, using vertex heights to prove that no cycle appears
(Theorem 3.5). Heavy edges (the most bytes) are merged first, since the
transfers they carry are the ones most worth keeping on one device.

The conditions used here, for a matched edge (u, v) with heights H:

- type S: every successor of u has height >= H(v) (covers Theorem 3.5's
  ``|succ(u)| = 1`` and ``H(w) > H(u) + d`` for the other successors w);
- type P: every predecessor of v has height <= H(u) (covers
  ``|prec(v)| = 1`` and ``H(v) = H(u) + 1``).

A merged pair gets the key ``H(v) - 1/2`` (S) or ``H(u) + 1/2`` (P), a single
node the key ``H``. Then every in-neighbour of a merged pair has a smaller
height than its key and every out-neighbour a larger one, so every coarse
edge touching a single node goes up in key; an edge between two merged pairs
is accepted only if it goes up too (this is Theorem 3.5's condition (iii):
for pairs with ``d = 1`` it forbids exactly an edge ``(u_i, v_j)`` with
``H(u_i) = H(v_j) - d_j``, the crossing of Figure 6). Keys rising along every
edge prove the coarse graph acyclic; it is checked all the same.

Colocation groups stay whole: a coarse node carries its members' group, and
a coarse node holding members of several groups joins them into one (named
by their labels joined with ``|``), so any placement of the coarse graph
keeps every original group on one device. Nodes are merged only while some
device kind suits every member of the groups they join.

Contract (:data:`QUOTIENT_ENSURES`, checked by :mod:`placer.transform.checks`):
a coarse node of members ``M`` has ``sum(time[M])`` on every device,
``sum`` of their parameters and outputs and ``max`` of their workspaces,
and between coarse nodes the original's transfers, once each
(:func:`contract`). Registered as ``coarsen`` and ``contract``
(:func:`~placer.transform.base.apply_transform`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import GraphCycleError, OptionError
from ..graph import OpGraph
from .base import CUT, MAX, SUM, Ensures, TransformResult, register_transform
from .split import fresh_id

__all__ = [
    "Coarsening",
    "coarsen",
    "heights",
    "acyclic_matching",
    "contract",
    "summed_times_by_kind",
    "coarsen_transform",
    "contract_transform",
    "QUOTIENT_ENSURES",
]

#: A round merging fewer pairs than this share of the nodes doubles the size cap (or ends the coarsening).
STALL_FRACTION = 0.01


@dataclass
class Coarsening:
    """A coarse graph and how it maps back to the original one.

    Attributes
    ----------
    graph : OpGraph
        The coarse graph: one node per group of original nodes.
    group_of : ndarray of int
        Coarse node index of every original node.
    members : list of ndarray
        Original node indices of each coarse node, in the original graph's
        topological order (the order a device runs them in).
    rounds : int
        Batch-merging rounds run.
    """

    graph: OpGraph
    group_of: np.ndarray
    members: list[np.ndarray]
    rounds: int

    def expand(self, coarse_values: np.ndarray) -> np.ndarray:
        """A value per original node from a value per coarse node (e.g. a device index)."""
        return np.asarray(coarse_values)[self.group_of]


def heights(graph: OpGraph) -> np.ndarray:
    """Height of every node (Definition 3.4): 1 for roots, else 1 + the largest height of a predecessor.

    Heights rise by at least one along every edge, which is what the
    matching's keys build on.

    Examples
    --------
    >>> heights(OpGraph(["a", "b", "c", "d"], [1.0] * 4, [0, 0, 1], [1, 3, 3], [8, 8, 8])).tolist()
    [1, 2, 1, 3]
    """
    h = np.ones(graph.num_nodes, dtype=np.int64)
    ptr, eids = graph.in_edges
    src = graph.src
    for v in graph.topological_order.tolist():
        inputs = eids[ptr[v] : ptr[v + 1]]
        if inputs.size:
            h[v] = h[src[inputs]].max() + 1
    return h


class _Units:
    """Union-find over colocation groups, with the device kinds each (growing) group may use.

    A node without a group is its own unit. Merging two nodes joins their
    units, which is allowed only while some device kind suits every member.
    """

    def __init__(self, graph: OpGraph):
        self.parent: dict = {}
        self.kinds: dict = {}
        self.unit = [("group", c) if c is not None else ("node", i) for i, c in enumerate(graph.colocation)]
        for u, k in zip(self.unit, graph.device_kinds):
            self.parent.setdefault(u, u)
            if k is not None:
                self.kinds[u] = set(k) if self.kinds.get(u) is None else self.kinds[u] & set(k)

    def find(self, u):
        while self.parent[u] != u:
            self.parent[u] = self.parent[self.parent[u]]
            u = self.parent[u]
        return u

    def joined_kinds(self, a: int, b: int):
        """Kinds left if nodes a and b join (None: any kind), or False if none is left."""
        ra, rb = self.find(self.unit[a]), self.find(self.unit[b])
        ka, kb = self.kinds.get(ra), self.kinds.get(rb)
        if ra == rb or ka is None or kb is None:
            return ka if kb is None else kb
        return ka & kb or False

    def join(self, a: int, b: int) -> None:
        kinds = self.joined_kinds(a, b)
        ra, rb = self.find(self.unit[a]), self.find(self.unit[b])
        if ra != rb:
            self.parent[rb] = ra
            self.kinds[ra] = kinds


def acyclic_matching(
    graph: OpGraph,
    *,
    labels: np.ndarray | None = None,
    size: np.ndarray | None = None,
    size_cap: float = np.inf,
    max_pairs: int | None = None,
) -> list[tuple[int, int]]:
    """A matching of edges whose simultaneous merging keeps the graph acyclic, heaviest edges first.

    Parameters
    ----------
    graph : OpGraph
    labels : array of int, optional
        Only nodes with equal labels are merged (e.g. a placement to respect).
    size : array of float, optional
        A size per node (e.g. compute time); a pair is merged only if its
        summed size is at most ``size_cap``.
    size_cap : float
    max_pairs : int, optional
        Stop after this many pairs.

    Returns
    -------
    list of (u, v)
        Edges ``u -> v`` to merge, in the order they were chosen.

    Examples
    --------
    The crossing of Figure 6: merging both ``(u1, v1)`` and ``(u2, v2)``
    would make a cycle (``u1 -> v2`` and ``u2 -> v1`` then run both ways
    between the two pairs), so only the heavier pair is merged:

    >>> g = OpGraph(["u1", "v1", "u2", "v2"], [1.0] * 4, [0, 2, 0, 2], [1, 3, 3, 1], [9, 8, 1, 1])
    >>> acyclic_matching(g)
    [(0, 1)]

    In a diamond ``a -> b, c -> d`` both pairs go forward, and both merge:

    >>> g = OpGraph(["a", "b", "c", "d"], [1.0] * 4, [0, 0, 1, 2], [1, 2, 3, 3], [9, 1, 1, 9])
    >>> acyclic_matching(g)
    [(0, 1), (2, 3)]

    References
    ----------
    Hafeez, Sun, Gandhi and Liu, Pesto (Middleware 2021), Section 3.3, Theorem 3.5.
    """
    n = graph.num_nodes
    if graph.num_edges == 0:
        return []
    h = heights(graph)
    min_succ = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(min_succ, graph.src, h[graph.dst])
    max_pred = np.zeros(n, dtype=np.int64)
    np.maximum.at(max_pred, graph.dst, h[graph.src])
    # Parallel edges count once, with their bytes summed.
    pairs, inverse = np.unique(np.stack([graph.src, graph.dst]), axis=1, return_inverse=True)
    weight = np.bincount(inverse.reshape(-1), weights=graph.edge_bytes, minlength=pairs.shape[1])
    u, v = pairs
    type_s = min_succ[u] == h[v]
    type_p = max_pred[v] == h[u]
    ok = type_s | type_p
    if labels is not None:
        ok &= labels[u] == labels[v]
    if size is not None:
        ok &= size[u] + size[v] <= size_cap
    cand = np.flatnonzero(ok)
    # Merges that would join two colocation groups (constraining the placement more) come last.
    coloc = np.array([c is not None for c in graph.colocation])
    label = np.array([c or "" for c in graph.colocation], dtype=object)
    joins = coloc[u] & coloc[v] & (label[u] != label[v])
    cand = cand[np.lexsort((v[cand], u[cand], -weight[cand], joins[cand]))]
    # Keys doubled to stay integral: 2H for single nodes, 2H(v)-1 (S) or 2H(u)+1 (P) for pairs.
    key = np.where(type_s, 2 * h[v] - 1, 2 * h[u] + 1)
    group_key = np.full(n, -1, dtype=np.int64)  # key of the accepted pair a node belongs to, -1 if none
    out_ptr, out_e = graph.out_edges
    in_ptr, in_e = graph.in_edges
    units = _Units(graph)
    chosen: list[tuple[int, int]] = []
    limit = len(cand) if max_pairs is None else max_pairs
    for k in cand.tolist():
        if len(chosen) >= limit:
            break
        a, b = int(u[k]), int(v[k])
        if group_key[a] >= 0 or group_key[b] >= 0 or units.joined_kinds(a, b) is False:
            continue
        kk = int(key[k])
        consistent = True
        for x in (a, b):
            preds = graph.src[in_e[in_ptr[x] : in_ptr[x + 1]]]
            succs = graph.dst[out_e[out_ptr[x] : out_ptr[x + 1]]]
            gp = group_key[preds]
            gs = group_key[succs]
            if np.any((gp >= 0) & (gp >= kk)) or np.any((gs >= 0) & (gs <= kk)):
                consistent = False
                break
        if consistent:
            group_key[a] = group_key[b] = kk
            units.join(a, b)
            chosen.append((a, b))
    return chosen


def _groups_from_pairs(n: int, pairs: list[tuple[int, int]]) -> np.ndarray:
    parent = np.arange(n)
    for a, b in pairs:
        parent[b] = a
    return parent


def contract(
    graph: OpGraph, group_of: np.ndarray, *, cluster: Cluster | None = None
) -> tuple[OpGraph, list[np.ndarray]]:
    """The graph with each group of nodes merged into one node.

    Groups are renumbered in topological order of the coarse graph's first
    members. Compute times and FLOPs add up; parameters and outputs add up;
    the workspace is the largest member's (members run one at a time). One
    coarse edge is kept per (producer, tensor, consumer group), with the
    largest bytes, so that the coarse graph's transfers are the original ones.

    Parameters
    ----------
    graph : OpGraph
    group_of : array of int
        A group label per node (any integers).
    cluster : Cluster, optional
        With it, the coarse ``compute_s_by_kind`` holds the exact summed time
        for every kind whose devices share one speed, so that the coarse graph
        times every device like its members do.

    Returns
    -------
    coarse : OpGraph
    members : list of ndarray
        Original nodes of each coarse node, in topological order.

    Raises
    ------
    GraphCycleError
        If merging the groups creates a cycle.

    Notes
    -----
    For a group ``M``: ``compute_s = sum(compute_s[M])``, and on a kind whose
    devices share one speed ``s`` (given ``cluster``), the summed per-kind time
    ``sum(time_on_kind[M])``, where a member without an entry for the kind
    takes ``compute_s / s`` (:func:`summed_times_by_kind`): the coarse node
    lasts on every such device what its members last one after another.
    ``temp_bytes = max(temp_bytes[M])``: one member's workspace is live at a
    time. The reference model sends a producer's tensor once to a device that
    reads it, however many of its nodes do, so one edge per (producer, tensor,
    consuming group) carries the original's transfers between groups, no
    more and no less. The coarse node allows the kinds every member allows
    (their intersection), and colocation groups sharing a coarse node join.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0], [0, 0, 1, 2], [1, 2, 3, 3], [8, 8, 4, 4],
    ...             temp_bytes=[5, 7, 1, 1])
    >>> coarse, members = contract(g, np.array([0, 0, 1, 1]))
    >>> coarse.ids, coarse.compute_s.tolist(), coarse.temp_bytes.tolist(), coarse.edge_bytes.tolist()
    (['a+1', 'c+1'], [3.0, 7.0], [7, 1], [8, 4])
    >>> [m.tolist() for m in members]
    [[0, 1], [2, 3]]

    ``a`` sends its one tensor to ``b`` and ``c``: in the coarse graph only to
    ``c``'s group, once (8 bytes); ``b -> d`` carries 4.
    """
    n = graph.num_nodes
    position = np.empty(n, dtype=np.int64)
    position[graph.topological_order] = np.arange(n)
    labels, group_of = np.unique(np.asarray(group_of), return_inverse=True)
    group_of = group_of.reshape(-1)
    n_groups = labels.size
    first = np.full(n_groups, n, dtype=np.int64)
    np.minimum.at(first, group_of, position)
    renumber = np.empty(n_groups, dtype=np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(n_groups)
    group_of = renumber[group_of]
    by_group = np.lexsort((position, group_of))
    cuts = np.flatnonzero(np.diff(group_of[by_group])) + 1
    members = np.split(by_group, cuts) if n else []

    compute = np.bincount(group_of, weights=graph.compute_s, minlength=n_groups)
    flops = np.bincount(group_of, weights=graph.flops, minlength=n_groups)
    sums = {
        name: np.bincount(group_of, weights=getattr(graph, name), minlength=n_groups).astype(np.int64)
        for name in ("output_bytes", "param_bytes")
    }
    temp = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(temp, group_of, graph.temp_bytes)
    by_kind = summed_times_by_kind(graph, members, cluster)

    group_label = _joined_colocation(graph, members)
    ids, op, layer, coloc, kinds = [], [], [], [], []
    taken = set(graph.ids)
    for g, mem in enumerate(members):
        head = graph.ids[mem[0]]
        if mem.size == 1:
            ids.append(head)
        else:
            name = f"{head}+{mem.size - 1}"
            while name in taken:
                name += "'"
            taken.add(name)
            ids.append(name)
        ops = {graph.op[i] for i in mem.tolist()}
        op.append(ops.pop() if len(ops) == 1 else "coarse")
        layers = [graph.layer[i] for i in mem.tolist() if graph.layer[i] is not None]
        layer.append(layers[0] if layers else None)
        coloc.append(
            group_label.get(graph.colocation[mem[0]])
            if mem.size == 1
            else next((group_label[graph.colocation[i]] for i in mem.tolist() if graph.colocation[i] is not None), None)
        )
        allowed = None
        for i in mem.tolist():
            if graph.device_kinds[i] is not None:
                allowed = set(graph.device_kinds[i]) if allowed is None else allowed & set(graph.device_kinds[i])
        kinds.append(None if allowed is None else tuple(sorted(allowed)))

    cross = np.flatnonzero(group_of[graph.src] != group_of[graph.dst])
    gs, gd = group_of[graph.src[cross]], group_of[graph.dst[cross]]
    keys = np.stack([gs, graph.src[cross], graph.edge_tensor[cross], gd])
    if cross.size:
        uniq, inverse = np.unique(keys, axis=1, return_inverse=True)
        nbytes = np.zeros(uniq.shape[1], dtype=np.int64)
        np.maximum.at(nbytes, inverse.reshape(-1), graph.edge_bytes[cross])
        # The coarse tensor number: rank of (producer, tensor) among its group's outputs.
        outputs, tensor = np.unique(uniq[:3], axis=1, return_inverse=True)
        tensor = tensor.reshape(-1)
        group_start = np.searchsorted(outputs[0], outputs[0], side="left")
        tensor = tensor - group_start[tensor]
        src_g, dst_g = uniq[0], uniq[3]
    else:
        nbytes = tensor = src_g = dst_g = np.zeros(0, dtype=np.int64)
    coarse = OpGraph(
        ids,
        compute,
        src_g,
        dst_g,
        nbytes,
        tensor,
        output_bytes=sums["output_bytes"],
        param_bytes=sums["param_bytes"],
        temp_bytes=temp,
        flops=flops,
        op=op,
        layer=layer,
        colocation=coloc,
        device_kinds=kinds,
        compute_s_by_kind=by_kind,
        node_extra=[{"members": int(m.size)} for m in members],
        name=f"{graph.name}-coarse{n_groups}",
    )
    return coarse, members


def _joined_colocation(graph: OpGraph, members: list[np.ndarray]) -> dict[str, str]:
    """Colocation label -> label of its joined group: groups sharing a coarse node become one.

    The joined group is named by its members' labels, sorted and joined by ``|`` (with ``~1``, ... where
    the graph has a label of that name already).
    """
    parent = {c: c for c in graph.colocation if c is not None}

    def find(c: str) -> str:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for mem in members:
        labels = [graph.colocation[i] for i in mem.tolist() if graph.colocation[i] is not None]
        for other in labels[1:]:
            a, b = find(labels[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    component: dict[str, list[str]] = {}
    for c in parent:
        component.setdefault(find(c), []).append(c)
    taken = set(parent)  # a joined name must not be a label of the graph already (a group "a|b" of its own)
    joined = {root: fresh_id("|".join(sorted(labels)), taken) for root, labels in component.items() if len(labels) > 1}
    return {c: joined.get(find(c), c) for c in parent}


def summed_times_by_kind(graph: OpGraph, members: list[np.ndarray], cluster: Cluster | None) -> list[dict | None]:
    """Per coarse node (its ``members``), the summed time per device kind where a sum of ``compute_s`` would
    be wrong: exact for every kind whose devices share one speed (those of one kind at other speeds keep
    ``compute_s / speed``, which a kind's entry would override).

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b"], [2.0, 4.0], [0], [1], [8], compute_s_by_kind=[{"V100": 1.0}, None])
    >>> summed_times_by_kind(g, [np.array([0, 1])], PRESETS["2xV100-nvlink"]())
    [{'V100': 5.0}]
    """
    measured = {k for d in graph.compute_s_by_kind if d for k in d}
    if not measured:
        return [None] * len(members)
    if cluster is not None:
        speeds: dict[str, set[float]] = {}
        for d in cluster.devices:
            speeds.setdefault(d.kind, set()).add(d.speed)
        exact = {k: s.pop() for k, s in speeds.items() if len(s) == 1 and k in measured}
    else:
        exact = {}
    out: list[dict | None] = []
    for mem in members:
        entries = [graph.compute_s_by_kind[i] or {} for i in mem.tolist()]
        times = {}
        for kind in sorted(measured):
            if kind in exact:
                times[kind] = float(
                    sum(e.get(kind, graph.compute_s[i] / exact[kind]) for e, i in zip(entries, mem.tolist()))
                )
            elif all(kind in e for e in entries):
                times[kind] = float(sum(e[kind] for e in entries))
        out.append(times or None)
    return out


def coarsen(
    graph: OpGraph,
    target: int,
    *,
    labels: np.ndarray | None = None,
    cluster: Cluster | None = None,
    max_rounds: int = 64,
) -> Coarsening:
    """Merge matched edges in batches until at most ``target`` nodes remain or nothing can merge.

    Each round computes heights on the current coarse graph, picks an acyclic
    matching heaviest edges first (:func:`acyclic_matching`) and contracts it.
    To keep parallelism, a merged node may hold at most twice the average
    compute time of a node of the target graph; the cap doubles whenever a
    round merges fewer than ``STALL_FRACTION`` of the nodes, and coarsening
    ends when even an unlimited cap makes no such progress. The last round
    merges only as many pairs as needed.

    Parameters
    ----------
    graph : OpGraph
    target : int
        Desired number of coarse nodes (>= 1).
    labels : array of int, optional
        Only nodes with equal labels share a coarse node.
    cluster : Cluster, optional
        Passed to :func:`contract` for exact per-kind times.
    max_rounds : int

    Returns
    -------
    Coarsening

    Raises
    ------
    OptionError
        If ``target`` is not a positive integer.
    GraphCycleError
        Never for a valid graph; raised if the coarse graph has a cycle.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=4, branches=2)
    >>> c = coarsen(g, 12)
    >>> c.graph.num_nodes <= 12, sorted(np.concatenate(c.members).tolist()) == list(range(g.num_nodes))
    (True, True)

    References
    ----------
    Hafeez, Sun, Gandhi and Liu, "Towards Optimal Placement and Scheduling of
    DNN Operations with Pesto", Middleware 2021, Section 3.3 (Definition 3.4,
    Theorem 3.5, Corollary 3.6).
    """
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or target < 1:
        raise OptionError(f"coarsening target must be a positive integer, got {target!r}")
    n = graph.num_nodes
    group_of = np.arange(n)
    current = graph
    current_labels = None if labels is None else np.asarray(labels)
    total = float(graph.compute_s.sum())
    cap = max(float(graph.compute_s.max(initial=0.0)), 2.0 * total / target)
    rounds = 0
    while current.num_nodes > target and rounds < max_rounds:
        rounds += 1
        pairs = acyclic_matching(
            current, labels=current_labels, size=current.compute_s, size_cap=cap, max_pairs=current.num_nodes - target
        )
        if len(pairs) < STALL_FRACTION * current.num_nodes:  # (nearly) stuck: allow bigger nodes
            if cap >= total:
                break
            cap *= 2.0
            if not pairs:
                continue
        merged = _groups_from_pairs(current.num_nodes, pairs)
        coarse, members = contract(current, merged, cluster=cluster)
        step = np.empty(current.num_nodes, dtype=np.int64)
        for g, mem in enumerate(members):
            step[mem] = g
        group_of = step[group_of]
        if current_labels is not None:
            current_labels = np.array([current_labels[m[0]] for m in members])
        current = coarse
    try:
        final, members = contract(graph, group_of, cluster=cluster)
    except GraphCycleError as exc:  # Theorem 3.5 forbids it; say so if it ever happens
        raise GraphCycleError(f"coarsening {graph.name!r} created a cycle: {exc}") from None
    coarse_of = np.empty(n, dtype=np.int64)
    for g, mem in enumerate(members):
        coarse_of[mem] = g
    return Coarsening(final, coarse_of, members, rounds)


#: What contracting groups of nodes into one ensures (:func:`contract`, and so :func:`coarsen`).
QUOTIENT_ENSURES = Ensures(
    compute=SUM,
    output_bytes=SUM,
    param_bytes=SUM,
    temp_bytes=MAX,
    transfers=CUT,
    note="Durations sum on the cluster given where each device kind's devices share one speed (a kind's "
    "summed entry stands for all its devices); without a cluster, per-kind times are kept only where every "
    "member has one. Colocation groups sharing a node join.",
)


def _topological_chunks(graph: OpGraph, size: int = 3) -> np.ndarray:
    """Groups of ``size`` consecutive nodes of a topological order: contracting them never makes a cycle."""
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    return position // size


def _check_labels(graph: OpGraph, values, option: str) -> np.ndarray:
    """``values`` as one integer per node, or OptionError naming ``option``."""
    labels = np.asarray(values)
    if labels.shape != (graph.num_nodes,) or (labels.size and labels.dtype.kind not in "iu"):
        raise OptionError(f"option {option} must hold one integer per node ({graph.num_nodes}), got {values!r:.80}")
    return labels


@register_transform(
    "coarsen",
    ensures=QUOTIENT_ENSURES,
    requires="A target of at least one node; labels, if given, one integer per node.",
    trials=lambda graph: [
        {"target": max(1, graph.num_nodes // 4)},
        {"target": max(1, graph.num_nodes // 4), "labels": np.arange(graph.num_nodes) % 2},
    ],
)
def coarsen_transform(
    graph: OpGraph, cluster: Cluster | None, *, target: int, labels: np.ndarray | None = None, max_rounds: int = 64
) -> TransformResult:
    """Pesto's acyclic coarsening (:func:`coarsen`): each coarse node stands for the nodes merged into it.

    Its laws are those of :func:`contract`, which builds the coarse graph.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=4, branches=2)
    >>> r = coarsen_transform(g, None, target=12)
    >>> r.graph.num_nodes <= 12, r.expand(np.arange(r.graph.num_nodes)).shape == (g.num_nodes,)
    (True, True)
    """
    if labels is not None:
        labels = _check_labels(graph, labels, "labels")
    if max_rounds < 0:
        raise OptionError(f"option max_rounds must be >= 0, got {max_rounds!r}")
    result = coarsen(graph, target, labels=labels, cluster=cluster, max_rounds=max_rounds)
    return TransformResult.quotient(graph, result.graph, result.group_of, result.members, result)


@register_transform(
    "contract",
    ensures=QUOTIENT_ENSURES,
    requires="groups: one integer label per node, whose contraction leaves the graph acyclic (consecutive "
    "pieces of a topological order always do); GraphCycleError otherwise.",
    trials=lambda graph: [{"groups": _topological_chunks(graph)}],
)
def contract_transform(graph: OpGraph, cluster: Cluster | None, *, groups: np.ndarray) -> TransformResult:
    """Every group of nodes contracted into one (:func:`contract`): a coarse node stands for its group.

    A coarse node runs its members one after another on one device, so for
    its members ``M``: ``time = sum(time[M])`` on every device (exact per
    kind, see :data:`QUOTIENT_ENSURES`), ``param_bytes`` and
    ``output_bytes`` are ``sum`` over ``M``, and ``temp_bytes`` is
    ``max`` over ``M`` (one member's workspace is live at a time). The
    reference model sends a producer's tensor once to each device that reads
    it, so one edge per (producer, tensor, consuming group), of its largest
    bytes, keeps every transfer between groups and adds none.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c", "d"], [1.0, 2.0, 3.0, 4.0], [0, 0, 1, 2], [1, 2, 3, 3], [8, 8, 4, 4],
    ...             temp_bytes=[5, 7, 1, 1])
    >>> r = contract_transform(g, None, groups=np.array([0, 0, 1, 1]))
    >>> r.graph.compute_s.tolist(), r.graph.temp_bytes.tolist(), r.graph.edge_bytes.tolist()
    ([3.0, 7.0], [7, 1], [8, 4])
    >>> [r.origin[k].tolist() for k in range(2)], r.image[2].tolist()
    ([[0, 1], [2, 3]], [1])
    """
    coarse, members = contract(graph, _check_labels(graph, groups, "groups"), cluster=cluster)
    group_of = np.empty(graph.num_nodes, dtype=np.int64)
    for g, mem in enumerate(members):
        group_of[mem] = g
    return TransformResult.quotient(graph, coarse, group_of, members)
