"""The reference execution model of FORMATS.md, exactly.

:func:`simulate` plays one training step of a placed graph as discrete
events: devices run one operation at a time (in the plan's order, or the
earliest-ready operation first), each finished operation sends one transfer
per (tensor, destination device) over the channel of that pair, channels
serve their queues one transfer at a time, and every event of one instant is
applied before any device or channel picks its next job. Memory is then
accounted from the schedule with numpy (rule 6).

The event loop is plain Python over precomputed lists; everything per edge
or per transfer that does not depend on time is vectorised beforehand.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from ..cluster import Cluster
from ..errors import InvalidPlanError
from ..gcpause import gc_paused
from ..graph import OpGraph
from ..plan import BoundPlan, Plan, check_order_acyclic, check_placement
from ..transform.bind import bind_plan

__all__ = ["simulate", "simulate_plan", "simulate_bound", "SimResult", "Transfers"]


@dataclass
class Transfers:
    """The transfers of a simulated step, as parallel arrays (one entry per transfer)."""

    producer: np.ndarray  # node index that produced the tensor
    tensor: np.ndarray  # which output of the producer
    src_device: np.ndarray
    dst_device: np.ndarray
    channel: np.ndarray
    nbytes: np.ndarray
    queued: np.ndarray  # when it joined its channel's queue (producer's finish)
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return int(self.producer.size)

    def rows(self) -> dict[tuple[int, int, int], int]:
        """The entry of each transfer by (producer, tensor, destination device): one per triple (rule 4)."""
        return {
            key: x for x, key in enumerate(zip(self.producer.tolist(), self.tensor.tolist(), self.dst_device.tolist()))
        }


@dataclass
class SimResult:
    """What the reference model says of a placed step.

    Attributes
    ----------
    makespan_s : float
        Latest finish of any operation (rule 5).
    start, finish : ndarray
        Start and finish time of every node.
    device_of : ndarray of int
    transfers : Transfers
    peak_memory_bytes : ndarray of int
        Per device (rule 6).
    memory_bytes : ndarray of int
        Capacity per device.
    """

    graph: OpGraph
    cluster: Cluster
    device_of: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    start_rank: np.ndarray  # global sequence in which nodes started (breaks ties of equal start times)
    transfers: Transfers
    peak_memory_bytes: np.ndarray
    memory_bytes: np.ndarray
    _memory_events: tuple[np.ndarray, np.ndarray, np.ndarray]

    @property
    def makespan_s(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0

    @property
    def fits(self) -> bool:
        return bool(np.all(self.peak_memory_bytes <= self.memory_bytes))

    def device_orders(self) -> list[np.ndarray]:
        """The order each device ran its nodes in; as a plan's order it reproduces this schedule."""
        by_start = np.argsort(self.start_rank, kind="stable")
        return [by_start[self.device_of[by_start] == j] for j in range(self.cluster.num_devices)]

    def memory_timeline(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Times and the memory in use on ``device`` from each time on (a step function)."""
        dev, time, level = self._memory_events
        sel = dev == device
        t, lv = time[sel], level[sel]
        if t.size:
            # keep the level after the last event of each instant
            last = np.append(t[1:] != t[:-1], True)
            t, lv = t[last], lv[last]
        base = self.graph.param_bytes[self.device_of == device].sum()
        return np.concatenate([[0.0], t]), np.concatenate([[0], lv]) + base

    def busy_s(self) -> np.ndarray:
        """Total compute time per device."""
        return np.bincount(self.device_of, weights=self.finish - self.start, minlength=self.cluster.num_devices)

    def predicted(self) -> dict:
        """The ``predicted`` block of a plan file."""
        names = [d.name for d in self.cluster.devices]
        return {
            "makespan_s": self.makespan_s,
            "peak_memory_bytes": {n: int(p) for n, p in zip(names, self.peak_memory_bytes)},
            "fits": self.fits,
        }


def simulate(
    graph: OpGraph,
    cluster: Cluster,
    device_of: Sequence[int] | np.ndarray,
    order: Sequence[Sequence[int]] | None = None,
    *,
    check: bool = True,
) -> SimResult:
    """Simulate one step of ``graph`` placed by ``device_of`` under the reference model.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    device_of : array of int
        Device index per node.
    order : list of arrays of node indices, optional
        Per device, the order it runs its nodes (rule 2). Without one, an idle
        device starts the ready node that became ready earliest (ties: lowest index).
    check : bool
        Check device kinds, colocation and the order first (rule 8). Algorithms
        that already guarantee these may skip it in inner loops.

    Returns
    -------
    SimResult

    Raises
    ------
    InvalidPlanError
        A node on a forbidden device, a colocation group split, an order that
        deadlocks, or a transfer between devices that no channel connects.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> from placer.graph import OpGraph
    >>> g = OpGraph(["a", "b"], [1.0, 2.0], [0], [1], [0])
    >>> simulate(g, PRESETS["2xV100-nvlink"](), [0, 0]).makespan_s
    3.0
    """
    device_of = np.asarray(device_of, dtype=np.int64)
    n = graph.num_nodes
    if device_of.shape != (n,):
        raise InvalidPlanError(f"placement has {device_of.size} entries for {n} nodes")
    if n and (device_of.min() < 0 or device_of.max() >= cluster.num_devices):
        raise InvalidPlanError("placement refers to a device index outside the cluster")
    orders = None if order is None else [np.asarray(o, dtype=np.int64) for o in order]
    if check:
        check_placement(graph, cluster, device_of)
        if orders is not None:
            _check_order_covers(graph, cluster, device_of, orders)
            check_order_acyclic(graph, orders, [d.name for d in cluster.devices])
    return _run(graph, cluster, device_of, orders)


def simulate_bound(bound: BoundPlan) -> SimResult:
    """Simulate a plan already resolved and checked by :meth:`Plan.bind`."""
    return _run(bound.graph, bound.cluster, bound.device_of, bound.order)


def simulate_plan(plan: Plan, graph: OpGraph, cluster: Cluster) -> SimResult:
    """Check ``plan`` against ``graph`` and ``cluster`` (rule 8) and simulate it; memory is not checked."""
    return simulate_bound(bind_plan(plan, graph, cluster))


def _check_order_covers(graph: OpGraph, cluster: Cluster, device_of: np.ndarray, orders: list[np.ndarray]) -> None:
    if len(orders) != cluster.num_devices:
        raise InvalidPlanError(f"order has {len(orders)} device lists for {cluster.num_devices} devices")
    count = np.zeros(graph.num_nodes, dtype=np.int64)
    for j, seq in enumerate(orders):
        if seq.size and np.any(device_of[seq] != j):
            i = seq[np.flatnonzero(device_of[seq] != j)[0]]
            raise InvalidPlanError(f"the order of {cluster.devices[j].name!r} lists {graph.ids[i]!r}, placed elsewhere")
        np.add.at(count, seq, 1)
    if np.any(count != 1):
        i = int(np.flatnonzero(count != 1)[0])
        raise InvalidPlanError(f"node {graph.ids[i]!r} appears {count[i]} times in the order (must be once)")


def _durations_on(graph: OpGraph, cluster: Cluster, device_of: np.ndarray) -> np.ndarray:
    speed = np.array([d.speed for d in cluster.devices])
    dur = graph.compute_s / speed[device_of] if graph.num_nodes else np.zeros(0)
    kinds = [d.kind for d in cluster.devices]
    for i, by_kind in enumerate(graph.compute_s_by_kind):
        if by_kind:
            kind = kinds[device_of[i]]
            if kind in by_kind:
                dur[i] = by_kind[kind]
    return dur


class _TransferPlan(NamedTuple):
    """The edges of a placed graph, and the transfers its cross-device edges make (:func:`_plan_transfers`)."""

    local: np.ndarray  #: edges within one device
    cross: np.ndarray  #: edges between devices
    edge_to_xfer: np.ndarray  #: per cross edge, its transfer
    producer: np.ndarray  #: per transfer (as the rest): the node that produced its tensor
    tensor: np.ndarray  #: which output of the producer
    src: np.ndarray  #: the producer's device
    dst: np.ndarray  #: the destination device
    channel: np.ndarray
    nbytes: np.ndarray  #: the most bytes of its edges
    duration: np.ndarray  #: the channel's latency plus nbytes over its bandwidth


def _plan_transfers(graph: OpGraph, cluster: Cluster, device_of: np.ndarray) -> _TransferPlan:
    """Group cross-device edges into transfers: one per (producer, tensor, destination device).

    Transfers are numbered in the channel queue's tie order: by producer,
    destination device name, tensor (FORMATS.md, rule 4).

    Raises
    ------
    InvalidPlanError
        Where no channel connects a producer's device to a destination.
    """
    src, dst = graph.src, graph.dst
    sdev, ddev = device_of[src], device_of[dst]
    cross = np.flatnonzero(sdev != ddev)
    local = np.flatnonzero(sdev == ddev)
    # The channel tie rule orders by producer, destination device *name*, tensor.
    name_rank = cluster.name_rank
    keys = np.stack([src[cross], name_rank[ddev[cross]], graph.edge_tensor[cross]])
    if cross.size:
        uniq, edge_to_xfer = np.unique(keys, axis=1, return_inverse=True)
        edge_to_xfer = edge_to_xfer.reshape(-1)
    else:
        uniq, edge_to_xfer = np.zeros((3, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
    nx_ = uniq.shape[1]
    # np.unique sorts lexicographically, so the transfer index is the static tie rank.
    producer = uniq[0]
    tensor = uniq[2]
    x_src = device_of[producer]
    x_dst = np.zeros(nx_, dtype=np.int64)
    x_dst[edge_to_xfer] = ddev[cross]
    nbytes = np.zeros(nx_, dtype=np.int64)
    np.maximum.at(nbytes, edge_to_xfer, graph.edge_bytes[cross])
    channel = cluster.channel_index[x_src, x_dst] if nx_ else np.zeros(0, dtype=np.int64)
    if nx_ and channel.min() < 0:
        x = int(np.flatnonzero(channel < 0)[0])
        raise InvalidPlanError(
            f"node {graph.ids[producer[x]]!r} sends to {cluster.devices[x_dst[x]].name!r} from "
            f"{cluster.devices[x_src[x]].name!r}, but no channel connects these devices"
        )
    lat = np.array([c.latency_s for c in cluster.channels] or [0.0])
    bw = np.array([c.bandwidth_bytes_per_s for c in cluster.channels] or [1.0])
    duration = lat[channel] + nbytes / bw[channel] if nx_ else np.zeros(0)
    return _TransferPlan(local, cross, edge_to_xfer, producer, tensor, x_src, x_dst, channel, nbytes, duration)


def _group(keys: np.ndarray, values: np.ndarray, n: int) -> list[list[int]]:
    """values grouped by key into n Python lists (keys in 0..n-1)."""
    order = np.argsort(keys, kind="stable")
    vals = values[order].tolist()
    bounds = np.searchsorted(keys[order], np.arange(n + 1)).tolist()
    return [vals[bounds[k] : bounds[k + 1]] for k in range(n)]


@gc_paused()
def _run(graph: OpGraph, cluster: Cluster, device_of: np.ndarray, orders: list[np.ndarray] | None) -> SimResult:
    n, n_dev, n_ch = graph.num_nodes, cluster.num_devices, len(cluster.channels)
    dur = _durations_on(graph, cluster, device_of)
    xp = _plan_transfers(graph, cluster, device_of)
    n_x = xp.producer.size

    local_succ = _group(graph.src[xp.local], graph.dst[xp.local], n)
    xfers_of = _group(xp.producer, np.arange(n_x), n)
    xfer_dsts = _group(xp.edge_to_xfer, graph.dst[xp.cross], n_x)
    pending = np.bincount(graph.dst, minlength=n).tolist()
    dev = device_of.tolist()
    dur_l = dur.tolist()
    ch_of = xp.channel.tolist()
    xdur = xp.duration.tolist()

    start = [0.0] * n
    finish = [0.0] * n
    rank = [0] * n
    x_start = [0.0] * n_x
    x_end = [0.0] * n_x
    dev_busy = [False] * n_dev
    ch_busy = [False] * n_ch
    ch_queue: list[list[tuple[float, int]]] = [[] for _ in range(n_ch)]
    events: list[tuple[float, int]] = []  # (time, code): code < n op finish, else transfer n+x
    heappush, heappop = heapq.heappush, heapq.heappop

    ordered = orders is not None
    if ordered:
        seqs = [o.tolist() for o in orders]
        ptr = [0] * n_dev
        is_ready = [False] * n
    else:
        ready_q: list[list[tuple[float, int]]] = [[] for _ in range(n_dev)]

    dirty_dev: set[int] = set(range(n_dev))
    dirty_ch: set[int] = set()
    for v in range(n):
        if pending[v] == 0:
            if ordered:
                is_ready[v] = True
            else:
                ready_q[dev[v]].append((0.0, v))
    if not ordered:
        for q in ready_q:
            heapq.heapify(q)

    def pick_device(d: int, instant_only: bool) -> bool:
        """Start the operation idle device ``d`` picks now (with ``instant_only``, only one of no
        duration); say whether it started one."""
        nonlocal started
        if ordered:
            k = ptr[d]
            seq = seqs[d]
            if k == len(seq) or not is_ready[seq[k]]:
                return False
            v = seq[k]
            if instant_only and dur_l[v]:
                return False
            ptr[d] = k + 1
        else:
            q = ready_q[d]
            if not q or (instant_only and dur_l[q[0][1]]):
                return False
            v = heappop(q)[1]
        start[v] = t
        f = t + dur_l[v]
        finish[v] = f
        dev_busy[d] = True
        rank[v] = started
        started += 1
        heappush(events, (f, v))
        return True

    def pick_channel(c: int, instant_only: bool) -> bool:
        """Start the transfer idle channel ``c`` picks now (with ``instant_only``, only one of no
        duration); say whether it started one."""
        q = ch_queue[c]
        if not q or (instant_only and xdur[q[0][1]]):
            return False
        x = heappop(q)[1]
        x_start[x] = t
        f = t + xdur[x]
        x_end[x] = f
        ch_busy[c] = True
        heappush(events, (f, n + x))
        return True

    # A job of no duration (captured graphs' views; a 0-byte transfer on a channel without latency) ends
    # at the instant it starts: such jobs start first, and their ends are applied, before any device or
    # channel picks a job that takes time (rule 7: every event of an instant before any pick).
    instant_jobs = 0.0 in dur_l or 0.0 in xdur
    t = 0.0
    started = 0
    while True:
        # Every event of this instant is applied before anyone picks (rule 7).
        while events and events[0][0] == t:
            code = heappop(events)[1]
            if code < n:
                d = dev[code]
                dev_busy[d] = False
                dirty_dev.add(d)
                for x in xfers_of[code]:
                    c = ch_of[x]
                    heappush(ch_queue[c], (t, x))
                    dirty_ch.add(c)
                arrivals = local_succ[code]
            else:
                x = code - n
                c = ch_of[x]
                ch_busy[c] = False
                dirty_ch.add(c)
                arrivals = xfer_dsts[x]
            for v in arrivals:
                pending[v] -= 1
                if pending[v] == 0:
                    dv = dev[v]
                    if ordered:
                        is_ready[v] = True
                    else:
                        heappush(ready_q[dv], (t, v))
                    dirty_dev.add(dv)
        if instant_jobs:
            began = [d for d in dirty_dev if not dev_busy[d] and pick_device(d, True)]
            began += [c for c in dirty_ch if not ch_busy[c] and pick_channel(c, True)]
            if began:  # their ends are events of this instant: applied before the other picks
                continue
        for d in dirty_dev:
            if not dev_busy[d]:
                pick_device(d, False)
        dirty_dev.clear()
        for c in dirty_ch:
            if not ch_busy[c]:
                pick_channel(c, False)
        dirty_ch.clear()
        if not events:
            break
        t = events[0][0]

    if started < n:
        _raise_deadlock(graph, cluster, device_of, orders, ptr if ordered else None)
    start_a = np.asarray(start)
    finish_a = np.asarray(finish)
    transfers = Transfers(
        xp.producer,
        xp.tensor,
        xp.src,
        xp.dst,
        xp.channel,
        xp.nbytes,
        finish_a[xp.producer],
        np.asarray(x_start),
        np.asarray(x_end),
    )
    peak, events_mem = _memory(
        graph, cluster, device_of, start_a, finish_a, xp.local, xp.cross, xp.edge_to_xfer, transfers
    )
    return SimResult(
        graph,
        cluster,
        device_of,
        start_a,
        finish_a,
        np.asarray(rank, dtype=np.int64),
        transfers,
        peak,
        cluster.memory,
        events_mem,
    )


def _raise_deadlock(graph, cluster, device_of, orders, ptr) -> None:
    stuck = []
    for j, seq in enumerate(orders or []):
        if ptr[j] < len(seq):
            stuck.append(f"{cluster.devices[j].name} waits for {graph.ids[seq[ptr[j]]]!r}")
    raise InvalidPlanError("the order deadlocks: " + "; ".join(stuck[:4]))


def _memory(
    graph: OpGraph,
    cluster: Cluster,
    device_of: np.ndarray,
    start: np.ndarray,
    finish: np.ndarray,
    local: np.ndarray,
    cross: np.ndarray,
    edge_to_xfer: np.ndarray,
    xf: Transfers,
):
    """Peak memory per device under rule 6, with half-open lifetimes [alloc, free).

    Releases at an instant count before allocations at it, which is what
    sorting the events by (device, time, delta) with releases negative gives.
    """
    n_dev = cluster.num_devices
    # An output lives until its last local consumer finishes and its last transfer ends.
    out_end = finish.copy()
    np.maximum.at(out_end, graph.src[local], finish[graph.dst[local]])
    np.maximum.at(out_end, xf.producer, xf.end)
    # A received copy lives from its transfer's start until its last consumer there finishes.
    recv_end = xf.end.copy()
    np.maximum.at(recv_end, edge_to_xfer, finish[graph.dst[cross]])

    dev = np.concatenate([device_of, device_of, xf.dst_device])
    t0 = np.concatenate([start, start, xf.start])
    t1 = np.concatenate([finish, out_end, recv_end])
    size = np.concatenate([graph.temp_bytes, graph.output_bytes, xf.nbytes])
    keep = (size > 0) & (t1 > t0)
    dev, t0, t1, size = dev[keep], t0[keep], t1[keep], size[keep]
    ev_dev = np.concatenate([dev, dev])
    ev_time = np.concatenate([t0, t1])
    ev_delta = np.concatenate([size, -size])
    order = np.lexsort((ev_delta, ev_time, ev_dev))
    ev_dev, ev_time, ev_delta = ev_dev[order], ev_time[order], ev_delta[order]
    # Each device's deltas sum to zero, so one running sum restarts at every device boundary.
    level = np.cumsum(ev_delta)
    dynamic = np.zeros(n_dev, dtype=np.int64)
    if level.size:
        np.maximum.at(dynamic, ev_dev, level)
    params = np.zeros(n_dev, dtype=np.int64)
    np.add.at(params, device_of, graph.param_bytes)
    return params + dynamic, (ev_dev, ev_time, level)
