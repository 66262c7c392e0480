"""Baselines every paper compares against: one device, round-robin, the expert split, METIS.

All four honour device kinds and colocation by placing whole units
(:func:`placement_units`) on allowed devices, and memory by budgeting
devices and checking the result under the reference model.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptionError
from ..graph import OpGraph
from ..io import shown_sizes
from ..plan import Plan
from ..sim.simulator import simulate
from .common import MemoryBudget, fitting_plan_with_retries, linked_devices, missing_link, placement_units, unit_allowed
from .registry import register

__all__ = ["single", "round_robin", "expert", "metis", "layer_labels", "forward_ordered", "linked_parts"]

#: The most devices whose every relabelling of the parts :func:`linked_parts` tries (8! = 40,320).
MAX_RELABELLED_DEVICES = 8


@register("single")
def single(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None) -> Plan:
    """Everything on the fastest device that can hold the whole step.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (the result is deterministic and immediate)

    Returns
    -------
    Plan

    Raises
    ------
    InfeasibleError
        If no single device allows every node and fits the step's peak memory.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    >>> single(g, PRESETS["2xV100-nvlink"]()).placement
    {'a': 'gpu0', 'b': 'gpu0'}
    """
    allowed = graph.allowed(cluster).all(axis=0)
    total = graph.durations(cluster).sum(axis=0)
    reasons = []
    for j in np.argsort(total, kind="stable").tolist():
        name = cluster.devices[j].name
        if not allowed[j]:
            reasons.append(f"{name}: some nodes may not run on kind {cluster.devices[j].kind!r}")
            continue
        device_of = np.full(graph.num_nodes, j, dtype=np.int64)
        result = simulate(graph, cluster, device_of, check=False)
        if result.fits:
            return Plan.from_arrays(graph, cluster, device_of)
        needs, has = shown_sizes(result.peak_memory_bytes[j], cluster.devices[j].memory_bytes)
        reasons.append(f"{name}: needs {needs} of {has}")
    raise InfeasibleError("single: no one device can run the whole step (" + "; ".join(reasons[:4]) + ")")


@register("round_robin")
def round_robin(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None) -> Plan:
    """Units in topological order dealt to the devices in turn, skipping devices without room.

    Where some devices have no channel between them, a device is also skipped
    unless channels link it to the devices of the unit's neighbours placed so far.

    Raises
    ------
    InfeasibleError
        If some unit fits no allowed device's remaining budget, or none linked to its placed neighbours.
    """
    _, units = placement_units(graph)
    allowed = unit_allowed(graph, cluster, units)
    n_dev, linked = cluster.num_devices, cluster.linked

    def build(ratio: float) -> np.ndarray:
        budget = MemoryBudget(graph, cluster, ratio)
        device_of = np.full(graph.num_nodes, -1, dtype=np.int64)
        cursor = 0
        for u, members in enumerate(units):
            need = budget.unit_need(members)
            room = allowed[u] & np.array([budget.fits(j, need) for j in range(n_dev)])
            usable = room & linked_devices(graph, linked, device_of, members)
            for step in range(n_dev):
                j = (cursor + step) % n_dev
                if usable[j]:
                    break
            else:
                raise _unplaceable("round_robin", graph, cluster, device_of, members, room)
            budget.add(j, need)
            device_of[members] = j
            cursor = j + 1
        return device_of

    return Plan.from_arrays(graph, cluster, fitting_plan_with_retries(build, graph, cluster, "round_robin"))


def _unplaceable(
    name: str, graph: OpGraph, cluster: Cluster, device_of: np.ndarray, members: np.ndarray, room: np.ndarray
) -> InfeasibleError:
    """The error where a unit fits no device: the channel a device with ``room`` (allowed, budget left) lacks
    to its placed neighbours (:func:`missing_link`), else memory."""
    if room.any():
        return InfeasibleError(f"{name}: " + missing_link(graph, cluster, device_of, members, int(np.argmax(room))))
    return InfeasibleError(f"{name}: node {graph.ids[members[0]]!r} fits no allowed device's remaining memory")


def layer_labels(graph: OpGraph, min_layers: int = 1) -> np.ndarray:
    """A layer label per node: its ``layer``, else inherited from a parent, else from a child.

    Graphs without layer names get pseudo-layers: ``min_layers`` contiguous
    slices of the topological order.
    """
    n = graph.num_nodes
    names: dict[str, int] = {}
    label = np.array(
        [-1 if name is None else names.setdefault(name, len(names)) for name in graph.layer], dtype=np.int64
    )
    if not names:
        position = np.empty(n, dtype=np.int64)
        position[graph.topological_order] = np.arange(n)
        return position * max(min_layers, 1) // max(n, 1)
    ptr_in, e_in = graph.in_edges
    ptr_out, e_out = graph.out_edges
    for i in graph.topological_order.tolist():
        if label[i] < 0:
            parents = label[graph.src[e_in[ptr_in[i] : ptr_in[i + 1]]]]
            parents = parents[parents >= 0]
            if parents.size:
                label[i] = parents[0]
    for i in graph.topological_order[::-1].tolist():
        if label[i] < 0:
            children = label[graph.dst[e_out[ptr_out[i] : ptr_out[i + 1]]]]
            children = children[children >= 0]
            if children.size:
                label[i] = children[0]
    label[label < 0] = len(names)
    return label


def forward_ordered(graph: OpGraph, unit_of: np.ndarray, units: list[np.ndarray]) -> list[np.ndarray]:
    """``units`` in the order the data flows through them: for layers, forward order.

    A unit's place is the first time it reads another unit's output or another
    unit reads its own (just before that reader), in topological order.
    Numbering units by their first node (:func:`placement_units`) would not do:
    parameters, optimizer states, inputs and the updates that read only them
    (Adam's step count) are all sources, first in a topological order, so every
    unit that holds a parameter would come ahead of those that hold none, and a
    contiguous split of that order would not be contiguous in the graph. A unit
    of weights shared by many layers (a recurrent cell's) goes where its first
    reader is.
    """
    position = np.empty(graph.num_nodes, dtype=np.float64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    outside = unit_of[graph.src] != unit_of[graph.dst]
    reader = position[graph.dst[outside]]
    place = np.full(len(units), np.inf)
    np.minimum.at(place, unit_of[graph.dst[outside]], reader)
    np.minimum.at(place, unit_of[graph.src[outside]], reader - 0.5)
    alone = np.isinf(place)
    place[alone] = [position[units[u]].min() for u in np.flatnonzero(alone)]
    return [units[u] for u in np.argsort(place, kind="stable")]


@register("expert")
def expert(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None) -> Plan:
    """The human split: contiguous groups of layers per device, balanced by compute within memory.

    Layers (a node's ``layer``, shared by its forward and backward ops) are kept
    whole and in forward order; the sequence is cut into one contiguous chunk
    per device so that the slowest device's compute is as small as memory
    allows (binary search on that bottleneck with a greedy fill). This is the
    "expert" placement of Placeto, Pesto and Baechi.

    Raises
    ------
    InfeasibleError
        If no contiguous split fits the devices' memory.

    References
    ----------
    Addanki et al., Placeto (NeurIPS 2019), Section 5 "human experts";
    Kaufmann et al., Pesto (Middleware 2021), Section 5 baselines.
    """
    units = forward_ordered(graph, *placement_units(graph, layer_labels(graph, min_layers=4 * cluster.num_devices)))
    allowed = unit_allowed(graph, cluster, units)
    dur = graph.durations(cluster)
    unit_time = np.array([dur[u].sum(axis=0) for u in units]).reshape(len(units), cluster.num_devices)
    n_dev = cluster.num_devices

    def greedy(limit: float, budget: MemoryBudget | None) -> np.ndarray | None:
        """Fill devices in turn with consecutive units while time <= limit (and the budget holds them,
        unless None); None if units remain."""
        unit_device = np.zeros(len(units), dtype=np.int64)
        j, load = 0, 0.0
        for u, members in enumerate(units):
            need = 0 if budget is None else budget.unit_need(members)
            while j < n_dev and not (
                allowed[u, j]
                and (budget is None or budget.fits(j, need))
                and (load == 0.0 or load + unit_time[u, j] <= limit)
            ):
                j, load = j + 1, 0.0
            if j == n_dev:
                return None
            if budget is not None:
                budget.add(j, need)
            load += unit_time[u, j]
            unit_device[u] = j
        return unit_device

    def build(ratio: float) -> np.ndarray:
        best = greedy(np.inf, MemoryBudget(graph, cluster, ratio))
        if best is None:
            if greedy(np.inf, None) is None:
                raise InfeasibleError(
                    "expert: no contiguous split of the layers over the devices in the cluster's "
                    "order gives every node a device of its kinds"
                )
            raise InfeasibleError("expert: no contiguous split of the layers fits the devices' memory")
        lo, hi = float(unit_time.min(axis=1).max(initial=0.0)), float(unit_time.max(axis=1).sum())
        for _ in range(40):
            mid = (lo + hi) / 2
            trial = greedy(mid, MemoryBudget(graph, cluster, ratio))
            if trial is None:
                lo = mid
            else:
                best, hi = trial, mid
            if hi - lo <= 1e-9 * max(hi, 1e-12):
                break
        device_of = np.zeros(graph.num_nodes, dtype=np.int64)
        for u, members in enumerate(units):
            device_of[members] = best[u]
        return device_of

    return Plan.from_arrays(graph, cluster, fitting_plan_with_retries(build, graph, cluster, "expert"))


@register("metis")
def metis(
    graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None, imbalance: float = 0.05
) -> Plan:
    """k-way METIS partition minimising bytes cut, balancing compute, then repaired for kinds and memory.

    Units (colocation groups) become weighted vertices; edge weights are the
    bytes between units; target part weights follow device speeds. Units on a
    device their kinds forbid, beyond a device's memory budget, or (where some
    devices have no channel between them) not linked to the devices of the
    units kept before them, move to the allowed device linked to their placed
    neighbours with the most room.

    Parameters
    ----------
    imbalance : float
        Load imbalance METIS may accept (0.05 = 5%).

    References
    ----------
    Karypis and Kumar, "A fast and high quality multilevel scheme for
    partitioning irregular graphs", SIAM J. Sci. Comput. 1998.
    """
    import pymetis  # deferred: imports pymetis

    if not 0 <= imbalance <= 1:
        raise OptionError(f"option imbalance of 'metis' must be in [0, 1], got {imbalance!r}")
    unit_of, units = placement_units(graph)
    n_units, n_dev = len(units), cluster.num_devices
    allowed = unit_allowed(graph, cluster, units)
    compute = np.bincount(unit_of, weights=graph.compute_s, minlength=n_units)
    vweights = np.maximum(1, np.round(compute / max(compute.max(initial=0.0), 1e-30) * 1e6)).astype(np.int64)
    us, ud = unit_of[graph.src], unit_of[graph.dst]
    cut = us != ud
    a = np.minimum(us[cut], ud[cut])
    b = np.maximum(us[cut], ud[cut])
    pair_bytes: dict[tuple[int, int], int] = {}
    for x, y, w in zip(a.tolist(), b.tolist(), graph.edge_bytes[cut].tolist()):
        pair_bytes[(x, y)] = pair_bytes.get((x, y), 0) + w
    adjacency: list[list[int]] = [[] for _ in range(n_units)]
    weights: list[list[int]] = [[] for _ in range(n_units)]
    top = max(max(pair_bytes.values(), default=1), 1)  # edges of 0 bytes weigh the least, as others would
    for (x, y), w in sorted(pair_bytes.items()):
        scaled = max(1, int(round(w / top * 1e6)))
        adjacency[x].append(y)
        adjacency[y].append(x)
        weights[x].append(scaled)
        weights[y].append(scaled)
    xadj = np.cumsum([0] + [len(adj) for adj in adjacency]).tolist()
    adjncy = [v for adj in adjacency for v in adj]
    eweights = [w for ws in weights for w in ws]
    speeds = np.array([d.speed for d in cluster.devices])
    if n_dev == 1 or n_units <= 1:
        parts = np.zeros(n_units, dtype=np.int64)
    else:
        options = pymetis.Options(seed=seed, ufactor=int(round(imbalance * 1000)) or 1)
        _, membership = pymetis.part_graph(
            n_dev,
            pymetis.CSRAdjacency(xadj, adjncy),
            vweights=vweights.tolist(),
            eweights=eweights or None,
            tpwgts=(speeds / speeds.sum()).tolist(),
            options=options,
        )
        parts = np.asarray(membership, dtype=np.int64)
    linked = cluster.linked
    parts = linked_parts(parts, unit_of, graph, linked, speeds)

    def build(ratio: float) -> np.ndarray:
        budget = MemoryBudget(graph, cluster, ratio)
        device_of = np.full(graph.num_nodes, -1, dtype=np.int64)
        moved = []
        for u, members in enumerate(units):
            need = budget.unit_need(members)
            j = int(parts[u])
            if allowed[u, j] and budget.fits(j, need) and linked_devices(graph, linked, device_of, members)[j]:
                budget.add(j, need)
                device_of[members] = j
            else:
                moved.append(u)
        for u in moved:
            need = budget.unit_need(units[u])
            room = np.where(allowed[u], budget.capacity - budget.used - need, -np.inf)
            usable = np.where(linked_devices(graph, linked, device_of, units[u]), room, -np.inf)
            j = int(np.argmax(usable))
            if usable[j] < 0:
                raise _unplaceable("metis", graph, cluster, device_of, units[u], room >= 0)
            budget.add(j, need)
            device_of[units[u]] = j
        return device_of

    return Plan.from_arrays(graph, cluster, fitting_plan_with_retries(build, graph, cluster, "metis"))


def linked_parts(
    parts: np.ndarray, unit_of: np.ndarray, graph: OpGraph, linked: np.ndarray, speeds: np.ndarray
) -> np.ndarray:
    """``parts`` (a device per unit) relabelled so that the fewest bytes cross device pairs without a channel.

    A partitioner numbers its parts arbitrarily: on a line of devices, two parts that exchange data may
    land on its two ends. Every relabelling that keeps each part on a device of its speed (the part's target
    weight) is tried, the identity first, up to :data:`MAX_RELABELLED_DEVICES` devices; where every pair is
    linked, or more devices, ``parts`` comes back as it is.
    """
    n_dev = linked.shape[0]
    if linked.all() or n_dev > MAX_RELABELLED_DEVICES or graph.num_edges == 0:
        return parts
    node_part = parts[unit_of]
    crossing = np.zeros((n_dev, n_dev))
    # (a byte more per edge: an empty tensor needs a channel too)
    np.add.at(crossing, (node_part[graph.src], node_part[graph.dst]), graph.edge_bytes.astype(np.float64) + 1.0)
    perms = np.array(list(itertools.permutations(range(n_dev))), dtype=np.int64)
    perms = perms[(speeds[perms] == speeds).all(axis=1)]
    unlinked = ~linked[perms[:, :, None], perms[:, None, :]]
    best = perms[int(np.argmin((unlinked * crossing).sum(axis=(1, 2))))]
    return best[parts]
