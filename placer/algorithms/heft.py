"""HEFT: Heterogeneous Earliest Finish Time list scheduling (Topcuoglu, Hariri and Wu, 2002)."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..plan import Plan
from .list_scheduling.priorities import priority_order, scheduling_priorities
from .list_scheduling.retries import rank_ordered_with_memory_retries
from .list_scheduling.state import Schedule, ScheduleState
from .list_scheduling.to_plan import plan_from_schedule
from .registry import register

__all__ = ["heft", "heft_schedule"]


def heft_schedule(
    graph: OpGraph,
    cluster: Cluster,
    ratio: float = 1.0,
    *,
    contention: bool = True,
    capacity_scale: np.ndarray | None = None,
    earliest_first: bool = False,
    sends: dict | None = None,
) -> Schedule:
    """HEFT's schedule under a memory ratio (see :class:`ScheduleState`).

    Nodes go in decreasing upward rank computed with mean computation and mean
    communication costs; each takes the device where it finishes earliest,
    using idle gaps between booked operations (insertion policy).
    ``contention=False`` lets transfers overlap on a channel, as the paper's model does.
    ``earliest_first`` takes nodes in order of their earliest start instead
    (:func:`~placer.algorithms.list_scheduling.earliest_start_priorities`), under memory pressure.
    """
    rank = scheduling_priorities(graph, cluster, "mean", earliest_first)
    state = ScheduleState(
        graph, cluster, ratio, insertion=True, contention=contention, capacity_scale=capacity_scale, sends=sends
    )
    for v in priority_order(graph, rank, sources_first=bool(sends)).tolist():
        d, est = state.best_device(v)
        state.commit(v, d, est)
    return state.schedule()


@register("heft")
def heft(
    graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None, refine: bool = True
) -> Plan:
    """HEFT: upward-rank priorities, insertion-based earliest finish time on every device.

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        Held by :func:`~placer.algorithms.place`; the refinement takes a share of what is left.
    refine : bool
        Schedule again knowing the transfers the last schedule sent, keeping what shortens the step
        (:func:`~placer.algorithms.list_scheduling.refined_schedule`); False: the paper's one pass.

    Returns
    -------
    Plan
        Placement and the per-device order of HEFT's schedule.

    Raises
    ------
    InfeasibleError
        If some node fits no device's remaining memory, or the
        schedule does not fit under the reference model even with the most
        conservative budget.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = heft(training_graph(layers=2), load_cluster("2xV100-nvlink"))
    >>> sorted(plan.order)
    ['gpu0', 'gpu1']

    References
    ----------
    H. Topcuoglu, S. Hariri, M.-Y. Wu, "Performance-effective and low-complexity
    task scheduling for heterogeneous computing", IEEE TPDS 13(3), 2002,
    Section 4.1 (Fig. 3, the HEFT algorithm).
    """
    return plan_from_schedule(
        graph, cluster, rank_ordered_with_memory_retries(heft_schedule, graph, cluster, "heft", refine)
    )
