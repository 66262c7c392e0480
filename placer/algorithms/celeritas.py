"""Celeritas: place the fused graph in CPD-TOPO order, moving off the previous device only when it pays.

Both algorithms fuse the graph first (:func:`placer.transform.fusion.fuse`),
then walk the coarse graph in its own CPD-TOPO order, giving each cluster a
device and an insertion slot on that device's timeline:

- ``order_place`` (the paper's Order-Place baseline) keeps the previous
  cluster's device until its memory is used up, then moves to the next device;
- ``celeritas`` (Adjusting Placement, Algorithm 2) computes each cluster's
  earliest start on every device (with insertion into idle gaps) and leaves
  the previous cluster's device only when the gain exceeds the cost of
  sending the cluster's largest output back to it; it also places the same
  coarse graph by Order-Place and keeps the faster plan of the two.

A device without room for a cluster counts as never available; when no
device has room the one with the most room left takes it (best effort).
Colocation follows the paper's rule: the first cluster that places a member
of a group decides the group's device, its other members' memory is
reserved there, and a later cluster holding pinned members goes to that
device if it has room (members pinned elsewhere go to their own device).
Where some devices have no channel between them, a cluster goes only to a
device that channels link, each edge's way, to the devices of its
neighbours placed so far (a pinned member's is its group's); where none is
left, the schedule is refused naming a missing link. The per-device order
of the original nodes follows the coarse schedule.

Memory is budgeted with parameters whole and outputs by the share of them
live at the peak (:func:`memory_need`); the plan is then simulated, and where
a device's peak exceeds its estimate its nodes' estimates grow by that ratio
and the coarse graph is placed again. Where no schedule fits, the graph is
fused again into smaller clusters (:data:`SMALLER_CLUSTERS_BY`).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..feasibility import static_footprint
from ..graph import OpGraph
from ..io import shown_sizes
from ..plan import Plan
from ..sim.simulator import simulate
from ..transform.fusion import FusedGraph, cpd_topo_order, fuse, link_costs
from .common import incident_edges, linked_devices, liveness_ratio, missing_link
from .registry import register
from .timebox import optional_work

__all__ = ["order_place", "celeritas", "CoarseSchedule", "schedule_coarse", "memory_need", "POLICIES"]

POLICIES = ("order", "adjust")
HEADROOM = 0.97   # share of each device's memory budgeted: estimates of the peak are seldom exact
#: Where no schedule of the fused graph fits, it is fused again with clusters capped at this share of the
#: last cap, while the cap stays at least :data:`MIN_MEMORY_FRACTION` of a device: whole clusters of up to
#: a quarter of a device leave too coarse a split where the step hardly fits (NASNet over two V100s: no
#: fitting plan at 0.25, 701 ms at 0.0625, where m-ETF's step is 792 ms; docs/benchmarks.md, "Celeritas").
SMALLER_CLUSTERS_BY = 0.25
MIN_MEMORY_FRACTION = 1 / 64


@dataclass
class CoarseSchedule:
    """A schedule of the coarse graph and the placement of the original nodes it implies.

    Attributes
    ----------
    sequence : ndarray of int
        Clusters in the order they were placed (CPD-TOPO of the coarse graph).
    previous : ndarray of int
        Per step, the device of the cluster placed just before (``d_k`` of
        Algorithm 2; -1 at the first step).
    forced : ndarray of bool
        Per step, whether colocation dictated the device.
    device, start, finish : ndarray
        Per cluster.
    node_device : ndarray of int
        Per original node: its cluster's device, or its colocation group's.
    """

    sequence: np.ndarray
    previous: np.ndarray
    forced: np.ndarray
    device: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    node_device: np.ndarray

    @property
    def makespan_s(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0

    def device_orders(self, fused: FusedGraph, num_devices: int) -> list[np.ndarray]:
        """Per device, its original nodes by (cluster start, cluster step, CPD-TOPO position).

        One global order that respects every dependency, cut per device, so the orders never deadlock.
        """
        step = np.empty(self.sequence.size, dtype=np.int64)
        step[self.sequence] = np.arange(self.sequence.size)
        c = fused.cluster_of
        ranked = np.lexsort((fused.position, step[c], self.start[c]))
        return [ranked[self.node_device[ranked] == j] for j in range(num_devices)]


class _Timeline:
    """Busy intervals of one device, sorted; finds the earliest gap that holds a task."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest(self, ready: float, duration: float) -> float:
        t = ready
        for k in range(bisect_right(self.ends, ready), len(self.starts)):
            if t + duration <= self.starts[k]:
                return t
            t = max(t, self.ends[k])
        return t

    def add(self, start: float, finish: float) -> None:
        k = bisect_right(self.starts, start)
        while k > 0 and self.starts[k - 1] == start and self.ends[k - 1] > finish:
            k -= 1  # an empty task goes before a task starting at the same instant, so the ends stay sorted
        self.starts.insert(k, start)
        self.ends.insert(k, finish)


def schedule_coarse(fused: FusedGraph, cluster: Cluster, policy: str, need: np.ndarray,
                    capacity: np.ndarray) -> CoarseSchedule:
    """Place and time every cluster of ``fused`` by ``policy`` ("order" or "adjust").

    Parameters
    ----------
    fused : FusedGraph
    cluster : Cluster
    policy : str
        "order": Order-Place; "adjust": Adjusting Placement (Algorithm 2).
    need : ndarray
        Memory each original node takes from its device's budget.
    capacity : ndarray
        Memory budget per device.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    coarse = fused.coarse
    graph = fused.graph
    k_count, n_dev = coarse.num_nodes, cluster.num_devices
    duration = coarse.durations(cluster)
    latency = cluster.latency
    # Where no channel links two devices the latency is inf: an empty transfer there (inf x 0 bytes) is too.
    inverse = np.where(np.isinf(latency), 0.0, cluster.inverse_bandwidth)
    w, c = link_costs(coarse, cluster)
    sequence = cpd_topo_order(coarse, w, c)
    in_ptr, in_edges = coarse.in_edges
    pred_of, pred_bytes = coarse.src[in_edges], coarse.edge_bytes[in_edges].astype(np.float64)
    largest_out = np.zeros(k_count)
    np.maximum.at(largest_out, coarse.src, coarse.edge_bytes.astype(np.float64))
    has_succ = np.bincount(coarse.src, minlength=k_count) > 0

    group_names = sorted(graph.colocation_groups)
    group_of = np.full(graph.num_nodes, -1, dtype=np.int64)
    for g, key in enumerate(group_names):
        group_of[graph.colocation_groups[key]] = g
    group_members = [graph.colocation_groups[key] for key in group_names]
    linked = cluster.linked
    pin = np.full(len(group_names) + 1, -1, dtype=np.int64)   # the last entry stands for "no group"
    charged = np.zeros(graph.num_nodes, dtype=bool)
    used = np.zeros(n_dev)
    timelines = [_Timeline() for _ in range(n_dev)]
    device = np.full(k_count, -1, dtype=np.int64)
    start = np.zeros(k_count)
    finish = np.zeros(k_count)
    node_device = np.full(graph.num_nodes, -1, dtype=np.int64)
    previous = np.full(k_count, -1, dtype=np.int64)
    forced = np.zeros(k_count, dtype=bool)
    prev = -1

    for step, k in enumerate(sequence.tolist()):
        members = fused.members[k]
        groups = group_of[members]
        pinned_to = pin[groups]
        # What this cluster claims: its unpinned members, and the rest of the groups it will pin.
        new_groups = np.unique(groups[(groups >= 0) & (pinned_to < 0)]).tolist()
        decided = np.unique(np.concatenate([members[pinned_to < 0]] + [group_members[g] for g in new_groups]))
        claim = decided[~charged[decided]]
        amount = float(need[claim].sum())
        # The devices where what this step decides reaches, and is reached by, every neighbour placed so far
        # (a pinned member sits on its group's device, which need not be its cluster's).
        allowed = fused.allowed[k] & linked_devices(graph, linked, node_device, decided)
        if not allowed.any():
            raise InfeasibleError(missing_link(graph, cluster, node_device, decided, int(np.argmax(fused.allowed[k])))
                                  + " (nor is any other device the nodes' kinds and colocation groups allow "
                                    "linked to all their neighbours placed so far)")
        ps = slice(in_ptr[k], in_ptr[k + 1])
        preds = pred_of[ps]
        if preds.size:
            src_dev = device[preds]
            ready = (finish[preds][:, None] + latency[src_dev] + pred_bytes[ps][:, None] * inverse[src_dev]).max(axis=0)
            if not np.isfinite(ready[allowed]).all():
                # An input comes from a pinned member, on a device its cluster's has no channel from.
                ready = np.where(np.isfinite(ready), ready, _arrivals(graph, fused, node_device, finish, k,
                                                                        latency, inverse))
        else:
            ready = np.zeros(n_dev)
        choice = -1
        if (pinned_to >= 0).any():
            # The first-placed member of a group decided its device; most pinned members decide here,
            # if that device has room for the rest (else the rest is placed freely, the pinned members stay).
            votes = np.where(allowed & (used + amount <= capacity),
                             np.bincount(pinned_to[pinned_to >= 0], minlength=n_dev), 0)
            if votes.max() > 0:
                choice = int(np.argmax(votes))
                forced[step] = True
        est = np.full(n_dev, np.inf)
        for d in range(n_dev):
            if d == choice or (choice < 0 and allowed[d] and used[d] + amount <= capacity[d]):
                est[d] = timelines[d].earliest(float(ready[d]), float(duration[k, d]))
        if choice < 0:
            choice = _choose(policy, est + duration[k], prev, allowed, capacity - used,
                             latency, inverse, float(largest_out[k]) if has_succ[k] else None)
        previous[step] = prev
        device[k] = choice
        start[k] = est[choice] if np.isfinite(est[choice]) else \
            timelines[choice].earliest(float(ready[choice]), float(duration[k, choice]))
        finish[k] = start[k] + duration[k, choice]
        timelines[choice].add(float(start[k]), float(finish[k]))
        # Charge the claim; the groups it pinned now live on ``choice`` (their later members' memory is reserved).
        node_device[decided] = choice
        used[choice] += amount
        charged[claim] = True
        pin[new_groups] = choice
        prev = choice
    return CoarseSchedule(sequence, previous, forced, device, start, finish, node_device)


def _arrivals(graph: OpGraph, fused: FusedGraph, node_device: np.ndarray, finish: np.ndarray, k: int,
              latency: np.ndarray, inverse: np.ndarray) -> np.ndarray:
    """When the inputs of cluster ``k`` from other clusters could reach each device, by the devices their
    producers sit on (a pinned member's is its group's, not its cluster's); inf where no channel does."""
    _, edges = incident_edges(graph, fused.members[k])
    edges = edges[fused.cluster_of[graph.src[edges]] != k]
    src_dev = node_device[graph.src[edges]]
    sent = finish[fused.cluster_of[graph.src[edges]]][:, None]
    return (sent + latency[src_dev] + graph.edge_bytes[edges][:, None] * inverse[src_dev]).max(axis=0)


def _choose(policy: str, eft: np.ndarray, prev: int, allowed: np.ndarray, room: np.ndarray,
            latency: np.ndarray, inverse: np.ndarray, largest_out: float | None) -> int:
    """The device for one cluster, given its earliest finish per device (inf where it may not go).

    ``allowed``: the devices its kinds allow that channels link to its neighbours placed so far.
    """
    n_dev = eft.size
    open_ = np.flatnonzero(np.isfinite(eft))
    if open_.size == 0:  # nothing has room: best effort, the allowed device with the most room left
        return int(np.argmax(np.where(allowed, room, -np.inf)))
    if prev < 0:
        prev = int(open_[0])
    if policy == "order":
        # Stay on the previous device while it has room, else the next device (cyclically) that has.
        return next(d % n_dev for d in range(prev, prev + n_dev) if np.isfinite(eft[d % n_dev]))
    # Adjusting Placement: leave d_k for the earliest device only if the gain beats sending the output back.
    best = int(np.argmin(eft))
    back_cost = 0.0 if largest_out is None else latency[best, prev] + largest_out * inverse[best, prev]
    if not np.isfinite(eft[prev]) or eft[prev] - eft[best] > back_cost:
        return best     # (prev full, or not linked to this cluster's neighbours: no channel back costs inf too)
    return prev


def memory_need(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Bytes each node takes from its device's budget: its parameters, and a share of its output and workspace.

    Parameters stay for the whole step; outputs and workspaces count by the
    share of them that is live at the peak of a one-device run
    (:func:`liveness_ratio` counts everything by one share, which lets a device
    take more parameters than it holds).
    """
    params = graph.param_bytes.astype(np.float64)
    transient = (graph.output_bytes + graph.temp_bytes).astype(np.float64)
    peak = liveness_ratio(graph, cluster) * float(static_footprint(graph).sum())
    share = float(np.clip((peak - params.sum()) / max(transient.sum(), 1.0), 1e-3, 1.0))
    return params + share * transient


def _place(graph: OpGraph, cluster: Cluster, policies: tuple[str, ...], name: str, exploration_range: int,
           memory_fraction: float, time_limit: float | None) -> Plan:
    """Fuse, schedule the coarse graph by each policy (fused again into smaller clusters where no schedule
    fits), and map the fastest fitting schedule back.

    Raises
    ------
    InfeasibleError
        If no policy gives a schedule that fits (the first policy's diagnosis).
    """
    deadline = time.perf_counter() + (time_limit if time_limit is not None else np.inf)
    began, errors = time.perf_counter(), []
    fraction = memory_fraction
    fused = fuse(graph, cluster, exploration_range=exploration_range, memory_fraction=fraction)
    best = _fastest_fitting(graph, cluster, fused, policies, name, deadline, errors)
    took_s = time.perf_counter() - began
    while best is None and fraction * SMALLER_CLUSTERS_BY >= MIN_MEMORY_FRACTION:
        # Optional work: where the time limit cuts it short, the diagnosis at the fraction asked for stands.
        box = optional_work(took_s)
        if box is None or time.perf_counter() > deadline:
            break
        began = time.perf_counter()
        with box:
            smaller = fuse(graph, cluster, exploration_range=exploration_range,
                           memory_fraction=fraction * SMALLER_CLUSTERS_BY)
            found = _fastest_fitting(graph, cluster, smaller, policies, name, deadline, [])
        if box.expired:
            break
        fraction, fused, best, took_s = fraction * SMALLER_CLUSTERS_BY, smaller, found, time.perf_counter() - began
    if best is None:
        raise errors[0]     # the diagnosis at the memory fraction asked for
    _, schedule, order, rounds, policy = best
    # A graph without compute has an infinite CCR, which a plan file (JSON) cannot hold: None there.
    ccr_before, ccr_after = (x if np.isfinite(x) else None for x in (fused.ccr_before, fused.ccr_after))
    stats = {"clusters": fused.num_clusters, "ccr_before": ccr_before, "ccr_after": ccr_after,
             "coarse_makespan_s": schedule.makespan_s, "rounds": rounds, "policy": policy,
             "memory_fraction": fraction}
    return Plan.from_arrays(graph, cluster, schedule.node_device, order, algorithm=name, extra={"celeritas": stats})


def _fastest_fitting(graph: OpGraph, cluster: Cluster, fused: FusedGraph, policies: tuple[str, ...], name: str,
                     deadline: float, errors: list) -> tuple | None:
    """The fastest fitting schedule of ``fused`` by any of ``policies`` (:func:`_fitting_schedule`'s, with
    the policy), or None; each policy's InfeasibleError goes to ``errors``. No policy after the first
    starts once a plan is in hand and ``deadline`` has passed."""
    best = None
    for policy in policies:
        if best is not None and time.perf_counter() > deadline:
            break
        try:
            found = _fitting_schedule(graph, cluster, fused, policy, name, deadline)
        except InfeasibleError as exc:
            errors.append(exc)
            continue
        if best is None or found[0] < best[0]:
            best = (*found, policy)
    return best


def _fitting_schedule(graph: OpGraph, cluster: Cluster, fused: FusedGraph, policy: str, name: str,
                      deadline: float = np.inf,
                      tries: int = 8) -> tuple[float, CoarseSchedule, list[np.ndarray] | None, int]:
    """Schedule the coarse graph by ``policy`` until the reference model says the plan fits.

    Devices are budgeted with :func:`memory_need`. After a schedule that
    overflows, the nodes of every device whose simulated peak exceeds its
    estimate have their need raised by that ratio, so the next schedule
    budgets them as they really weigh.

    Returns
    -------
    (makespan, schedule, per-device order or None for the earliest-ready order, rounds)

    Raises
    ------
    InfeasibleError
        If no schedule within ``tries`` rounds (or before ``deadline``, a ``time.perf_counter`` instant) fits.
    """
    need = memory_need(graph, cluster)
    memory = cluster.memory.astype(np.float64)
    best = None
    for rounds in range(1, tries + 1):
        try:
            schedule = schedule_coarse(fused, cluster, policy, need, HEADROOM * memory)
        except InfeasibleError as exc:      # a dead end on devices not all linked
            raise InfeasibleError(f"{name}: {exc}") from None
        # The coarse schedule's order, or the reference model's earliest-ready order where that is faster.
        peaks = []
        for order in (schedule.device_orders(fused, cluster.num_devices), None):
            result = simulate(graph, cluster, schedule.node_device, order, check=False)
            if result.fits and (best is None or result.makespan_s < best[0]):
                best = (result.makespan_s, schedule, order, rounds)
            peaks.append(result.peak_memory_bytes.astype(np.float64))
        if best is not None:
            return best
        if time.perf_counter() > deadline:
            break
        estimate = np.bincount(schedule.node_device, weights=need, minlength=cluster.num_devices)
        need = need * np.maximum(1.0, 1.02 * np.maximum(*peaks) / np.maximum(estimate, 1.0))[schedule.node_device]
    peak = min(peaks, key=lambda p: float(np.max(p - memory)))
    j = int(np.argmax(peak - memory))
    needs, has = shown_sizes(peak[j], memory[j])
    raise InfeasibleError(f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}")


@register("order_place")
def order_place(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
                exploration_range: int = 200, memory_fraction: float = 0.25) -> Plan:
    """Celeritas's Order-Place baseline: the fused graph in CPD-TOPO order, filling one device after another.

    Each cluster of the fused graph stays on the previous cluster's device
    while that device's memory budget holds it, else goes to the next device
    with room (the sequential placement of Sections 4.2.1 and 5.2).

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        No new memory-budget round (or second policy) starts after this many seconds.
    exploration_range : int
        ``R``, the most nodes per cluster (Equation 6).
    memory_fraction : float
        ``M`` as a share of the smallest device memory; where no plan fits, smaller
        (:data:`SMALLER_CLUSTERS_BY`, down to :data:`MIN_MEMORY_FRACTION`).

    Returns
    -------
    Plan
        With a per-device order taken from the coarse schedule.

    Raises
    ------
    OptionError
        A bad ``exploration_range`` or ``memory_fraction``.
    InfeasibleError
        If no budget gives a plan that fits the devices' memory.

    Examples
    --------
    >>> from placer.algorithms import place
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = place(training_graph(layers=3), load_cluster("2xV100-nvlink"), "order_place")
    >>> plan.predicted["fits"]
    True

    References
    ----------
    Zhang et al., "Celeritas: Fast Optimizer for Large Dataflow Graphs", Section 5.2 (Order-Place, Table 3).
    """
    return _place(graph, cluster, ("order",), "order_place", exploration_range, memory_fraction, time_limit)


@register("celeritas")
def celeritas(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
              exploration_range: int = 200, memory_fraction: float = 0.25) -> Plan:
    """Celeritas: optimal operation fusion, then Adjusting Placement of the fused graph.

    Clusters are taken in the CPD-TOPO order of the fused graph. For each,
    the earliest start on every device with room is found (inputs from other
    devices arrive ``latency + bytes / bandwidth`` after their producer ends;
    the cluster may fill an idle gap). It stays on the previous cluster's
    device ``d_k`` unless the earliest device ``d_1`` satisfies
    ``EFT(d_k) - EFT(d_1) > back_cost``, the time to send its largest output
    back to ``d_k`` (Equations 7-9). Finish times are compared rather than
    the paper's start times so that devices of different speeds compare
    fairly; on identical devices the rule is the paper's.

    The rule is greedy, so its lemma (never later than Order-Place) holds
    only step by step; the same coarse graph is therefore also placed by
    Order-Place and the faster plan under the reference model is returned,
    which makes ``celeritas`` never slower than ``order_place``.

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        No new memory-budget round (or second policy) starts after this many seconds.
    exploration_range : int
        ``R``, the most nodes per cluster (Equation 6; the paper uses 200).
    memory_fraction : float
        ``M`` as a share of the smallest device memory (the paper uses 0.25); where no
        plan fits, smaller (:data:`SMALLER_CLUSTERS_BY`, down to :data:`MIN_MEMORY_FRACTION`).

    Returns
    -------
    Plan
        With a per-device order taken from the coarse schedule (or the
        reference model's earliest-ready order where that is faster), and
        ``extra["celeritas"]``: clusters, CCR before and after fusion (None without compute),
        ``policy``: "adjust" (Adjusting Placement won) or "order" (Order-Place did), and the
        ``memory_fraction`` its clusters were fused with.

    Raises
    ------
    OptionError
        A bad ``exploration_range`` or ``memory_fraction``.
    InfeasibleError
        If no budget gives a plan that fits the devices' memory.

    Examples
    --------
    >>> from placer.algorithms import place
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = place(training_graph(layers=3), load_cluster("2xV100-nvlink"), "celeritas")
    >>> plan.predicted["fits"]
    True

    References
    ----------
    Zhang et al., "Celeritas: Fast Optimizer for Large Dataflow Graphs", Section 5.2 and Algorithm 2.
    """
    return _place(graph, cluster, ("adjust", "order"), "celeritas", exploration_range, memory_fraction, time_limit)
