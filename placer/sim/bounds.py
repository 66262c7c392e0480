"""Lower bound on the makespan of any plan (FORMATS.md, "Lower bound")."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..paths import critical_path_length

__all__ = ["lower_bound", "fastest_durations"]


def fastest_durations(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Each node's time on its fastest allowed device (inf if no device allows it)."""
    dur = np.where(graph.allowed(cluster), graph.durations(cluster), np.inf)
    return dur.min(axis=1) if graph.num_nodes else np.zeros(0)


def lower_bound(graph: OpGraph, cluster: Cluster) -> float:
    """``max(longest path at fastest times with free transfers, total fastest time / devices)``.

    No plan can beat it: the critical path must run in sequence, and all work
    must be shared among the devices.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0], [1], [0])
    >>> lower_bound(g, PRESETS["2xV100-nvlink"]())
    2.0
    """
    fastest = fastest_durations(graph, cluster)
    if fastest.size == 0:
        return 0.0
    return max(critical_path_length(graph, fastest), float(fastest.sum()) / cluster.num_devices)
