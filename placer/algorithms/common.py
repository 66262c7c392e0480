"""Building blocks shared by placement algorithms: placement units and memory budgets.

A *unit* is a set of nodes that must share a device: a colocation group, or
a single node. Heuristics place units, so colocation holds by construction.
The placement-only baselines budget memory with each node's static footprint
scaled by how much of it the reference model finds live at the peak
(:func:`liveness_ratio`); the list schedulers follow each device's memory over
time instead (:class:`~placer.algorithms.list_scheduling.MemoryTimeline`). The
final plan is always checked by simulation.
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..feasibility import static_footprint
from ..graph import OpGraph, joined_groups
from ..io import shown_sizes
from ..sim.simulator import simulate

__all__ = [
    "placement_units",
    "liveness_ratio",
    "MemoryBudget",
    "unit_allowed",
    "fitting_plan_with_retries",
    "incident_edges",
    "linked_devices",
    "missing_link",
]


def placement_units(graph: OpGraph, extra_groups: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
    """Group nodes that must share a device.

    Parameters
    ----------
    graph : OpGraph
    extra_groups : array of int, optional
        A further grouping to merge with colocation (e.g. layers), one label per node.

    Returns
    -------
    unit_of : ndarray of int
        Unit index of every node; units are numbered by their first node in topological order.
    units : list of ndarray
        Node indices of each unit, in topological order.
    """
    n = graph.num_nodes
    roots = joined_groups(n, graph.colocation, *([] if extra_groups is None else [extra_groups.tolist()]))
    topo = graph.topological_order
    # Groups numbered by where their first node comes in topological order.
    groups, first_seen = np.unique(roots[topo], return_index=True)
    number = np.empty(groups.size, dtype=np.int64)
    number[np.argsort(first_seen)] = np.arange(groups.size)
    unit_of = number[np.searchsorted(groups, roots)]
    position = np.empty(n, dtype=np.int64)
    position[topo] = np.arange(n)
    members_sorted = np.lexsort((position, unit_of))
    bounds = [0, *(np.flatnonzero(np.diff(unit_of[members_sorted])) + 1).tolist(), n]
    units = [members_sorted[a:b] for a, b in zip(bounds[:-1], bounds[1:])] if n else []
    return unit_of, units


def unit_allowed(graph: OpGraph, cluster: Cluster, units: list[np.ndarray]) -> np.ndarray:
    """Boolean ``(units, devices)``: devices every node of the unit may use."""
    allowed = graph.allowed(cluster)
    if not units:
        return np.zeros((0, cluster.num_devices), dtype=bool)
    starts = np.cumsum([0] + [u.size for u in units[:-1]])
    return np.logical_and.reduceat(allowed[np.concatenate(units)], starts, axis=0)


def liveness_ratio(graph: OpGraph, cluster: Cluster) -> float:
    """Share of the summed static footprints that is live at the peak of a one-device run.

    Outputs die once consumed, so summing footprints overstates memory; the
    peak of the whole graph run sequentially on one device (capacity
    ignored) measures by how much.
    """
    total = float(static_footprint(graph).sum())
    if total <= 0:
        return 1.0
    peak = simulate(graph, cluster, np.zeros(graph.num_nodes, dtype=np.int64), check=False).peak_memory_bytes[0]
    return min(1.0, max(float(peak) / total, 1e-3))


class MemoryBudget:
    """Per-device memory budget in scaled static-footprint bytes."""

    def __init__(self, graph: OpGraph, cluster: Cluster, ratio: float):
        self.need = static_footprint(graph) * ratio
        self.capacity = cluster.memory.astype(np.float64)
        self.used = np.zeros(cluster.num_devices)

    def unit_need(self, members: np.ndarray) -> float:
        return float(self.need[members].sum())

    def fits(self, device: int, amount: float) -> bool:
        return self.used[device] + amount <= self.capacity[device]

    def add(self, device: int, amount: float) -> None:
        self.used[device] += amount


def fitting_plan_with_retries(build, graph: OpGraph, cluster: Cluster, name: str, tries: int = 6):
    """Call ``build(ratio)`` with growing memory ratios until its placement fits under the reference model.

    ``build`` returns a device index per node (or raises InfeasibleError when
    the budget cannot hold the graph). The ratio starts at the liveness ratio
    and grows towards 1, the fully conservative static budget.
    """
    ratio = liveness_ratio(graph, cluster)
    last_error = None
    for _ in range(tries):
        try:
            device_of = build(ratio)
        except InfeasibleError as exc:
            last_error = exc
            break
        result = simulate(graph, cluster, device_of, check=False)
        if result.fits:
            return device_of
        j = int(np.argmax(result.peak_memory_bytes - result.memory_bytes))
        needs, has = shown_sizes(result.peak_memory_bytes[j], cluster.devices[j].memory_bytes)
        last_error = InfeasibleError(f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}")
        if ratio >= 1.0:
            break
        ratio = min(1.0, ratio * 1.5)
    raise last_error


def incident_edges(graph: OpGraph, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges out of ``nodes`` and the edges into them (edge indices)."""
    found = []
    for ptr, ids in (graph.out_edges, graph.in_edges):
        found.append(np.concatenate([ids[ptr[v] : ptr[v + 1]] for v in nodes.tolist()] + [np.zeros(0, dtype=np.int64)]))
    return found[0], found[1]


def linked_devices(graph: OpGraph, linked: np.ndarray, node_device: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Boolean per device d: whether ``nodes`` all on d leave every edge between them and a node already
    given a device (``node_device >= 0``; -1 for the rest) within one device or over a channel.

    ``linked`` is :attr:`Cluster.linked`. Transfers never go through a third device, so on a cluster
    whose devices are not all linked a greedy placement checks each edge when its second end is placed.
    """
    if linked.all():
        return np.ones(linked.shape[0], dtype=bool)
    outs, ins = incident_edges(graph, nodes)
    to, by = node_device[graph.dst[outs]], node_device[graph.src[ins]]
    return linked[:, to[to >= 0]].all(axis=1) & linked[by[by >= 0]].all(axis=0)


def missing_link(graph: OpGraph, cluster: Cluster, node_device: np.ndarray, nodes: np.ndarray, device: int) -> str:
    """Why ``nodes`` may not go on ``device`` (:func:`linked_devices` says so): one edge and the channel it lacks."""
    names, linked = [d.name for d in cluster.devices], cluster.linked
    outs, ins = incident_edges(graph, nodes)
    for e in np.concatenate([outs, ins]).tolist():
        u, v = int(graph.src[e]), int(graph.dst[e])
        a, b = (node_device[u], device) if node_device[v] < 0 else (device, node_device[v])
        if min(a, b) >= 0 and not linked[a, b]:
            return (
                f"node {graph.ids[u]!r} would send from {names[a]!r} to node {graph.ids[v]!r} on {names[b]!r}, "
                f"but no channel connects these devices"
            )
    raise ValueError(f"every edge of these nodes is linked on device {names[device]!r}")
