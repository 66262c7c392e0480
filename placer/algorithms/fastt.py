"""FastT's list schedulers: DPOS (Algorithm 1) and OS-DPOS with operation splitting (Algorithm 2).

Yi et al., "Optimizing distributed training deployment in heterogeneous GPU
clusters" (FastT), CoNEXT 2020, Section 5.
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptionError
from ..graph import OpGraph
from ..plan import Plan
from ..sim.simulator import simulate
from .list_scheduling import (Schedule, ScheduleState, plan_from_schedule, priority_order,
                              schedule_with_memory_retries, upward_ranks)
from .registry import register

__all__ = ["dpos", "os_dpos", "dpos_schedule", "critical_path"]


def critical_path(graph: OpGraph, rank: np.ndarray) -> list[int]:
    """FastT's critical path: the entry node of largest rank, then repeatedly the successor of largest rank.

    Ties go to the node listed first in the graph.
    """
    if graph.num_nodes == 0:
        return []
    sources = np.flatnonzero(np.bincount(graph.dst, minlength=graph.num_nodes) == 0)
    node = int(sources[np.argmax(rank[sources])])
    path = [node]
    while True:
        succ = np.unique(graph.successors(node))
        if succ.size == 0:
            return path
        node = int(succ[np.argmax(rank[succ])])
        path.append(node)


def _critical_path_device(state: ScheduleState, remaining: list[int]) -> int:
    """The device on which the remaining critical-path nodes that fit its memory run fastest on average.

    For every device, critical-path nodes are taken in path order while their
    units fit the device's remaining budget (FastT Sec. 5.1); the device with
    the smallest average time over those wins (ties: more nodes, then lower index).
    Returns -1 if no device can take any of them.
    """
    best, best_key = -1, None
    budget = state.budget
    for d in range(state.cluster.num_devices):
        room = budget.capacity[d] - budget.used[d]
        seen: set[int] = set()
        total, count = 0.0, 0
        for v in remaining:
            unit = state.unit_of[v]
            fixed = state.unit_device[unit]
            if fixed >= 0 and fixed != d or not state.unit_ok[unit][d]:
                continue
            if fixed < 0 and unit not in seen:
                if state.unit_need[unit] > room:
                    break
                room -= state.unit_need[unit]
                seen.add(unit)
            total += state.dur[v][d]
            count += 1
        if count == 0:
            continue
        key = (total / count, -count, d)
        if best_key is None or key < best_key:
            best, best_key = d, key
    return best


def dpos_schedule(graph: OpGraph, cluster: Cluster, ratio: float = 1.0) -> Schedule:
    """DPOS (FastT Algorithm 1) under a memory budget ratio.

    Priorities are upward ranks with each node's largest time over its
    devices and each edge's largest transfer time (line 3). Critical-path
    nodes go to the critical-path device (lines 5, 9-10), moving to another
    one when its memory is full; every other node goes where its
    insertion-based earliest finish time is smallest among the devices with
    room (lines 12-19). The per-device order is the start-time order (line 23).
    """
    rank = upward_ranks(graph, cluster, "max")
    state = ScheduleState(graph, cluster, ratio, insertion=True)
    path = critical_path(graph, rank)
    on_path = np.zeros(graph.num_nodes, dtype=bool)
    on_path[path] = True
    position = {v: k for k, v in enumerate(path)}
    cp_device = _critical_path_device(state, path)
    for v in priority_order(graph, rank).tolist():
        devices = state.devices_for(v)
        if on_path[v] and len(devices) > 1:
            if cp_device not in devices:
                cp_device = _critical_path_device(state, path[position[v]:])
            if cp_device in devices:
                devices = [cp_device]
        d, est = state.best_device(v, devices)
        state.commit(v, d, est)
    return state.schedule()


@register("dpos")
def dpos(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None) -> Plan:
    """FastT's DPOS: rank_u priorities, a critical-path device, insertion-based earliest finish elsewhere.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (DPOS is deterministic and runs in one pass)

    Returns
    -------
    Plan
        Placement and the per-device execution order of the DPOS schedule.

    Raises
    ------
    InfeasibleError
        If some node fits no device's remaining memory budget, or the
        schedule does not fit under the reference model even with the most
        conservative budget.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = dpos(training_graph(layers=2), load_cluster("2xV100-nvlink"))
    >>> len(plan.placement)
    24

    References
    ----------
    Yi et al., FastT, CoNEXT 2020, Section 5.1, Algorithm 1 (DPOS).
    """
    sched = schedule_with_memory_retries(lambda ratio: dpos_schedule(graph, cluster, ratio), graph, cluster, "dpos")
    return plan_from_schedule(graph, cluster, sched)
