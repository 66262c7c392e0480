"""Check a plan completely: FORMATS.md rule 8 by binding it, then memory by simulating it."""

from __future__ import annotations

import warnings

import numpy as np

from ..cluster import Cluster
from ..errors import ClusterMismatchWarning, InvalidPlanError
from ..graph import OpGraph
from ..io import shown_sizes
from ..plan import Plan
from ..transform.bind import bind_plan
from .simulator import SimResult, simulate_bound

__all__ = ["validate"]


def validate(plan: Plan, graph: OpGraph, cluster: Cluster) -> SimResult:
    """Check ``plan`` of ``graph`` on ``cluster`` (rule 8 and memory); return its reference simulation.

    A plan is valid when it binds (every node placed once on a device of a
    kind that can run it, colocation kept, each device's order consistent
    with the dependencies) and no device's simulated peak memory exceeds its
    capacity. A ``cluster`` with other figures than the one the plan was made
    for (by its digest; by name for a plan without one) is checked all the
    same, with a :class:`~placer.errors.ClusterMismatchWarning`: the plan's
    predicted figures were for the other.

    Parameters
    ----------
    plan : Plan
    graph : OpGraph
        The graph the plan was made for.
    cluster : Cluster

    Returns
    -------
    SimResult

    Raises
    ------
    InvalidPlanError
        If the plan does not bind (:func:`placer.transform.bind.bind_plan`) or
        a device's peak memory exceeds its capacity, naming the device.

    Examples
    --------
    >>> from placer import load_cluster, place
    >>> from placer.generate import training_graph
    >>> g, c = training_graph(layers=2), load_cluster("2xcpu")
    >>> validate(place(g, c, "single"), g, c).fits
    True
    """
    if plan.cluster_digest and plan.cluster_digest != cluster.digest():
        other = "with other figures than"
    elif not plan.cluster_digest and plan.cluster_name and plan.cluster_name != cluster.name:
        other = "not"
    else:
        other = ""
    if other:
        warnings.warn(
            f"plan validated on cluster {cluster.name!r}, {other} the cluster {plan.cluster_name!r} "
            f"it was made for (its predicted figures are that cluster's)",
            ClusterMismatchWarning,
            stacklevel=2,
        )
    result = simulate_bound(bind_plan(plan, graph, cluster))
    if not result.fits:
        j = int(np.argmax(result.peak_memory_bytes - result.memory_bytes))
        needs, has = shown_sizes(result.peak_memory_bytes[j], cluster.devices[j].memory_bytes)
        raise InvalidPlanError(f"device {cluster.devices[j].name!r} needs {needs} at peak but has {has}")
    return result
