"""Longest-path quantities over a weighted DAG, shared by bounds and list schedulers.

The top level of a node is the longest path from any source up to its start;
the bottom level is the longest path from its start to the end of any sink
(including its own weight), the "upward rank" of HEFT and DPOS.
"""

from __future__ import annotations

import numpy as np

from .graph import OpGraph

__all__ = ["top_levels", "bottom_levels", "critical_path_length"]


def _edge_weights(graph: OpGraph, edge_w: np.ndarray | None) -> list[float]:
    return [0.0] * graph.num_edges if edge_w is None else np.asarray(edge_w, dtype=np.float64).tolist()


def top_levels(graph: OpGraph, node_w: np.ndarray, edge_w: np.ndarray | None = None) -> np.ndarray:
    """Longest path to each node's start: ``max over parents (top[u] + w[u] + c[u,v])``.

    Parameters
    ----------
    graph : OpGraph
    node_w : array of float, one per node
    edge_w : array of float, one per edge, optional (0 when omitted)
    """
    w = np.asarray(node_w, dtype=np.float64).tolist()
    c = _edge_weights(graph, edge_w)
    ptr, eids = graph.out_edges
    ptr, eids = ptr.tolist(), eids.tolist()
    dst = graph.dst.tolist()
    top = [0.0] * graph.num_nodes
    for u in graph.topological_order.tolist():
        reach = top[u] + w[u]
        for k in range(ptr[u], ptr[u + 1]):
            e = eids[k]
            v = dst[e]
            if reach + c[e] > top[v]:
                top[v] = reach + c[e]
    return np.asarray(top)


def bottom_levels(graph: OpGraph, node_w: np.ndarray, edge_w: np.ndarray | None = None) -> np.ndarray:
    """Longest path from each node's start to the end of the step: ``w[u] + max over children (c[u,v] + bottom[v])``."""
    w = np.asarray(node_w, dtype=np.float64).tolist()
    c = _edge_weights(graph, edge_w)
    ptr, eids = graph.out_edges
    ptr, eids = ptr.tolist(), eids.tolist()
    dst = graph.dst.tolist()
    bottom = [0.0] * graph.num_nodes
    for u in reversed(graph.topological_order.tolist()):
        best = 0.0
        for k in range(ptr[u], ptr[u + 1]):
            e = eids[k]
            cand = c[e] + bottom[dst[e]]
            if cand > best:
                best = cand
        bottom[u] = w[u] + best
    return np.asarray(bottom)


def critical_path_length(graph: OpGraph, node_w: np.ndarray, edge_w: np.ndarray | None = None) -> float:
    """Length of the longest path through the DAG."""
    if graph.num_nodes == 0:
        return 0.0
    return float(bottom_levels(graph, node_w, edge_w).max())
