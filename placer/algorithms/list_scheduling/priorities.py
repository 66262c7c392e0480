"""The priorities list schedulers book nodes by: upward ranks (HEFT, DPOS) and earliest starts.

``rank_u(i) = w_i + max over successors j (c_ij + rank_u(j))`` (Topcuoglu et
al. 2002, eq. 6; FastT Sec. 5.1), where ``w_i`` is the node's time and
``c_ij`` the edge's transfer time, each the mean (HEFT) or the max (DPOS)
over the devices and the linked device pairs. Booking nodes by decreasing
rank, ties in topological order, is always a topological order
(:func:`priority_order`).
"""

from __future__ import annotations

import weakref

import numpy as np

from ...cluster import Cluster
from ...graph import OpGraph
from ...paths import bottom_levels, top_levels

__all__ = [
    "edge_transfer_times",
    "upward_ranks",
    "earliest_start_priorities",
    "priority_order",
    "scheduling_priorities",
]


def edge_transfer_times(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """Per edge, the uncongested transfer time reduced over the ordered device pairs that have a channel.

    ``reduce`` is ``"max"`` (DPOS's c_ij) or ``"mean"`` (HEFT's average
    ``c̄_ij = L̄ + data_ij / B̄``, Topcuoglu et al. 2002, Sec. 3: the mean
    latency plus the bytes over the mean bandwidth of those pairs, not the
    mean of their transfer times, which a slow pair would raise more). Zero
    for a one-device cluster.
    """
    n_dev = cluster.num_devices
    pairs = (cluster.channel_index >= 0) & ~np.eye(n_dev, dtype=bool)
    if not pairs.any() or graph.num_edges == 0:
        return np.zeros(graph.num_edges)
    lat = cluster.latency[pairs]
    inv_bw = cluster.inverse_bandwidth[pairs]
    if reduce == "mean":
        return lat.mean() + graph.edge_bytes / (1.0 / inv_bw).mean()
    # The slowest pair for a given size: latency and bandwidth may come from different pairs.
    times = lat[None, :] + graph.edge_bytes[:, None].astype(np.float64) * inv_bw[None, :]
    return times.max(axis=1)


def upward_ranks(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """``rank_u(i) = w_i + max over successors (c_ij + rank_u(j))`` (HEFT eq. 6, FastT Sec. 5.1).

    ``w_i`` and ``c_ij`` are the mean (HEFT) or the max (DPOS) of the node's
    time over the devices it may use and of the edge's transfer time over the
    device pairs.
    """
    return bottom_levels(graph, *_node_and_edge_costs(graph, cluster, reduce))


def earliest_start_priorities(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """Minus each node's top level (its earliest start, the costs of :func:`upward_ranks`).

    By :func:`priority_order`, nodes then go in order of their earliest start:
    for rank-ordered schedulers under memory pressure. Ranked by upward rank,
    each gradient's optimizer update comes last of all (its path to the end
    is short), and under the reference model the whole output of the
    backward operation that made the gradient, its input gradient too, is
    held until then; by earliest start each update follows its gradient.
    """
    return -top_levels(graph, *_node_and_edge_costs(graph, cluster, reduce))


def _node_and_edge_costs(graph: OpGraph, cluster: Cluster, reduce: str) -> tuple[np.ndarray, np.ndarray]:
    """``w_i`` and ``c_ij`` of :func:`upward_ranks`."""
    dur = graph.durations(cluster)
    allowed = graph.allowed(cluster)
    if reduce == "mean":
        w = np.where(allowed, dur, 0.0).sum(axis=1) / np.maximum(allowed.sum(axis=1), 1)
    else:
        w = np.where(allowed, dur, 0.0).max(axis=1, initial=0.0)
    return w, edge_transfer_times(graph, cluster, reduce)


def priority_order(graph: OpGraph, rank: np.ndarray, sources_first: bool = False) -> np.ndarray:
    """Nodes by decreasing rank, ties in topological order: always a topological order.

    A predecessor's upward rank is never below its successor's (nor is its
    :func:`earliest_start_priorities`), so sorting by decreasing rank with the
    topological position breaking ties respects every edge.

    ``sources_first`` puts the sources that take no time (parameters,
    optimizer states, inputs) first, in graph order, for a schedule built
    again told the transfers the last one sent (``sends``): such a source
    starts at 0 wherever it goes, and the reference model queues its
    transfers at 0, in graph order, ahead of everything produced later;
    booked first and in that order, they are booked where the channels'
    queues put them (bench/list_prediction.py). Not for a first schedule:
    where memory is tight, every parameter booked before any other node
    crowds the first devices.

    Examples
    --------
    >>> g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0, 0], [1, 2], [0, 0], [0, 1])
    >>> priority_order(g, np.array([3.0, 1.0, 2.0])).tolist()
    [0, 2, 1]
    """
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    if not sources_first:
        return np.lexsort((position, -rank))
    no_time = (graph.compute_s == 0) & np.array(
        [not (by_kind and any(by_kind.values())) for by_kind in graph.compute_s_by_kind], dtype=bool
    )
    sources = no_time & (np.bincount(graph.dst, minlength=graph.num_nodes) == 0)
    # Kahn's order (graph.topological_order) puts the sources first, in graph order.
    return np.lexsort((position, np.where(sources, 0.0, -rank), ~sources))


_PRIORITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scheduling_priorities(graph: OpGraph, cluster: Cluster, reduce: str, earliest_first: bool = False) -> np.ndarray:
    """:func:`upward_ranks`, or with ``earliest_first`` :func:`earliest_start_priorities`, computed once
    while ``graph`` and ``cluster`` live, like
    :func:`~placer.algorithms.list_scheduling.tables.schedule_tables` (read-only): the schedulers that book
    by rank need them for every schedule of the retries and the refinement."""
    known = _PRIORITIES.setdefault(graph, weakref.WeakKeyDictionary()).setdefault(cluster, {})
    priorities = known.get((reduce, earliest_first))
    if priorities is None:
        priorities = (earliest_start_priorities if earliest_first else upward_ranks)(graph, cluster, reduce)
        priorities.flags.writeable = False
        known[reduce, earliest_first] = priorities
    return priorities
