"""FastT's list schedulers: DPOS (Algorithm 1) and OS-DPOS with operation splitting (Algorithm 2).

Yi et al., "Optimizing distributed training deployment in heterogeneous GPU
clusters" (FastT), CoNEXT 2020, Section 5.
"""

from __future__ import annotations

import time

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError
from ..graph import OpGraph
from ..plan import Plan
from ..sim.critical import critical_path_nodes
from ..sim.simulator import simulate
from ..transform.split import split_dims
from .data_parallel import data_parallel_schedule
from .list_scheduling.priorities import priority_order, scheduling_priorities
from .list_scheduling.retries import rank_ordered_with_memory_retries
from .list_scheduling.state import Schedule, ScheduleState
from .list_scheduling.to_plan import plan_from_schedule
from .registry import register
from .timebox import TimeBox

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
    ptr, eids = graph.out_edges
    # Python lists: a path through a 30k-node graph takes 10k steps, each over a few successors.
    ptr, successors, ranks = ptr.tolist(), graph.dst[eids].tolist(), rank.tolist()
    while ptr[node] < ptr[node + 1]:
        first, end = ptr[node], ptr[node + 1]
        node = successors[first] if end - first == 1 else max(successors[first:end], key=lambda u: (ranks[u], -u))
        path.append(node)
    return path


def _holds(state: ScheduleState, v: int, d: int, devices: list[int], cache: dict) -> bool:
    """Whether ``d`` is among ``devices``, a channel brings ``v``'s inputs there, and its budget holds ``v``
    with the input copies it would need there. The estimate is kept in ``cache``
    (:meth:`~placer.algorithms.list_scheduling.ScheduleState.cached_estimate`)."""
    if d not in devices:
        return False
    estimate = state.cached_estimate(v, d, cache)
    return estimate.start != float("inf") and state.holds(v, d, estimate)


def _critical_path_device(state: ScheduleState, remaining: list[int], candidates: list[int] | None = None) -> int:
    """The device (among ``candidates``, default all) on which the remaining critical-path nodes that fit run fastest.

    For every device, critical-path nodes are taken in path order while their
    units fit the device's remaining budget (FastT Sec. 5.1); the device with
    the smallest average time over those wins (ties: more nodes, then lower index).
    Returns -1 if no device can take any of them.
    """
    best, best_key = -1, None
    memory = state.memory
    for d in range(state.cluster.num_devices) if candidates is None else candidates:
        room = memory.capacity[d] - memory.used[d]
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


def dpos_schedule(
    graph: OpGraph,
    cluster: Cluster,
    ratio: float = 1.0,
    fixed: np.ndarray | None = None,
    capacity_scale: np.ndarray | None = None,
    earliest_first: bool = False,
    sends: dict | None = None,
) -> Schedule:
    """DPOS (FastT Algorithm 1) under a memory ratio.

    Priorities are upward ranks with each node's largest time over its
    devices and each edge's largest transfer time (line 3). Critical-path
    nodes go to the critical-path device (lines 5, 9-10), moving to another
    one when its memory is full; every other node goes where its
    insertion-based earliest finish time is smallest among the devices with
    room (lines 12-19). The per-device order is the start-time order (line 23).

    ``fixed`` (a device per node, -1 where free) is the strategy ``S`` that
    Algorithm 2 hands to DPOS: nodes with a device keep it where they may,
    and only the others are placed.

    ``earliest_first`` books nodes in order of their earliest start instead of
    by rank (:func:`~placer.algorithms.list_scheduling.earliest_start_priorities`),
    under memory pressure; the critical path stays the one the ranks give.
    """
    rank = scheduling_priorities(graph, cluster, "max")
    state = ScheduleState(graph, cluster, ratio, insertion=True, capacity_scale=capacity_scale, sends=sends)
    path = critical_path(graph, rank)
    on_path = np.zeros(graph.num_nodes, dtype=bool)
    on_path[path] = True
    position = {v: k for k, v in enumerate(path)}
    cp_device = _critical_path_device(state, path)
    keep = None if fixed is None else fixed.tolist()
    booking = scheduling_priorities(graph, cluster, "max", earliest_first)
    for v in priority_order(graph, booking, sources_first=bool(sends)).tolist():
        devices = state.devices_for(v)
        if keep is not None and keep[v] in devices:
            devices = [keep[v]]
        cache = None
        if on_path[v] and len(devices) > 1:
            cache = {}  # the estimates that pick the critical-path device, which best_device needs again
            if not _holds(state, v, cp_device, devices, cache):
                holding = [d for d in devices if _holds(state, v, d, devices, cache)]
                cp_device = _critical_path_device(state, path[position[v] :], holding)
            if cp_device in devices:
                devices = [cp_device]
        d, est = state.best_device(v, devices, cache=cache)
        state.commit(v, d, est)
    return state.schedule()


@register("dpos")
def dpos(
    graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None, refine: bool = True
) -> Plan:
    """FastT's DPOS: rank_u priorities, a critical-path device, insertion-based earliest finish elsewhere.

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
        Placement and the per-device execution order of the DPOS schedule.

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
    >>> plan = dpos(training_graph(layers=2), load_cluster("2xV100-nvlink"))
    >>> len(plan.placement)
    24

    References
    ----------
    Yi et al., FastT, CoNEXT 2020, Section 5.1, Algorithm 1 (DPOS).
    """
    return plan_from_schedule(graph, cluster, _dpos_with_retries(graph, cluster, None, "dpos", refine))


#: Seconds OS-DPOS searches for splits when no time limit is given.
DEFAULT_SEARCH_S = 30.0
#: Share of os_dpos's time limit for the search; the rest is for placer's check of the plan.
CHECK_SHARE = 0.9
#: Placer's check of a plan (binding its placement and order, then the reference simulation) takes about
#: three simulations of its graph: os_dpos keeps this many, timed on its data-parallel start, out of its
#: search, as a data-parallel graph (n times the model's) takes seconds to check where its limit may be 2 s.
CHECK_SIMULATIONS = 4


def _dpos_with_retries(
    graph: OpGraph, cluster: Cluster, fixed: np.ndarray | None, name: str, refine: bool = True
) -> Schedule:
    """DPOS's schedule that fits under the reference model, with its simulation (its memory retries)."""
    return rank_ordered_with_memory_retries(dpos_schedule, graph, cluster, name, refine, fixed=fixed)


def _dpos_fitting(graph: OpGraph, cluster: Cluster, fixed: np.ndarray | None = None) -> Schedule | None:
    """DPOS's schedule that fits under the reference model, with its simulation; None if it finds none."""
    try:
        return _dpos_with_retries(graph, cluster, fixed, "os_dpos")
    except InfeasibleError:
        return None


def _start(
    graph: OpGraph, cluster: Cluster, data_parallel_start: bool, deadline: float | None = None
) -> tuple[OpGraph, Schedule, float]:
    """Algorithm 2's input graph and strategy (line 3).

    A model that fits one device starts from a data-parallel graph (FastT
    Sec. 5.2), with data parallelism itself as the starting deployment or
    DPOS's schedule of that graph, whichever is faster. Two data-parallel
    graphs compete: gradients all-reduced and every replica updating every
    parameter (PyTorch DDP, :func:`~placer.algorithms.data_parallel.data_parallel`),
    and each parameter updated once, by the replica that owns its shard
    (:func:`~placer.algorithms.data_parallel.sharded_data_parallel`), as the
    parameter-server data parallelism of the paper's TensorFlow updates each
    variable once. DPOS's schedule of the model's own graph competes too, so
    that OS-DPOS never does worse than DPOS where it has the time. A model
    that does not fit starts from its own graph. Once a data-parallel start
    is in hand, DPOS on the model's graph and on the data-parallel graphs
    (n times the model's) stop at ``deadline`` (a :func:`time.perf_counter`
    time, if given) less the seconds to check a plan of that size, and the
    other starts compete without them.

    Returns the start's graph and schedule, and the seconds to keep for
    placer's check of a plan of a data-parallel graph (0 without one).
    """

    data_parallel: list[tuple[OpGraph, Schedule]] = []
    check_s = 0.0
    microbatched = int((graph.extra.get("microbatches") or {}).get("count", 1)) > 1  # replicas of it do not run
    for shard_optimizer in (
        (False, True) if data_parallel_start and cluster.num_devices > 1 and not microbatched else ()
    ):
        try:
            dp, device_of, orders = data_parallel_schedule(graph, cluster, shard_optimizer=shard_optimizer)
            began = time.perf_counter()
            result = simulate(dp.graph, cluster, device_of, orders, check=False)
        except (InfeasibleError, InvalidPlanError):  # no room for a replica, or no channel for its ring
            continue
        check_s = max(check_s, CHECK_SIMULATIONS * (time.perf_counter() - began))
        data_parallel.append((dp.graph, Schedule(device_of, orders, result.start, result.finish, simulated=result)))

    failures: list[InfeasibleError] = []

    def dpos_start(start_graph: OpGraph) -> Schedule | None:
        scheduled = None
        with TimeBox(None if deadline is None or not data_parallel else deadline - check_s - time.perf_counter()):
            try:
                scheduled = _dpos_with_retries(start_graph, cluster, None, "os_dpos")
            except InfeasibleError as exc:
                failures.append(exc)
        return scheduled

    own = dpos_start(graph)
    starts = ([] if own is None else [(graph, own)]) + data_parallel
    for dp_graph, _ in data_parallel:
        scheduled = dpos_start(dp_graph)
        if scheduled is not None:
            starts.append((dp_graph, scheduled))
    if not starts:
        raise failures[0]  # the model's own graph's: no data-parallel start either
    return (*min(starts, key=lambda start: start[1].simulated.makespan_s), check_s)


def _split_candidates(graph: OpGraph, sched: Schedule) -> list[int]:
    """Splittable nodes on the critical path of the simulated schedule, longest compute first (Alg. 2 lines 4-5)."""

    result = sched.simulated
    path = critical_path_nodes(result).tolist()
    duration = result.finish - result.start
    splittable = [v for v in path if split_dims(graph, v)]
    return sorted(splittable, key=lambda v: (-duration[v], v))


@register("os_dpos")
def os_dpos(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    max_parts: int = 0,
    data_parallel_start: bool = True,
) -> Plan:
    """FastT's OS-DPOS: DPOS, then split critical-path operations while the simulated step gets faster.

    Starting from DPOS's schedule (or data parallelism, when the model fits
    one device: see ``data_parallel_start``), the operations on the schedule's critical
    path are taken in decreasing compute time; each splittable one is tried
    split along each dimension it allows (its batch rows; its output channels,
    where a weight is sliced and the activation goes whole to every part, as
    at batch 1, where there are no rows to split) into n = 2 .. devices parts
    (:func:`~placer.transform.split.split_operation`), every trial
    scheduled by DPOS both afresh and keeping the current strategy for the
    nodes the split leaves alone; the fastest trial is kept if the reference
    simulation of the step gets faster, and the search stops at the first
    operation whose best split does not help (Algorithm 2).

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic, unless the time limit cuts the search short)
    time_limit : float, optional
        Seconds to search for splits (30 s when not given); the best plan so
        far is returned when it runs out. No trial split starts that the
        previous one says would not end within 90% of it (the rest is for
        placer's check of a plan on the split graph).
    max_parts : int
        Largest number of parts to try (0: the number of devices).
    data_parallel_start : bool
        When every replica fits one device, start from a data-parallel
        graph as the paper does (data parallelism or DPOS's schedule of it;
        gradients all-reduced with every replica updating every parameter,
        or each parameter updated once by the replica owning its shard),
        unless DPOS's schedule of the model's own graph is faster already;
        with false, always from the model's own graph.

    Returns
    -------
    Plan
        ``splits`` lists ``{"node", "dim", "parts"}`` in the order they were
        made (a node named in the graph it was split from, which may be the
        data-parallel graph or an earlier split's result), and
        ``rewritten_graph`` is the graph placed.

    Raises
    ------
    OptionError
        If ``max_parts`` is negative or 1.
    InfeasibleError
        If DPOS finds no schedule that fits memory.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["x", "conv"], [0.0, 8.0], [0], [1], [800], op=["placeholder", "aten.convolution"],
    ...             output_bytes=[800, 400], splittable=[None, [{"dim": "batch", "size": 8}]])
    >>> plan = os_dpos(g, load_cluster("2xV100-nvlink"), data_parallel_start=False)
    >>> plan.splits, plan.rewritten_graph.ids
    ([{'node': 'conv', 'dim': 'batch', 'parts': 2}], ['x', 'conv@split0', 'conv@part0', 'conv@part1'])

    At one sample, the convolution's 8 output channels split instead:

    >>> g = OpGraph(["x", "w", "conv"], [0.0, 0.0, 8.0], [0, 1], [2, 2], [100, 400],
    ...             op=["placeholder", "placeholder", "aten.convolution"], param_bytes=[0, 400, 0],
    ...             output_bytes=[100, 0, 400], splittable=[None, None, [{"dim": "batch", "size": 1},
    ...                                                                   {"dim": "channel", "size": 8}]])
    >>> os_dpos(g, load_cluster("2xV100-nvlink"), data_parallel_start=False).splits
    [{'node': 'conv', 'dim': 'channel', 'parts': 2}]

    References
    ----------
    Yi et al., FastT, CoNEXT 2020, Section 5.2, Algorithm 2 (OS-DPOS); the sharded
    start's update of each parameter once: Rajbhandari et al., ZeRO, SC 2020, Section 5.1.
    """
    from ..transform.split import split_dims, split_operation

    if max_parts < 0 or max_parts == 1:
        raise OptionError(f"option max_parts of 'os_dpos' must be 0 (the number of devices) or >= 2, got {max_parts!r}")
    deadline = time.perf_counter() + CHECK_SHARE * (DEFAULT_SEARCH_S if time_limit is None else time_limit)
    top_parts = max_parts or cluster.num_devices
    current, sched, check_s = _start(graph, cluster, data_parallel_start, deadline)
    deadline -= check_s
    splits: list[dict] = []
    trial_s = 0.0  # the longest trial so far: one more must fit before the deadline

    def out_of_time() -> bool:
        return time.perf_counter() + trial_s >= deadline

    for v in [current.ids[v] for v in _split_candidates(current, sched)]:
        if out_of_time():
            break
        x = current.index.get(v)
        if x is None:
            continue
        best: tuple[OpGraph, Schedule, dict] | None = None
        for dim, size in sorted(split_dims(current, x).items()):
            for parts in range(2, min(top_parts, size) + 1):
                if out_of_time():
                    break
                trial_began = time.perf_counter()
                # The first trial has no time of its own to go by: the deadline stops it.
                with TimeBox(deadline - trial_began):
                    trial = split_operation(current, v, dim, parts)
                    keep = np.array(
                        [sched.device_of[current.index[i]] if i in current.index else -1 for i in trial.ids]
                    )
                    for fixed in (None, keep):
                        candidate = _dpos_fitting(trial, cluster, fixed)
                        if candidate is not None and (
                            best is None or candidate.simulated.makespan_s < best[1].simulated.makespan_s
                        ):
                            best = (trial, candidate, {"node": v, "dim": dim, "parts": parts})
                trial_s = max(trial_s, time.perf_counter() - trial_began)
        if best is None or best[1].simulated.makespan_s >= sched.simulated.makespan_s:
            break
        current, sched = best[0], best[1]
        splits.append(best[2])
    placed = None if current is graph else current
    return Plan.from_arrays(graph, cluster, sched.device_of, sched.orders, placed_graph=placed, splits=splits)
