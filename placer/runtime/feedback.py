"""FastT's measurement feedback: measured per-node times become the graph's costs.

FastT (Yi et al., "Optimizing distributed training deployment in heterogeneous
GPU clusters", CoNEXT 2020, Section 4) profiles the running placement and
feeds the measured operation times back into its cost model before it
replans; a new placement is kept only when its measured iteration is faster.
Here a node's measured seconds on a device become its ``compute_s_by_kind``
for that device's kind (the reference model prefers them over the analytic
``compute_s / speed``), through :func:`placer.cost.profile.apply_profile`.
"""

from __future__ import annotations

from ..cluster import Cluster
from ..cost.profile import Profile, apply_profile
from ..graph import OpGraph
from ..plan import BoundPlan

__all__ = ["measured_graph"]


def measured_graph(graph: OpGraph, bound: BoundPlan, cluster: Cluster, op_s: dict[str, float]) -> OpGraph:
    """``graph`` with each measured node's seconds as its time on the kind of device it ran on.

    Parameters
    ----------
    graph : OpGraph
    bound : BoundPlan
        The plan that was measured (where each node ran).
    cluster : Cluster
    op_s : dict of str to float
        Graph node id -> measured seconds.

    Returns
    -------
    OpGraph
        Same ids and edges (plans for ``graph`` stay valid for it).
    """
    by_kind: dict[str, dict[str, float]] = {}
    for node_id, seconds in op_s.items():
        i = graph.index.get(node_id)
        if i is not None:
            kind = cluster.devices[bound.device_of[i]].kind
            by_kind.setdefault(kind, {})[node_id] = float(seconds)
    for kind, seconds in by_kind.items():
        graph = apply_profile(graph, Profile(graph.name, graph.digest(), kind, seconds))
    return graph
