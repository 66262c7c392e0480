"""Reduce any graph to the few nodes a Placeto policy walks, and map a placement back.

A policy trained on graphs merged to ``target`` nodes must see graphs of
that size: a captured training step has thousands of operations, and
Merge-and-Colocate alone (Placeto, appendix A.6) stops far above the target
on them (it merges one node at a time into a neighbour and never joins two
colocation keys, and a step's variables are colocated with their updates at
the other end of the graph). :func:`reduce_graph` runs Merge-and-Colocate
(:func:`placer.transform.merge.merge_and_colocate`) and, where it stops
above the target (or on graphs of more than :data:`DIRECT_SLABS` times the
target, instead of it), cuts the graph into ``target`` slabs of consecutive
heights (:func:`placer.transform.coarsen.heights`) balanced by compute,
which always gets there: heights rise along every edge, so contracting the
slabs leaves a DAG (:func:`placer.transform.coarsen.contract`, the exact
quotient: summed times, the original transfers between slabs).

Colocation: where Merge-and-Colocate reaches the target, coarse nodes
holding one colocation group's members share a label and move together.
A slab cut instead ignores colocation in the coarse graph (a variable and
its update's write-back sit at both ends of a step: tying their slabs
would tie nearly every slab together) and keeps it on expansion: every
member of a colocation group takes the device of the group's first member
in topological order (for a variable, its own slab: the one that first
reads it). :attr:`Reduction.group_of` is that decision map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import OptionError
from ..graph import OpGraph
from ..transform.coarsen import contract, heights
from ..transform.merge import merge_and_colocate

__all__ = ["Reduction", "reduce_graph", "height_slabs"]

#: Above this many times the target, the slabs are cut from the graph itself: Merge-and-Colocate merges one
#: node at a time, each after a path search, which takes seconds on a step of 10k operations and stops far
#: above the target on captured steps all the same.
DIRECT_SLABS = 50


@dataclass
class Reduction:
    """A coarse graph of at most the target size, and the map from original to coarse nodes.

    Attributes
    ----------
    graph : OpGraph
        The coarse DAG.
    group_of : ndarray of int
        Coarse node that decides the device of every original node (for a slab cut, a colocated
        node's is its group's first member's).
    stages : tuple of str
        The stages that ran: ``"merge"``, then ``"slabs"`` where it stopped above the target;
        ``"slabs"`` alone on graphs of more than :data:`DIRECT_SLABS` times the target.
    """

    graph: OpGraph
    group_of: np.ndarray
    stages: tuple[str, ...]

    def members(self, group: int) -> np.ndarray:
        """Original node indices merged into coarse node ``group``."""
        return np.flatnonzero(self.group_of == group)

    def expand(self, coarse_device_of: np.ndarray) -> np.ndarray:
        """The device of every original node from a device per coarse node."""
        return np.asarray(coarse_device_of, dtype=np.int64)[self.group_of]


def height_slabs(graph: OpGraph, slabs: int) -> np.ndarray:
    """A slab label per node: ``slabs`` runs of consecutive heights, balanced by compute time.

    Labels rise along every edge (heights do), so contracting the slabs
    leaves a DAG. A source (a variable, an input) joins the first slab that
    reads it and a sink the last slab it waits for; labels still never fall
    along an edge.

    Parameters
    ----------
    graph : OpGraph
    slabs : int
        At least 1; at most this many distinct labels result.

    Returns
    -------
    ndarray of int

    Examples
    --------
    A chain of six nodes of equal time in three slabs:

    >>> g = OpGraph(list("abcdef"), [1.0] * 6, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [8] * 5)
    >>> height_slabs(g, 3).tolist()
    [0, 0, 1, 1, 2, 2]
    """
    n = graph.num_nodes
    h = heights(graph) - 1
    levels = int(h.max(initial=-1)) + 1
    work = np.bincount(h, weights=graph.compute_s, minlength=levels)
    if work.sum() <= 0:
        work = np.bincount(h, minlength=levels).astype(np.float64)
    before = np.cumsum(work) - work  # work of the lower levels
    level_slab = np.minimum((before / max(float(work.sum()), 1e-300) * slabs).astype(np.int64), slabs - 1)
    label = level_slab[h]
    indegree = np.bincount(graph.dst, minlength=n)
    outdegree = np.bincount(graph.src, minlength=n)
    sinks = (indegree > 0) & (outdegree == 0)
    last_pred = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_pred, graph.dst, label[graph.src])
    label[sinks] = last_pred[sinks]
    sources = (indegree == 0) & (outdegree > 0)
    first_succ = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_succ, graph.src, label[graph.dst])
    label[sources] = first_succ[sources]
    return label


def _first_member(graph: OpGraph) -> np.ndarray:
    """Per node, the first node of its colocation group in topological order (itself if none)."""
    anchor = np.arange(graph.num_nodes)
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    for members in graph.colocation_groups.values():
        anchor[members] = members[np.argmin(position[members])]
    return anchor


def reduce_graph(graph: OpGraph, target: int, *, cluster: Cluster | None = None) -> Reduction:
    """``graph`` reduced to at most ``target`` nodes (see the module's stages).

    Parameters
    ----------
    graph : OpGraph
    target : int
        At least 1.
    cluster : Cluster, optional
        For exact per-kind times of the coarse nodes (:func:`~placer.transform.coarsen.contract`).

    Returns
    -------
    Reduction
        Its graph has at most ``target`` nodes.

    Raises
    ------
    OptionError
        If ``target`` is not a positive integer.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=12, branches=3)
    >>> r = reduce_graph(g, 8)
    >>> r.graph.num_nodes <= 8, r.expand(np.arange(r.graph.num_nodes)).shape == (g.num_nodes,)
    (True, True)

    References
    ----------
    Addanki et al., Placeto (NeurIPS 2019), appendix A.6; Hafeez et al., Pesto (Middleware 2021), Section 3.3
    (heights).
    """
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or target < 1:
        raise OptionError(f"option target_nodes must be an integer >= 1, got {target!r}")
    if graph.num_nodes <= DIRECT_SLABS * target:
        merged = merge_and_colocate(graph, target_nodes=int(target))
        if merged.graph.num_nodes <= target:
            return Reduction(merged.graph, merged.group_of, ("merge",))
        slab, stages = height_slabs(merged.graph, int(target))[merged.group_of], ("merge", "slabs")
    else:
        slab, stages = height_slabs(graph, int(target)), ("slabs",)
    free = graph.replace(colocation=None) if graph.colocation_groups else graph
    coarse, members = contract(free, slab, cluster=cluster)
    structural = np.empty(graph.num_nodes, dtype=np.int64)
    for g, mem in enumerate(members):
        structural[mem] = g
    return Reduction(coarse, structural[_first_member(graph)], stages)
