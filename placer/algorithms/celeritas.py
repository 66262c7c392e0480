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

What the paper leaves open, ``celeritas`` decides so that work spreads
where spreading shortens the step:

- Inputs arrive as the reference model moves them (the paper's Section 6.1
  also models transfers as tasks, for congestion): a tensor crosses to a
  device once, however many clusters there read it, and a channel serves
  one transfer at a time in the order they were queued. Equation 7 alone
  charges a weight again for every cluster that reads it and lets any
  number of transfers share a link at full speed.
- The paper's ``R`` = 200 fuses a whole stretch of the depth-first order,
  parallel branches and layers together, so on a step that fits one device
  the coarse graph is nearly a chain that no rule should spread. Finer
  fusions are also tried (:func:`candidates`), some with every node that
  does no work (a parameter, a transposed weight) moved next to its first
  consumer (:func:`consumer_order`): laid out where they become ready, at
  the start of the step, they form clusters that go to the first device
  and draw every reader of those weights there. Some are timed by
  Equation 7 instead of the queues. The plan the reference model finds
  fastest is kept.
- The order each device runs its operations in (the paper leaves it to the
  framework's runtime): the coarse schedule's, the reference model's
  earliest-ready dispatch, or a list schedule of the placement that starts,
  on each idle device, the ready operation with the longest way to the end
  of the step (:func:`priority_orders`), whichever the reference model
  finds fastest. Where one device waits on another in turn, as the layers
  of a recurrent network do, running the next step's critical operation
  first lets the other device start sooner.
- What a cluster placed early cannot know: Adjusting Placement decides
  each cluster once, from those placed before it, and the depth-first
  order places a block's longest branch first, so the rule keeps the
  other branches on its device while their wait there is still short.
  With the fastest plan in hand, :func:`refine` moves the clusters that
  the simulated step's critical path waits on (the ends of a transfer on
  it, or a cluster working on it while another device idles), one at a
  time, where the reference model finds the step shorter and the plan
  still fitting (on graphs of up to :data:`FINER_UP_TO` operations).

A device without room for a cluster counts as never available; when no
device has room the one with the most room left takes it (best effort, the
paper's "lowest memory usage" on devices of equal memory).
Colocation follows the paper's rule: the first cluster that places a member
of a group decides the group's device, its other members' memory is
reserved there, and a later cluster holding pinned members goes to that
device if it has room (members pinned elsewhere go to their own device).
Where some devices have no channel between them, a cluster goes only to a
device that channels link, each edge's way, to the devices of its
neighbours placed so far (a pinned member's is its group's); where none is
left, the schedule is refused naming a missing link.

Memory is budgeted with parameters whole and outputs by the share of them
live at the peak (:func:`memory_need`); the plan is then simulated, and where
a device's peak exceeds its estimate its nodes' estimates grow by that ratio
and the coarse graph is placed again. Where no schedule fits, the graph is
fused again into smaller clusters (:data:`SMALLER_CLUSTERS_BY`).
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..feasibility import static_footprint
from ..graph import OpGraph
from ..io import shown_sizes
from ..plan import Plan
from ..sim.critical import CriticalLink, critical_path
from ..sim.simulator import SimResult, simulate
from ..transform.fusion import FusedGraph, cpd_topo_order, fuse, fuse_in_order, group_allowed, link_costs
from .common import incident_edges, linked_devices, liveness_ratio, missing_link
from .registry import register
from .timebox import is_frugal, optional_work

__all__ = [
    "order_place",
    "celeritas",
    "CoarseSchedule",
    "schedule_coarse",
    "memory_need",
    "POLICIES",
    "Candidate",
    "candidates",
    "consumer_order",
    "upward_ranks",
    "priority_orders",
    "Refined",
    "refine",
    "REFINE_MOVES",
    "REFINE_WORK",
]

POLICIES = ("order", "adjust")
HEADROOM = 0.97  # share of each device's memory budgeted: estimates of the peak are seldom exact
#: Where no schedule of the fused graph fits, it is fused again with clusters capped at this share of the
#: last cap, while the cap stays at least :data:`MIN_MEMORY_FRACTION` of a device: whole clusters of up to
#: a quarter of a device leave too coarse a split where the step hardly fits.
SMALLER_CLUSTERS_BY = 0.25
MIN_MEMORY_FRACTION = 1 / 64


class Finer(NamedTuple):
    """A finer fusion tried besides the paper's: ``R // share``, its layout, how inputs are timed
    (``timing`` of :class:`Candidate`) and whether transfers pushed back are charged."""

    share: int
    layout: str
    timing: str
    charge_pushes: bool


#: The finer fusions tried besides the paper's ``R`` (:func:`candidates`), all placed by Adjusting Placement.
FINER = (
    Finer(10, "cpd", "queued", True),
    Finer(10, "consumer", "queued", True),
    Finer(10, "cpd", "queued", False),
    Finer(10, "consumer", "queued", False),
    Finer(10, "consumer", "paper", True),
    Finer(25, "cpd", "queued", True),
    Finer(50, "cpd", "queued", True),
    Finer(50, "consumer", "queued", True),
)
#: The per-device orders a schedule is simulated with (:func:`_fitting_schedule`), as the plan's stats name them:
#: the coarse schedule's, the reference model's earliest-ready dispatch, :func:`priority_orders`'.
ORDERS = ("coarse", "ready", "priority")
#: The largest graph (in operations) for which finer fusions are tried: beyond, only the paper's ``R``,
#: since each finer fusion is placed in full, a cost the largest graphs cannot afford.
FINER_UP_TO = 25_000


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


class _Queue:
    """A channel of the reference model: one transfer at a time, in the order they were queued.

    Transfers are added in the order clusters are placed, not the order they
    are queued. One queued before transfers already here starts, as in the
    reference model, once every transfer queued before it has ended; the
    later ones keep their times here (the clusters that wait for them are
    placed), and :meth:`pushes` says where it would delay them.
    """

    def __init__(self) -> None:
        self.queued: list[float] = []
        self.ends: list[float] = []  # by queue instant

    def start(self, queued: float, extra: list[tuple[float, float]]) -> float:
        """When a transfer queued at ``queued`` starts; ``extra``: (queued, end) of transfers to be added
        with it."""
        k = bisect_right(self.queued, queued)
        return max([queued, max(self.ends[:k]) if k else queued] + [e for q, e in extra if q <= queued])

    def pushes(self, queued: float, start: float) -> bool:
        """Whether a transfer queued at ``queued`` and started at ``start`` delays one queued later."""
        k = bisect_right(self.queued, queued)
        return k < len(self.ends) and max(self.ends[k:]) > start

    def add(self, queued: float, end: float) -> None:
        k = bisect_right(self.queued, queued)
        self.queued.insert(k, queued)
        self.ends.insert(k, end)


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


def schedule_coarse(
    fused: FusedGraph,
    cluster: Cluster,
    policy: str,
    need: np.ndarray,
    capacity: np.ndarray,
    queued: bool = False,
    charge_pushes: bool = True,
) -> CoarseSchedule:
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
    queued : bool
        Time the inputs as the reference model moves them: a tensor crosses
        to a device once, and the tensors one cluster sends over a channel go
        as one transfer, queued when the cluster ends and served after every
        transfer queued on that channel before it. A device where the inputs
        would go ahead of transfers already placed (queued later, not yet
        over) counts as finishing later by their duration, the delay the
        reference model gives those (unless not ``charge_pushes``). Without,
        the paper's Equation 7: each coarse edge arrives ``latency + bytes /
        bandwidth`` after its source ends.
    charge_pushes : bool
        With ``queued``, whether that delay counts against a device: it
        assumes the delayed transfer's reader lies on the critical path, which
        is often so in a backward pass and often not between parallel
        branches.
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

    inputs = _cluster_inputs(fused)
    delivered: list[dict[int, float]] = [{} for _ in range(n_dev)]  # when each (producer, tensor) got there
    latency_l, inverse_l, channel_l = latency.tolist(), inverse.tolist(), cluster.channel_index.tolist()

    group_of, group_members = _colocation_index(graph)
    linked = cluster.linked
    pin = np.full(len(group_members) + 1, -1, dtype=np.int64)  # the last entry stands for "no group"
    charged = np.zeros(graph.num_nodes, dtype=bool)
    used = np.zeros(n_dev)
    timelines = [_Timeline() for _ in range(n_dev)]
    channel_lines = [_Queue() for _ in range(len(cluster.channels))]
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
            raise InfeasibleError(
                missing_link(graph, cluster, node_device, decided, int(np.argmax(fused.allowed[k])))
                + " (nor is any other device the nodes' kinds and colocation groups allow "
                "linked to all their neighbours placed so far)"
            )
        ps = slice(in_ptr[k], in_ptr[k + 1])
        preds = pred_of[ps]
        sends: list[list] = [[] for _ in range(n_dev)]
        pushed = np.zeros(n_dev)  # what going there would delay transfers already placed
        if preds.size:
            src_dev = device[preds]
            ready = (finish[preds][:, None] + latency[src_dev] + pred_bytes[ps][:, None] * inverse[src_dev]).max(axis=0)
            if not np.isfinite(ready[allowed]).all():
                # An input comes from a pinned member, on a device its cluster's has no channel from.
                ready = np.where(
                    np.isfinite(ready), ready, _arrivals(graph, fused, node_device, finish, k, latency, inverse)
                )
            if queued:
                xs = slice(inputs.ptr[k], inputs.ptr[k + 1])
                producer = inputs.producer[xs]
                sent = finish[fused.cluster_of[producer]]
                src = node_device[producer]
                rows = np.lexsort((src, sent))
                row_list = list(
                    zip(
                        src[rows].tolist(),
                        sent[rows].tolist(),
                        inputs.key[xs][rows].tolist(),
                        inputs.nbytes[xs][rows].tolist(),
                    )
                )
                for d in range(n_dev):
                    if allowed[d] and np.isfinite(ready[d]):
                        ready[d], sends[d], pushed[d] = _queued_arrival(
                            d, row_list, delivered[d], channel_l, channel_lines, latency_l, inverse_l
                        )
                if not charge_pushes:
                    pushed[:] = 0.0
        else:
            ready = np.zeros(n_dev)
        choice = -1
        if (pinned_to >= 0).any():
            # The first-placed member of a group decided its device; most pinned members decide here,
            # if that device has room for the rest (else the rest is placed freely, the pinned members stay).
            votes = np.where(
                allowed & (used + amount <= capacity), np.bincount(pinned_to[pinned_to >= 0], minlength=n_dev), 0
            )
            if votes.max() > 0:
                choice = int(np.argmax(votes))
                forced[step] = True
        est = np.full(n_dev, np.inf)
        for d in range(n_dev):
            if d == choice or (choice < 0 and allowed[d] and used[d] + amount <= capacity[d]):
                est[d] = timelines[d].earliest(float(ready[d]), float(duration[k, d]))
        if choice < 0:
            choice = _choose(
                policy,
                est + duration[k] + pushed,
                prev,
                allowed,
                capacity - used,
                latency,
                inverse,
                float(largest_out[k]) if has_succ[k] else None,
            )
        previous[step] = prev
        device[k] = choice
        start[k] = (
            est[choice]
            if np.isfinite(est[choice])
            else timelines[choice].earliest(float(ready[choice]), float(duration[k, choice]))
        )
        finish[k] = start[k] + duration[k, choice]
        timelines[choice].add(float(start[k]), float(finish[k]))
        for ch, queued_at, ends, keys in sends[choice]:
            channel_lines[ch].add(queued_at, ends)
            for key in keys:
                delivered[choice][key] = ends
        # Charge the claim; the groups it pinned now live on ``choice`` (their later members' memory is reserved).
        node_device[decided] = choice
        used[choice] += amount
        charged[claim] = True
        pin[new_groups] = choice
        prev = choice
    return CoarseSchedule(sequence, previous, forced, device, start, finish, node_device)


@dataclass
class _Inputs:
    """The tensors each cluster takes from other clusters: one row per (producer, tensor, consumer cluster),
    grouped by consumer cluster (rows ``ptr[k]:ptr[k + 1]``), with its largest edge's bytes; ``key`` numbers
    the distinct (producer, tensor) pairs, of which there are ``keys``."""

    ptr: np.ndarray
    producer: np.ndarray
    key: np.ndarray
    nbytes: np.ndarray
    keys: int


def _cluster_inputs(fused: FusedGraph) -> _Inputs:
    graph, cluster_of = fused.graph, fused.cluster_of
    cut = np.flatnonzero(cluster_of[graph.src] != cluster_of[graph.dst])
    s, t, d, b = graph.src[cut], graph.edge_tensor[cut], cluster_of[graph.dst[cut]], graph.edge_bytes[cut]
    by_key = np.lexsort((b, s, t, d))
    s, t, d, b = s[by_key], t[by_key], d[by_key], b[by_key]
    last = np.ones(s.size, dtype=bool)
    if s.size:
        last[:-1] = (s[1:] != s[:-1]) | (t[1:] != t[:-1]) | (d[1:] != d[:-1])
    s, t, d, b = s[last], t[last], d[last], b[last].astype(np.float64)
    pairs, key = np.unique(np.stack([s, t]), axis=1, return_inverse=True) if s.size else (np.zeros((2, 0)), s)
    ptr = np.zeros(fused.num_clusters + 1, dtype=np.int64)
    np.cumsum(np.bincount(d, minlength=fused.num_clusters), out=ptr[1:])
    return _Inputs(ptr, s, np.asarray(key, dtype=np.int64).reshape(-1), b, int(pairs.shape[1]))


def _queued_arrival(
    d: int,
    rows: list[tuple[int, float, int, float]],
    delivered: dict[int, float],
    channel_of: list[list[int]],
    channel_lines: list[_Queue],
    latency: list[list[float]],
    inverse: list[list[float]],
) -> tuple[float, list, float]:
    """When a cluster's inputs are all on device ``d``, the transfers that brings, and the delay they
    cause transfers already placed.

    ``rows``: (source device, instant its cluster ends, tensor key, bytes) per input tensor, by instant
    then device. As in the reference model, a tensor crosses to a device once (one already
    ``delivered`` there is not sent again), and a channel serves one transfer at a time in the order
    they were queued: the tensors one producing cluster sends are queued together when it ends, and
    start once every transfer queued before them has ended.

    Returns
    -------
    (ready, sends, pushed)
        ``sends``: (channel, queued, end, keys) per transfer. ``pushed``: the summed duration of
        those transfers that go before a transfer already placed, queued later and not yet over;
        the reference model delays that one (and its reader) by as much.
    """
    ready, sends, pushed = 0.0, [], 0.0
    extra: dict[int, list[tuple[float, float]]] = {}
    group: list | None = None  # [source device, instant, bytes, keys, tensors]
    finished: list[tuple[int, float, float, int]] = []  # (source device, instant, bytes, tensors) of each group

    for a, at, key, nbytes in rows:
        if a == d:
            ready = max(ready, at)
            continue
        got = delivered.get(key)
        if got is not None:
            ready = max(ready, got)
            continue
        if group is not None and group[0] == a and group[1] == at:
            group[2] += nbytes
            group[3].append(key)
            group[4] += 1
            continue
        if group is not None:
            finished.append(group)
        group = [a, at, nbytes, [key], 1]
    if group is not None:
        finished.append(group)
    for a, queued, nbytes, keys, tensors in finished:
        ch = channel_of[a][d]
        if ch < 0:  # a pinned producer on a device with no channel to d
            return float("inf"), [], 0.0
        duration = tensors * latency[a][d] + nbytes * inverse[a][d]
        mine = extra.setdefault(ch, [])
        t = channel_lines[ch].start(queued, mine)
        mine.append((queued, t + duration))
        sends.append((ch, queued, t + duration, keys))
        if channel_lines[ch].pushes(queued, t):
            pushed += duration
        ready = max(ready, t + duration)
    return ready, sends, pushed


def _arrivals(
    graph: OpGraph,
    fused: FusedGraph,
    node_device: np.ndarray,
    finish: np.ndarray,
    k: int,
    latency: np.ndarray,
    inverse: np.ndarray,
) -> np.ndarray:
    """When the inputs of cluster ``k`` from other clusters could reach each device, by the devices their
    producers sit on (a pinned member's is its group's, not its cluster's); inf where no channel does."""
    _, edges = incident_edges(graph, fused.members[k])
    edges = edges[fused.cluster_of[graph.src[edges]] != k]
    src_dev = node_device[graph.src[edges]]
    sent = finish[fused.cluster_of[graph.src[edges]]][:, None]
    return (sent + latency[src_dev] + graph.edge_bytes[edges][:, None] * inverse[src_dev]).max(axis=0)


def _choose(
    policy: str,
    eft: np.ndarray,
    prev: int,
    allowed: np.ndarray,
    room: np.ndarray,
    latency: np.ndarray,
    inverse: np.ndarray,
    largest_out: float | None,
) -> int:
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
        return best  # (prev full, or not linked to this cluster's neighbours: no channel back costs inf too)
    return prev


class _Sends(NamedTuple):
    """The transfers a placement makes under the reference model: one per (producer, tensor, destination
    device), numbered in the channel queue's tie order (producer, destination name rank, tensor)."""

    producer: np.ndarray
    channel: np.ndarray
    duration: np.ndarray
    of_edge: np.ndarray  #: per edge, its transfer (-1 for an edge within one device)


def _sends(graph: OpGraph, cluster: Cluster, node_device: np.ndarray) -> _Sends:
    src, dst = graph.src, graph.dst
    cross = np.flatnonzero(node_device[src] != node_device[dst])
    of_edge = np.full(graph.num_edges, -1, dtype=np.int64)
    if cross.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _Sends(empty, empty, np.zeros(0), of_edge)
    to = node_device[dst[cross]]
    keys = np.stack([src[cross], cluster.name_rank[to], graph.edge_tensor[cross]])
    unique, inverse = np.unique(keys, axis=1, return_inverse=True)
    inverse = inverse.reshape(-1)
    of_edge[cross] = inverse
    producer = unique[0]
    x_dst = np.zeros(producer.size, dtype=np.int64)
    x_dst[inverse] = to
    nbytes = np.zeros(producer.size)
    np.maximum.at(nbytes, inverse, graph.edge_bytes[cross].astype(np.float64))
    channel = cluster.channel_index[node_device[producer], x_dst]
    latency = np.array([c.latency_s for c in cluster.channels] or [0.0])
    bandwidth = np.array([c.bandwidth_bytes_per_s for c in cluster.channels] or [1.0])
    return _Sends(producer, channel, latency[channel] + nbytes / bandwidth[channel], of_edge)


def upward_ranks(graph: OpGraph, cluster: Cluster, node_device: np.ndarray) -> np.ndarray:
    """Each node's longest path to the end of the step, itself included, under a placement.

    A node's own duration on its device, plus the longest over its
    successors of their rank and, where the successor is on another
    device, the transfer between them (latency plus bytes over bandwidth).
    HEFT's upward rank, with the placement known.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> cluster = load_cluster("2xV100-nvlink")
    >>> g = OpGraph(["a", "b", "c"], [1e-3, 2e-3, 1e-3], [0, 0], [1, 2], [0, 25_000_000])
    >>> (upward_ranks(g, cluster, np.array([0, 0, 0])) * 1e3).round(3).tolist()
    [3.0, 2.0, 1.0]
    >>> (upward_ranks(g, cluster, np.array([0, 0, 1])) * 1e3).round(3).tolist()    # 25 MB to c: 1.01 ms
    [3.01, 2.0, 1.0]
    """
    dur = graph.durations(cluster)[np.arange(graph.num_nodes), node_device] if graph.num_nodes else np.zeros(0)
    return _upward_ranks(graph, dur, _sends(graph, cluster, node_device))


def _upward_ranks(graph: OpGraph, dur: np.ndarray, sends: _Sends) -> np.ndarray:
    """:func:`upward_ranks` from each node's duration on its device and the placement's transfers."""
    edge_cost = np.zeros(graph.num_edges)
    crossing = sends.of_edge >= 0
    edge_cost[crossing] = sends.duration[sends.of_edge[crossing]]
    ptr, edges = graph.out_edges
    ptr_l, dst_l, cost_l = ptr.tolist(), graph.dst[edges].tolist(), edge_cost[edges].tolist()
    rank = dur.tolist()
    for v in graph.topological_order[::-1].tolist():
        longest = 0.0
        for k in range(ptr_l[v], ptr_l[v + 1]):
            reach = rank[dst_l[k]] + cost_l[k]
            if reach > longest:
                longest = reach
        rank[v] += longest
    return np.asarray(rank)


def priority_orders(
    graph: OpGraph, cluster: Cluster, node_device: np.ndarray, priority: np.ndarray | None = None
) -> list[np.ndarray]:
    """Per device, the order in which a list schedule of the placement starts its operations.

    The step is played as the reference model plays it (devices run one
    operation at a time; each finished operation sends one transfer per
    tensor and destination device, queued on the channel of that pair;
    channels serve their queues first come, first served; every event of an
    instant is applied before anyone picks), except that an idle device
    starts, among its operations whose inputs are all there, the one of
    highest ``priority`` (default :func:`upward_ranks`: the longest way to
    the end of the step first) rather than the one ready first. Replayed as
    a plan's order, the reference model gives the same times.

    Parameters
    ----------
    graph, cluster
    node_device : ndarray of int
        A device per node, every cross-device pair linked by a channel.
    priority : ndarray, optional

    Returns
    -------
    list of ndarray
        Per device, its nodes in the order they start.

    Examples
    --------
    ``a`` feeds a long chain ``b -> c`` and a short ``d``; ready at once, ``b`` goes first:

    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["a", "d", "b", "c"], [1e-3, 1e-3, 1e-3, 1e-3], [0, 0, 2], [1, 2, 3], [8, 8, 8])
    >>> [g.ids[i] for i in priority_orders(g, load_cluster("2xV100-nvlink"), np.zeros(4, dtype=int))[0]]
    ['a', 'b', 'd', 'c']
    """
    return _list_schedule(graph, cluster, node_device, priority).orders


class _ListSchedule(NamedTuple):
    """What :func:`_list_schedule` plays: per device, its nodes in the order they start, and the step's end."""

    orders: list[np.ndarray]
    makespan_s: float


def _list_schedule(
    graph: OpGraph,
    cluster: Cluster,
    node_device: np.ndarray,
    priority: np.ndarray | None = None,
    durations: np.ndarray | None = None,
) -> _ListSchedule:
    """:func:`priority_orders`' list schedule, with the instant its last operation ends; ``durations``:
    ``graph.durations(cluster)`` where the caller has it."""
    n, n_dev = graph.num_nodes, cluster.num_devices
    node_device = np.asarray(node_device, dtype=np.int64)
    durations = graph.durations(cluster) if durations is None else durations
    placed = durations[np.arange(n), node_device] if n else np.zeros(0)
    sends = _sends(graph, cluster, node_device)
    if priority is None:
        priority = _upward_ranks(graph, placed, sends)
    dur = placed.tolist()
    n_x = sends.producer.size
    local = np.flatnonzero(sends.of_edge < 0)
    cross = np.flatnonzero(sends.of_edge >= 0)
    local_succ = _grouped(graph.src[local], graph.dst[local], n)
    sends_of = _grouped(sends.producer, np.arange(n_x), n)
    receivers = _grouped(sends.of_edge[cross], graph.dst[cross], n_x)
    pending = np.bincount(graph.dst, minlength=n).tolist()
    device = node_device.tolist()
    channel = sends.channel.tolist()
    x_dur = sends.duration.tolist()
    key = (-np.asarray(priority, dtype=np.float64)).tolist()

    ready: list[list[tuple[float, int]]] = [[] for _ in range(n_dev)]
    for v in range(n):
        if pending[v] == 0:
            ready[device[v]].append((key[v], v))
    for queue in ready:
        heapq.heapify(queue)
    queues: list[list[tuple[float, int]]] = [[] for _ in cluster.channels]
    busy_device, busy_channel = [False] * n_dev, [False] * len(cluster.channels)
    events: list[tuple[float, int]] = []  # (time, code): code < n an operation ends, else transfer code - n
    started: list[int] = []
    dirty_devices, dirty_channels = set(range(n_dev)), set()
    instant_jobs = 0.0 in dur or 0.0 in x_dur
    t = 0.0

    def start_operation(d: int, instant_only: bool) -> bool:
        queue = ready[d]
        if not queue or (instant_only and dur[queue[0][1]]):
            return False
        v = heapq.heappop(queue)[1]
        busy_device[d] = True
        started.append(v)
        heapq.heappush(events, (t + dur[v], v))
        return True

    def start_transfer(c: int, instant_only: bool) -> bool:
        queue = queues[c]
        if not queue or (instant_only and x_dur[queue[0][1]]):
            return False
        x = heapq.heappop(queue)[1]
        busy_channel[c] = True
        heapq.heappush(events, (t + x_dur[x], n + x))
        return True

    while True:
        while events and events[0][0] == t:
            code = heapq.heappop(events)[1]
            if code < n:
                busy_device[device[code]] = False
                dirty_devices.add(device[code])
                for x in sends_of[code]:
                    heapq.heappush(queues[channel[x]], (t, x))
                    dirty_channels.add(channel[x])
                arrivals = local_succ[code]
            else:
                busy_channel[channel[code - n]] = False
                dirty_channels.add(channel[code - n])
                arrivals = receivers[code - n]
            for v in arrivals:
                pending[v] -= 1
                if pending[v] == 0:
                    heapq.heappush(ready[device[v]], (key[v], v))
                    dirty_devices.add(device[v])
        if instant_jobs:
            began = [d for d in dirty_devices if not busy_device[d] and start_operation(d, True)]
            began += [c for c in dirty_channels if not busy_channel[c] and start_transfer(c, True)]
            if began:
                continue
        for d in dirty_devices:
            if not busy_device[d]:
                start_operation(d, False)
        dirty_devices.clear()
        for c in dirty_channels:
            if not busy_channel[c]:
                start_transfer(c, False)
        dirty_channels.clear()
        if not events:
            break
        t = events[0][0]
    order = np.asarray(started, dtype=np.int64)
    return _ListSchedule([order[node_device[order] == d] for d in range(n_dev)], t)


class _Colocation(NamedTuple):
    """The colocation groups of a graph, by sorted label: each node's group (-1: none) and each group's nodes."""

    group_of: np.ndarray
    members: list[np.ndarray]


def _colocation_index(graph: OpGraph) -> _Colocation:
    """:class:`_Colocation` of ``graph``."""
    names = sorted(graph.colocation_groups)
    group_of = np.full(graph.num_nodes, -1, dtype=np.int64)
    for g, key in enumerate(names):
        group_of[graph.colocation_groups[key]] = g
    return _Colocation(group_of, [graph.colocation_groups[key] for key in names])


def _grouped(keys: np.ndarray, values: np.ndarray, n: int) -> list[list[int]]:
    """``values`` grouped by ``keys`` (in 0 .. n - 1) into n lists."""
    by_key = np.argsort(keys, kind="stable")
    values, bounds = values[by_key].tolist(), np.searchsorted(keys[by_key], np.arange(n + 1)).tolist()
    return [values[bounds[k] : bounds[k + 1]] for k in range(n)]


#: Moves :func:`refine` evaluates at most (each a list schedule of the whole graph) ...
REFINE_MOVES = 48
#: ... and within ``celeritas``, at most this many operations' worth of list schedules, so that the
#: refinement of a larger graph costs about what a 10k-operation one does: a count, not seconds, so that
#: the plan does not depend on the machine's speed.
REFINE_WORK = 480_000


class Refined(NamedTuple):
    """What :func:`refine` returns: the placement, its per-device order (None: the reference model's
    earliest-ready dispatch), its simulated step, and the moves made."""

    node_device: np.ndarray
    orders: list[np.ndarray] | None
    result: SimResult
    moves: int

    @property
    def rank(self) -> tuple[bool, float]:
        """Fitting first, then the shorter step."""
        return (not self.result.fits, self.result.makespan_s)


def refine(
    graph: OpGraph,
    cluster: Cluster,
    fused: FusedGraph,
    node_device: np.ndarray,
    orders: list[np.ndarray] | None = None,
    moves: int = REFINE_MOVES,
    deadline: float = np.inf,
) -> Refined:
    """Move clusters of ``fused`` along the critical path while the simulated step shortens.

    Adjusting Placement decides each cluster once, in CPD-TOPO order, from
    the clusters placed before it: the depth-first order places the longest
    branch of a block first and the rule keeps the next one on its device
    unless the wait there beats sending the output back, a wait that the
    branches still to come make longer. Once every cluster is placed, the
    step's critical path (:func:`~placer.sim.critical.critical_path`) shows where the step
    waits; this pass moves, one at a time, the clusters that make it wait:

    - for each transfer on the path, the reader's cluster to the sender's
      device and the sender's to the reader's (the transfer goes);
    - each cluster with work on the path, the clusters that work the longest
      first, to the device that is busy least while it runs (the work
      spreads to an idle device).

    A cluster moves with the colocation groups of its members, only to a
    device all of them may use and channels link to their neighbours. A
    move is played in the order the best placement so far runs in
    (:func:`priority_orders`' list schedule, or the earliest-ready
    dispatch, which needs less memory where the list schedule does not
    fit) and stays where the reference model finds that it fits and ends
    the step earlier; the other order is then tried too, and the path is
    traced again. A move that did not help is not tried again.
    The pass ends when no move helps, after ``moves`` moves evaluated, or at
    ``deadline``.

    Parameters
    ----------
    graph, cluster
    fused : FusedGraph
        The fusion whose clusters move.
    node_device : ndarray of int
        The placement to start from, valid (kinds, colocation, links).
    orders : list of ndarray, optional
        Its per-device order; None for the earliest-ready dispatch.
    moves : int
        The most moves evaluated.
    deadline : float
        A ``time.perf_counter`` instant after which no move is evaluated.

    Returns
    -------
    Refined
        The best placement found, fitting ones first: the start itself where no move helps.

    Examples
    --------
    Three parallel branches all placed on one device spread over the others:

    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> from placer.transform.fusion import fuse
    >>> graph, cluster = training_graph(layers=2, branches=3, seed=1), load_cluster("4xV100-nvlink")
    >>> fused = fuse(graph, cluster, exploration_range=4)
    >>> start = np.zeros(graph.num_nodes, dtype=int)
    >>> refined = refine(graph, cluster, fused, start)
    >>> bool(refined.result.makespan_s < simulate(graph, cluster, start).makespan_s), refined.moves > 0
    (True, True)
    >>> np.unique(refined.node_device).size > 1
    True
    """
    node_device = np.asarray(node_device, dtype=np.int64).copy()
    best = Refined(node_device, orders, simulate(graph, cluster, node_device, orders, check=False), 0)
    if moves <= 0 or graph.num_nodes == 0:
        return best
    allowed = group_allowed(graph, cluster)
    group_of, members_of = _colocation_index(graph)
    linked = cluster.linked

    def moved(k: int) -> np.ndarray:
        members = fused.members[k]
        groups = np.unique(group_of[members])
        return np.unique(np.concatenate([members] + [members_of[g] for g in groups[groups >= 0].tolist()]))

    durations = graph.durations(cluster)

    def played(trial: np.ndarray, ranked: bool) -> Refined | None:
        """The trial placement in the list schedule's order (``ranked``) or the earliest-ready one, where it
        ranks before the best so far."""
        if ranked:
            schedule = _list_schedule(graph, cluster, trial, durations=durations)
            if schedule.makespan_s >= best.result.makespan_s and best.result.fits:
                return None  # the reference model would say the same
            found = Refined(trial, schedule.orders, simulate(graph, cluster, trial, schedule.orders, check=False), 0)
        else:
            found = Refined(trial, None, simulate(graph, cluster, trial, None, check=False), 0)
        return found if found.rank < best.rank else None

    def tried_out(trial: np.ndarray) -> Refined | None:
        """The trial placement, played in the order the best so far runs in, where it ranks before the best;
        from the earliest-ready order, in the list schedule's too, where that ranks before it."""
        found = played(trial, best.orders is not None)
        if found is None or found.orders is not None:
            return found
        other = played(trial, True)
        return other if other is not None and other.rank < found.rank else found

    if orders is None:  # the list schedule's order instead where it fits and is no slower
        schedule = _list_schedule(graph, cluster, node_device, durations=durations)
        ranked = Refined(
            node_device, schedule.orders, simulate(graph, cluster, node_device, schedule.orders, check=False), 0
        )
        no_slower = ranked.result.makespan_s <= best.result.makespan_s * (1 + 1e-9)  # up to rounding
        best = ranked if ranked.result.fits and no_slower else best
    tried: set[tuple[int, int]] = set()
    evaluated = 0
    while evaluated < moves:
        result, current = best.result, best.node_device
        found = None
        for k, d in _wanted_moves(fused, result, critical_path(result)):
            if (k, d) in tried:
                continue
            tried.add((k, d))
            nodes = moved(k)
            if (current[nodes] == d).all() or not allowed[nodes, d].all():
                continue
            trial = current.copy()
            trial[nodes] = -1
            if not linked_devices(graph, linked, trial, nodes)[d]:
                continue
            if evaluated >= moves or time.perf_counter() > deadline:
                return best
            trial[nodes] = d
            evaluated += 1
            found = tried_out(trial)
            if found is not None:
                best = found._replace(moves=best.moves + 1)
                break
        if found is None:
            break
    return best


def _wanted_moves(fused: FusedGraph, result: SimResult, path: list[CriticalLink]) -> Iterator[tuple[int, int]]:
    """The moves :func:`refine` tries, as (cluster, device), best first: for each transfer on the critical
    ``path``, latest first, its reader's cluster to the sender's device and the sender's to the reader's;
    then each cluster with work on the path, the longest first, to the device busy least while it runs (of
    those, the one its neighbours send and read the most bytes on)."""
    device = result.device_of
    for link in path:
        if link.kind == "transfer":
            yield int(fused.cluster_of[link.node]), int(device[link.before])
            yield int(fused.cluster_of[link.before]), int(device[link.node])
    n_dev, graph = result.cluster.num_devices, result.graph
    on_path = np.array([link.node for link in path], dtype=np.int64)
    work = np.bincount(fused.cluster_of[on_path], weights=result.finish[on_path] - result.start[on_path])
    for k in np.lexsort((np.arange(work.size), -work)).tolist():
        if work[k] <= 0:
            return
        members = fused.members[k]
        lo, hi = float(result.start[members].min()), float(result.finish[members].max())
        overlap = np.clip(np.minimum(result.finish, hi) - np.maximum(result.start, lo), 0.0, None)
        busy = np.bincount(device, weights=overlap, minlength=n_dev)
        busy[np.unique(device[members])] = np.inf
        outs, ins = incident_edges(graph, members)
        near = np.bincount(
            np.concatenate([device[graph.dst[outs]], device[graph.src[ins]]]),
            weights=np.concatenate([graph.edge_bytes[outs], graph.edge_bytes[ins]]).astype(np.float64),
            minlength=n_dev,
        )
        yield k, int(np.lexsort((np.arange(n_dev), -near, busy))[0])


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


@dataclass(frozen=True)
class Candidate:
    """One way to fuse and place: the layout the fusion cuts, its exploration range, the placement policy.

    ``layout`` is "cpd" (CPD-TOPO, the paper's) or "consumer" (:func:`consumer_order`);
    ``charge_pushes`` as for :func:`schedule_coarse`; ``timing`` how Adjusting Placement times a
    cluster's inputs: "queued" (``queued`` of :func:`schedule_coarse`) or "paper" (Equation 7).
    """

    layout: str
    exploration_range: int
    policy: str
    charge_pushes: bool = True
    timing: str = "queued"


def consumer_order(graph: OpGraph, cluster: Cluster, order: np.ndarray) -> np.ndarray:
    """``order`` with every node that does no work moved to just before its first consumer.

    A parameter, and a view of it (a transposed weight), take no time; a
    depth-first order lists them where they become ready, at the start of
    the step, far from the operations that read them. Cut into contiguous
    clusters there, they form clusters of their own that Adjusting Placement
    places at time zero on the first device, and every consumer is then
    drawn to that device by the weight it would have to fetch. Moved next to
    its first consumer, such a node is fused with it and goes where it is
    read. Nodes that do work keep their places; the result is still a
    topological order.

    Parameters
    ----------
    graph, cluster
    order : ndarray of int
        A topological order.

    Returns
    -------
    ndarray of int

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.graph import OpGraph
    >>> graph = OpGraph(["w", "x", "f", "g"], [0.0, 1e-3, 1e-3, 1e-3], [0, 1, 2], [3, 2, 3], [8, 8, 8])
    >>> [graph.ids[i] for i in consumer_order(graph, load_cluster("2xV100-nvlink"), np.arange(4))]
    ['x', 'f', 'w', 'g']
    """
    n = graph.num_nodes
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    free = graph.durations(cluster).max(axis=1) <= 0 if n else np.zeros(0, dtype=bool)
    anchor = position.astype(np.float64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.src, minlength=n), out=ptr[1:])
    children = graph.dst[np.argsort(graph.src, kind="stable")]
    ptr_list = ptr.tolist()
    for u in order[::-1][free[order[::-1]]].tolist():
        if ptr_list[u + 1] > ptr_list[u]:
            anchor[u] = anchor[children[ptr_list[u] : ptr_list[u + 1]]].min()
    return np.lexsort((position, ~free, anchor))


def candidates(graph: OpGraph, policies: tuple[str, ...], exploration_range: int) -> list[Candidate]:
    """The fusions and policies tried, in order: the paper's first, then finer clusters where affordable.

    The paper fixes ``R`` = 200 by experiment. Clusters that large hold a
    whole stretch of the depth-first order, parallel branches and layers
    together, so on a step that fits one device the coarse graph is nearly
    a chain and Adjusting Placement rightly keeps it on one device. With
    "adjust" among ``policies``, on graphs of up to :data:`FINER_UP_TO`
    operations (planning time on larger ones stays that of the paper's
    fusion), Adjusting Placement also places the finer fusions of
    :data:`FINER`:

    - ``R / 10`` in the CPD-TOPO layout and in :func:`consumer_order`'s,
      with and without the charge for transfers pushed back
      (``charge_pushes`` of :func:`schedule_coarse`), and in the consumer
      layout with inputs timed by the paper's Equation 7;
    - ``R / 25`` in the CPD-TOPO layout and ``R / 50`` in both: clusters
      of a few operations, which split a recurrent step or an inception
      branch from its neighbours.

    The greedy rule reacts strongly to how the graph is cut and how inputs
    are timed, and no one of these wins everywhere; the reference model
    judges them (:func:`_fastest_fitting`).

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> [(c.layout, c.exploration_range, c.policy) for c in candidates(training_graph(layers=2), ("adjust",), 200)][:3]
    [('cpd', 200, 'adjust'), ('cpd', 20, 'adjust'), ('consumer', 20, 'adjust')]
    >>> [(c.exploration_range, c.timing) for c in candidates(training_graph(layers=2), ("adjust",), 200)][5:7]
    [(20, 'paper'), (8, 'queued')]
    """
    out = [Candidate("cpd", exploration_range, policy) for policy in policies]
    if "adjust" not in policies or graph.num_nodes > FINER_UP_TO:
        return out
    for finer in FINER:
        candidate = Candidate(
            finer.layout, max(1, exploration_range // finer.share), "adjust", finer.charge_pushes, finer.timing
        )
        if candidate not in out:
            out.append(candidate)
    return out


def _fused(
    graph: OpGraph,
    cluster: Cluster,
    layout: str,
    exploration_range: int,
    memory_fraction: float,
    cpd: FusedGraph | None,
) -> FusedGraph:
    if layout == "cpd":
        return fuse(graph, cluster, exploration_range=exploration_range, memory_fraction=memory_fraction)
    base = (
        cpd.order
        if cpd is not None
        else fuse(graph, cluster, exploration_range=exploration_range, memory_fraction=memory_fraction).order
    )
    return fuse_in_order(
        graph,
        cluster,
        consumer_order(graph, cluster, base),
        exploration_range=exploration_range,
        memory_fraction=memory_fraction,
    )


def _place(
    graph: OpGraph,
    cluster: Cluster,
    policies: tuple[str, ...],
    name: str,
    exploration_range: int,
    memory_fraction: float,
    time_limit: float | None,
) -> Plan:
    """Fuse, schedule the coarse graph by each candidate (:func:`candidates`; fused again into smaller
    clusters where none fits), and map the fastest fitting schedule back. With "adjust" among
    ``policies`` (``celeritas``), :func:`priority_orders` is among the orders tried and the fastest
    schedule is then refined (:func:`refine`, optional work under a time limit); Order-Place alone
    keeps the coarse schedule's or the earliest-ready order, as the paper's baseline runs.

    Raises
    ------
    InfeasibleError
        If no candidate gives a schedule that fits (the first one's diagnosis).
    """
    deadline = time.perf_counter() + (time_limit if time_limit is not None else np.inf)
    began, errors = time.perf_counter(), []
    fraction, ranked = memory_fraction, "adjust" in policies
    tries = candidates(graph, policies, exploration_range)
    best = _fastest_fitting(graph, cluster, tries, fraction, name, deadline, errors, ranked)
    took_s = time.perf_counter() - began
    while best is None and fraction * SMALLER_CLUSTERS_BY >= MIN_MEMORY_FRACTION:
        # Optional work: where the time limit cuts it short, the diagnosis at the fraction asked for stands.
        box = optional_work(took_s)
        if box is None or time.perf_counter() > deadline:
            break
        began = time.perf_counter()
        with box:
            found = _fastest_fitting(
                graph,
                cluster,
                [Candidate("cpd", exploration_range, p) for p in policies],
                fraction * SMALLER_CLUSTERS_BY,
                name,
                deadline,
                [],
                ranked,
            )
        if box.expired:
            break
        fraction, best, took_s = fraction * SMALLER_CLUSTERS_BY, found, time.perf_counter() - began
    if best is None:
        raise errors[0]  # the diagnosis at the memory fraction asked for
    makespan, schedule, order, rounds, order_kind, chosen, fused = best
    node_device, moves = schedule.node_device, 0
    if ranked and graph.num_nodes <= FINER_UP_TO:
        # Optional work, worth a start where a few moves fit (a move costs about what a candidate's simulation
        # did): the plan in hand stands where the time limit cuts it short.
        box = optional_work(8 * took_s / (len(ORDERS) * len(tries)))
        if box is not None and time.perf_counter() <= deadline:
            # Within a caller's frugal share, no more moves than the schedules simulated so far.
            most = min(REFINE_MOVES, max(1, REFINE_WORK // max(1, graph.num_nodes)))
            most = min(most, len(ORDERS) * len(tries)) if is_frugal() else most
            refined = None
            with box:
                # Moves stop short of the box's end, so that its expiry seldom discards the moves made.
                now = time.perf_counter()
                stop = min(deadline, now + 0.8 * (box.deadline - now))
                refined = refine(graph, cluster, fused, node_device, order, most, stop)
            if refined is not None and refined.result.fits and refined.result.makespan_s < makespan:
                node_device, order, moves = refined.node_device, refined.orders, refined.moves
                order_kind = 1 if order is None else 2
    # A graph without compute has an infinite CCR, which a plan file (JSON) cannot hold: None there.
    ccr_before, ccr_after = (x if np.isfinite(x) else None for x in (fused.ccr_before, fused.ccr_after))
    stats = {
        "clusters": fused.num_clusters,
        "ccr_before": ccr_before,
        "ccr_after": ccr_after,
        "coarse_makespan_s": schedule.makespan_s,
        "rounds": rounds,
        "policy": chosen.policy,
        "layout": chosen.layout,
        "exploration_range": chosen.exploration_range,
        "charge_pushes": chosen.charge_pushes,
        "timing": chosen.timing,
        "order": ORDERS[order_kind],
        "memory_fraction": fraction,
        "moves": moves,
    }
    return Plan.from_arrays(graph, cluster, node_device, order, algorithm=name, extra={"celeritas": stats})


def _fastest_fitting(
    graph: OpGraph,
    cluster: Cluster,
    tries: list[Candidate],
    memory_fraction: float,
    name: str,
    deadline: float,
    errors: list,
    ranked: bool = True,
) -> tuple | None:
    """The fastest fitting schedule by any of ``tries`` (:func:`_fitting_schedule`'s, with ``ranked``, with the
    candidate and its fused graph), or None; each candidate's InfeasibleError goes to ``errors``. No candidate
    after the first starts once a plan is in hand and ``deadline`` has passed."""
    best, fused_by, cpd = None, {}, None
    need = memory_need(graph, cluster)
    for candidate in tries:
        if best is not None and time.perf_counter() > deadline:
            break
        key = (candidate.layout, candidate.exploration_range)
        if key not in fused_by:
            fused_by[key] = _fused(graph, cluster, *key, memory_fraction, cpd)
            if candidate.layout == "cpd":
                cpd = fused_by[key]
        try:
            found = _fitting_schedule(
                graph,
                cluster,
                fused_by[key],
                candidate.policy,
                name,
                deadline,
                need=need,
                charge_pushes=candidate.charge_pushes,
                timing=candidate.timing,
                ranked=ranked,
            )
        except InfeasibleError as exc:
            errors.append(exc)
            continue
        if best is None or found[0] < best[0]:
            best = (*found, candidate, fused_by[key])
    return best


def _fitting_schedule(
    graph: OpGraph,
    cluster: Cluster,
    fused: FusedGraph,
    policy: str,
    name: str,
    deadline: float = np.inf,
    tries: int = 8,
    need: np.ndarray | None = None,
    charge_pushes: bool = True,
    timing: str = "queued",
    ranked: bool = True,
) -> tuple[float, CoarseSchedule, list[np.ndarray] | None, int, int]:
    """Schedule the coarse graph by ``policy`` until the reference model says the plan fits.

    Devices are budgeted with :func:`memory_need`. After a schedule that
    overflows, the nodes of every device whose simulated peak exceeds its
    estimate have their need raised by that ratio, so the next schedule
    budgets them as they really weigh. Each schedule is simulated with the
    coarse schedule's order, the earliest-ready order and, with ``ranked``,
    :func:`priority_orders`'.

    Returns
    -------
    (makespan, schedule, per-device order or None for the earliest-ready order, rounds, order kind)
        The order kind indexes :data:`ORDERS`.

    Raises
    ------
    InfeasibleError
        If no schedule within ``tries`` rounds (or before ``deadline``, a ``time.perf_counter`` instant) fits.
    """
    need = memory_need(graph, cluster) if need is None else need
    memory = cluster.memory.astype(np.float64)
    best = None
    for rounds in range(1, tries + 1):
        try:
            schedule = schedule_coarse(
                fused,
                cluster,
                policy,
                need,
                HEADROOM * memory,
                queued=policy == "adjust" and timing == "queued",
                charge_pushes=charge_pushes,
            )
        except InfeasibleError as exc:  # a dead end on devices not all linked
            raise InfeasibleError(f"{name}: {exc}") from None
        # The coarse schedule's order, the reference model's earliest-ready order, or a list schedule of the
        # placement by upward rank, whichever is fastest.
        peaks = []
        orders = [schedule.device_orders(fused, cluster.num_devices), None]
        if ranked:
            orders.append(priority_orders(graph, cluster, schedule.node_device))
        for kind, order in enumerate(orders):
            result = simulate(graph, cluster, schedule.node_device, order, check=False)
            if result.fits and (best is None or result.makespan_s < best[0]):
                best = (result.makespan_s, schedule, order, rounds, kind)
            peaks.append(result.peak_memory_bytes.astype(np.float64))
        if best is not None:
            return best
        if time.perf_counter() > deadline:
            break
        estimate = np.bincount(schedule.node_device, weights=need, minlength=cluster.num_devices)
        need = need * np.maximum(1.0, 1.02 * np.max(peaks, axis=0) / np.maximum(estimate, 1.0))[schedule.node_device]
    peak = min(peaks, key=lambda p: float(np.max(p - memory)))
    j = int(np.argmax(peak - memory))
    needs, has = shown_sizes(peak[j], memory[j])
    raise InfeasibleError(f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}")


@register("order_place")
def order_place(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    exploration_range: int = 200,
    memory_fraction: float = 0.25,
) -> Plan:
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
def celeritas(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    exploration_range: int = 200,
    memory_fraction: float = 0.25,
) -> Plan:
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
    which makes ``celeritas`` never slower than ``order_place``. On graphs
    of up to :data:`FINER_UP_TO` operations, Adjusting Placement also places
    finer fusions (:func:`candidates`), timing inputs as the reference model
    moves them (``queued`` in :func:`schedule_coarse`), and the fastest
    plan's clusters then move along its critical path while the simulated
    step shortens (:func:`refine`, at most :data:`REFINE_MOVES` moves tried, fewer on graphs
    above :data:`REFINE_WORK` / :data:`REFINE_MOVES` operations).

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
        With the fastest per-device order of :data:`ORDERS` (the coarse
        schedule's, the reference model's earliest-ready order, or
        :func:`priority_orders`'), and
        ``extra["celeritas"]``: clusters, CCR before and after fusion (None without compute),
        ``policy``: "adjust" (Adjusting Placement won) or "order" (Order-Place did), the
        ``layout`` ("cpd" or "consumer") and ``exploration_range`` of the winning fusion,
        ``charge_pushes`` (see :func:`schedule_coarse`), ``timing`` ("queued" or "paper",
        :class:`Candidate`), ``order`` (which of :data:`ORDERS`), the ``memory_fraction``
        its clusters were fused with, and ``moves``: the clusters :func:`refine` moved.

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
