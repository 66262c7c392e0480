"""Machinery shared by the list schedulers (HEFT, DPOS, Baechi's m-ETF, m-TOPO, m-SCT).

A list scheduler places operations one at a time and books each on a device
timeline. :class:`ScheduleState` keeps everything such a scheduler needs to
know about the partial schedule, in the terms of the reference model
(FORMATS.md):

- one timeline per device; an operation takes the earliest idle slot after
  its inputs arrive that is long enough (insertion-based, HEFT's and DPOS's
  rule), or the end of the timeline (append, ETF's rule);
- one timeline per *channel*: a tensor sent to another device is one
  transfer per (producer, tensor, destination device), booked on the
  channel of that pair where the channel's first-come-first-served queue
  puts it: once its producer has finished and every transfer booked there
  that queues ahead of it has ended (:class:`QueueOrder`). Where that slot
  is taken, the channel is crowded, and more of the crowd is still to be
  booked (a scheduler books a transfer when it places the consumer), so
  the transfer goes after every transfer booked there. Transfers that
  share a channel do not overlap, and a tensor already sent to a device
  is reused there;
- placement units (colocation groups) whose first scheduled member fixes
  the device of the whole group, kinds a unit may not use, and each
  device's memory over time (:class:`MemoryTimeline`);
- on devices not all linked, the devices each unit may still use without
  leaving a neighbour no device that a channel links to it
  (:meth:`ScheduleState.narrow_neighbours`, once per unit placed).

The per-device order is the order of each timeline. Where no transfer waits
for its channel, the start times a scheduler predicts are exactly those the
reference simulator measures when it runs that order. Where transfers
queue they can differ: the reference model serves a transfer booked late
before the booked ones that queue behind it, and delays those; a list
scheduler learns of a transfer only when it places the consumer. So
:func:`schedule_with_memory_retries` builds a schedule again, told the
transfers the simulation of the last one ran (``sends``): each is booked
as soon as its producer is, as the reference model queues it, and kept
where the step gets shorter.
:func:`~placer.algorithms.registry.place` reports the simulator's figures.
"""

from __future__ import annotations

import time
import weakref
from array import array
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError
from ..gcpause import gc_paused
from ..graph import OpGraph
from ..io import shown_sizes
from ..paths import bottom_levels, top_levels
from ..plan import Plan
from ..sim.bounds import fastest_durations
from ..sim.simulator import SimResult, simulate
from ..transform.colocate import colocate_layers
from .common import linked_devices, liveness_ratio, missing_link, placement_units, unit_allowed
from .timebox import TimeBox, is_frugal, optional_work, seconds_left

__all__ = ["Schedule", "ScheduleState", "upward_ranks", "edge_transfer_times", "Timeline", "QueueOrder",
           "schedule_with_memory_retries", "plan_from_schedule", "priority_order", "MemoryTimeline",
           "earliest_start_priorities", "simulated_sends", "refined_schedule", "plan_simulation",
           "rank_ordered_with_memory_retries", "scheduling_priorities", "rebudgeted"]


@dataclass
class Schedule:
    """A list schedule: placement, per-device order and the times the scheduler predicts.

    Attributes
    ----------
    device_of : ndarray of int
        Device index per node.
    orders : list of ndarray
        Per device, node indices in the order that device runs them.
    start, finish : ndarray of float
        Predicted start and finish time of every node.
    """

    device_of: np.ndarray
    orders: list[np.ndarray]
    start: np.ndarray
    finish: np.ndarray
    #: The reference simulation of the schedule, once :func:`schedule_with_memory_retries` ran it.
    simulated: SimResult | None = None
    #: The reference simulation of its placement under earliest-ready dispatch, once run (:func:`plan_simulation`).
    dispatched: SimResult | None = None
    #: The memory timeline the scheduler checked its bookings against, for :attr:`memory_seen`.
    memory: MemoryTimeline | None = None
    #: The transfers the scheduler booked: (producer, tensor, device) -> (channel, start, end).
    transfers: dict[tuple[int, int, int], tuple[int, float, float]] | None = None
    #: Per device, the bytes of its budgeted capacity that a limit of the scheduler's own used (m-TOPO's
    #: share), where that limit, not the memory over time, decided what went there.
    budget_seen: np.ndarray | None = None

    @property
    def memory_seen(self) -> np.ndarray | None:
        """Per device, the most memory the scheduler counted there while building it (:attr:`MemoryTimeline.seen`),
        or of its budget its own limit used (:attr:`budget_seen`), whichever is more."""
        if self.memory is None:
            return None
        seen = self.memory.seen.copy()
        return seen if self.budget_seen is None else np.maximum(seen, self.budget_seen)

    @property
    def makespan_s(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0


class Timeline:
    """Busy intervals of one device or channel, in time order, that find the earliest idle gap fast.

    Intervals are kept in blocks of a few dozen; each block knows the longest
    idle gap before any of its intervals, so a search for a gap of a given
    length skips whole blocks instead of walking every interval (list
    schedulers book out of time order, and graphs of 100k nodes leave long
    timelines).

    Examples
    --------
    >>> t = Timeline()
    >>> t.book(*t.find(0.0, 2.0, insertion=True), 2.0, "a")
    >>> t.book(*t.find(5.0, 4.0, insertion=True), 4.0, "b")
    >>> t.find(1.0, 3.0, insertion=True)[0], t.find(1.0, 3.0, insertion=False)[0]
    (2.0, 9.0)
    >>> t.items()
    ['a', 'b']
    """

    BLOCK = 64

    def __init__(self) -> None:
        self.starts: list[list[float]] = [[]]
        self.finishes: list[list[float]] = [[]]
        self.payload: list[list] = [[]]
        self.last = [float("-inf")]     # last finish of each block (non-decreasing)
        self.widest = [0.0]             # longest gap before an interval of each block
        # Per ready time, a job length that found no gap between it and the then last interval:
        # bookings only shrink gaps, so a job as long need not look there again (list
        # schedulers ask the same question many times over).
        self.no_gap: dict[float, tuple[float, float]] = {}

    def __len__(self) -> int:
        return sum(len(f) for f in self.finishes)

    def last_item(self):
        """What the latest interval carries (None when empty)."""
        return self.payload[-1][-1] if self.payload[-1] else None

    def items(self) -> list:
        """What every interval carries, in time order."""
        return [x for block in self.payload for x in block]

    def find(self, ready: float, length: float, insertion: bool) -> tuple[float, int, int]:
        """Earliest start >= ``ready`` of a job of ``length``, and where it enters: ``(start, block, index)``.

        With ``insertion`` the job may take an idle gap between booked
        intervals; otherwise it goes after the last one. An interval that
        finishes by ``ready`` stays before the job (so a zero-length
        predecessor finishing at ``ready`` keeps its place).
        """
        last_b = len(self.finishes) - 1
        end = (last_b, len(self.finishes[last_b]))
        if not insertion or self.last[last_b] <= ready:
            return max(ready, self.last[last_b]), *end
        shortest, searched = self.no_gap.get(ready, (float("inf"), ready))
        found = self._first_gap(max(ready, searched) if length >= shortest else ready, length)
        if found is None:
            self.no_gap[ready] = (length, self.last[last_b])
            return self.last[last_b], *end
        return found

    def idle_at(self, begin: float, length: float) -> bool:
        """Whether no booked interval overlaps ``[begin, begin + length)`` (as :meth:`find` with insertion sees it)."""
        last_b = len(self.finishes) - 1
        if self.last[last_b] <= begin:
            return True
        b = bisect_right(self.last, begin)
        return begin + length <= self.starts[b][bisect_right(self.finishes[b], begin)]

    def _first_gap(self, ready: float, length: float) -> tuple[float, int, int] | None:
        """The earliest idle gap after ``ready`` that holds ``length`` (as :meth:`find`), None if none does."""
        last_b = len(self.finishes) - 1
        if self.last[last_b] <= ready:
            return None
        b = bisect_right(self.last, ready)
        starts, finishes = self.starts[b], self.finishes[b]
        k = bisect_right(finishes, ready)
        if ready + length <= starts[k]:
            return ready, b, k
        for i in range(k + 1, len(starts)):
            if finishes[i - 1] + length <= starts[i]:
                return finishes[i - 1], b, i
        # The margin covers rounding between `a + length <= b` and `b - a >= length`. Most searches find no
        # later block wide enough: the largest bound, taken in C, settles those without a walk.
        if b == last_b or max(self.widest[b + 1:]) + 1e-9 < length:
            return None
        for b in range(b + 1, last_b + 1):
            if self.widest[b] + 1e-9 >= length:
                starts, finishes = self.starts[b], self.finishes[b]
                if self.last[b - 1] + length <= starts[0]:
                    return self.last[b - 1], b, 0
                widest = starts[0] - self.last[b - 1]
                for i in range(1, len(starts)):
                    if finishes[i - 1] + length <= starts[i]:
                        return finishes[i - 1], b, i
                    widest = max(widest, starts[i] - finishes[i - 1])
                self.widest[b] = widest   # bookings only shrink gaps: tighten the bound now that it is known
        return None

    def book(self, begin: float, b: int, k: int, length: float, item=None) -> None:
        """Book ``[begin, begin + length)`` at the place :meth:`find` returned."""
        if k == len(self.starts[b]):
            # Past the last interval: the idle time before it is a new gap.
            before = self.last[b] if self.starts[b] else (self.last[b - 1] if b > 0 else 0.0)
            self.widest[b] = max(self.widest[b], begin - before)
        self.starts[b].insert(k, begin)
        self.finishes[b].insert(k, begin + length)
        self.payload[b].insert(k, item)
        if len(self.starts[b]) > 2 * self.BLOCK:
            half = self.BLOCK
            for lists in (self.starts, self.finishes, self.payload):
                lists.insert(b + 1, lists[b][half:])
                del lists[b][half:]
            self.last.insert(b + 1, 0.0)
            self.widest.insert(b + 1, 0.0)
            self._refresh(b)
            self._refresh(b + 1)
        # Any other booking only splits a gap, so every block's widest gap stays an upper bound.
        self.last[b] = self.finishes[b][-1]

    def _refresh(self, b: int) -> None:
        starts, finishes = self.starts[b], self.finishes[b]
        self.last[b] = finishes[-1] if finishes else float("-inf")
        widest = starts[0] - (self.last[b - 1] if b > 0 else 0.0) if starts else 0.0
        for i in range(1, len(starts)):
            gap = starts[i] - finishes[i - 1]
            if gap > widest:
                widest = gap
        self.widest[b] = widest


class QueueOrder:
    """The transfers booked on one channel, by their place in its queue, that tell when those ahead of a new one end.

    The reference model's channel serves its queue first come, first served
    (FORMATS.md, rule 4): by the time a transfer joined the queue (its
    producer's finish), ties by producer, destination device name and
    tensor. A transfer cannot start before every transfer that queues ahead
    of it has ended; :meth:`ahead_until` gives that time. A list scheduler
    books transfers out of queue order, so the keys are kept sorted in
    blocks of a few dozen, each with the latest end among its transfers.

    Examples
    --------
    >>> q = QueueOrder()
    >>> q.add((2.0, 7, 0, 0), 5.0)
    >>> q.add((0.5, 3, 1, 0), 1.5)
    >>> q.ahead_until((1.0, 4, 0, 0)), q.ahead_until((3.0, 1, 0, 0)), q.ahead_until((0.0, 1, 0, 0))
    (1.5, 5.0, 0.0)
    """

    BLOCK = 64

    def __init__(self) -> None:
        self.keys: list[list[tuple]] = [[]]     # consecutive ranges of keys
        self.ends: list[list[float]] = [[]]
        self.latest = [0.0]                     # latest end in each block
        self.firsts: list[tuple] = []           # first key of each block but the first
        self.last_key: tuple = ()               # the largest key (() sorts before every key)
        self.latest_end = 0.0                   # the latest end of all

    def ahead_until(self, key: tuple) -> float:
        """When the last transfer queued ahead of ``key`` ends (0 if none is)."""
        if key > self.last_key:     # most transfers are booked in the order they queue
            return self.latest_end
        b = bisect_right(self.firsts, key)
        until = max(self.latest[:b], default=0.0)
        keys = self.keys[b]
        i = bisect_left(keys, key)
        if i == len(keys):
            return max(until, self.latest[b])
        return max(until, max(self.ends[b][:i])) if i else until

    def add(self, key: tuple, end: float) -> None:
        """Record a transfer booked with queue key ``key`` that ends at ``end``."""
        b = bisect_right(self.firsts, key)
        keys, ends = self.keys[b], self.ends[b]
        i = bisect_right(keys, key)
        keys.insert(i, key)
        ends.insert(i, end)
        self.latest[b] = max(self.latest[b], end)
        self.last_key, self.latest_end = max(self.last_key, key), max(self.latest_end, end)
        if len(keys) > 2 * self.BLOCK:
            half = self.BLOCK
            self.keys.insert(b + 1, keys[half:])
            self.ends.insert(b + 1, ends[half:])
            del keys[half:], ends[half:]
            self.latest[b] = max(ends)
            self.latest.insert(b + 1, max(self.ends[b + 1]))
            self.firsts.insert(b, self.keys[b + 1][0])


def edge_transfer_times(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """Per edge, the uncongested transfer time reduced over the ordered device pairs that have a channel.

    ``reduce`` is ``"max"`` (DPOS's c_ij) or ``"mean"`` (HEFT's average
    ``c̄_ij = L̄ + data_ij / B̄``, Topcuoglu et al. 2002, Sec. 3: the mean
    latency plus the bytes over the mean bandwidth of those pairs, not the
    mean of their transfer times, which a slow pair would raise more). Zero
    for a one-device cluster.
    """
    n_dev = cluster.num_devices
    pairs = (cluster.channel_index >= 0) & ~np.eye(n_dev, dtype=bool)
    if not pairs.any() or graph.num_edges == 0:
        return np.zeros(graph.num_edges)
    lat = cluster.latency[pairs]
    inv_bw = cluster.inverse_bandwidth[pairs]
    if reduce == "mean":
        return lat.mean() + graph.edge_bytes / (1.0 / inv_bw).mean()
    # The slowest pair for a given size: latency and bandwidth may come from different pairs.
    times = lat[None, :] + graph.edge_bytes[:, None].astype(np.float64) * inv_bw[None, :]
    return times.max(axis=1)


def upward_ranks(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """``rank_u(i) = w_i + max over successors (c_ij + rank_u(j))`` (HEFT eq. 6, FastT Sec. 5.1).

    ``w_i`` and ``c_ij`` are the mean (HEFT) or the max (DPOS) of the node's
    time over the devices it may use and of the edge's transfer time over the
    device pairs.
    """
    return bottom_levels(graph, *_node_and_edge_costs(graph, cluster, reduce))


def earliest_start_priorities(graph: OpGraph, cluster: Cluster, reduce: str) -> np.ndarray:
    """Minus each node's top level (its earliest start, the costs of :func:`upward_ranks`).

    By :func:`priority_order`, nodes then go in order of their earliest start:
    for rank-ordered schedulers under memory pressure. Ranked by upward rank,
    each gradient's optimizer update comes last of all (its path to the end
    is short), and under the reference model the whole output of the
    backward operation that made the gradient, its input gradient too, is
    held until then (ResNet-200 on one device: 17.2 GiB in upward-rank
    order, 12.4 GiB in this one).
    """
    return -top_levels(graph, *_node_and_edge_costs(graph, cluster, reduce))


def _node_and_edge_costs(graph: OpGraph, cluster: Cluster, reduce: str) -> tuple[np.ndarray, np.ndarray]:
    """``w_i`` and ``c_ij`` of :func:`upward_ranks`."""
    dur = graph.durations(cluster)
    allowed = graph.allowed(cluster)
    if reduce == "mean":
        w = np.where(allowed, dur, 0.0).sum(axis=1) / np.maximum(allowed.sum(axis=1), 1)
    else:
        w = np.where(allowed, dur, 0.0).max(axis=1, initial=0.0)
    return w, edge_transfer_times(graph, cluster, reduce)


def priority_order(graph: OpGraph, rank: np.ndarray, sources_first: bool = False) -> np.ndarray:
    """Nodes by decreasing rank, ties in topological order: always a topological order.

    A predecessor's upward rank is never below its successor's (nor is its
    :func:`earliest_start_priorities`), so sorting by decreasing rank with the
    topological position breaking ties respects every edge.

    ``sources_first`` puts the sources that take no time (parameters,
    optimizer states, inputs) first, in graph order, for a schedule built
    again told the transfers the last one sent (``sends``): such a source
    starts at 0 wherever it goes, and the reference model queues its
    transfers at 0, in graph order, ahead of everything produced later;
    booked first and in that order, they are booked where the channels'
    queues put them (bench/list_prediction.py). Not for a first schedule:
    where memory is tight, every parameter booked before any other node
    crowds the first devices (HEFT on VGG-19 over ``2xcpu``: 893 -> 3,316 ms).
    """
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    if not sources_first:
        return np.lexsort((position, -rank))
    no_time = (graph.compute_s == 0) & np.array([not (by_kind and any(by_kind.values()))
                                                 for by_kind in graph.compute_s_by_kind], dtype=bool)
    sources = no_time & (np.bincount(graph.dst, minlength=graph.num_nodes) == 0)
    # Kahn's order (graph.topological_order) puts the sources first, in graph order.
    return np.lexsort((position, np.where(sources, 0.0, -rank), ~sources))


class MemoryTimeline:
    """Memory in use on each device over time, as the reference model counts it, for a partial schedule.

    Every allocation holds from its start until it is freed at a time known
    only later (an output, until its last consumer is booked), so each device
    keeps a step function of time: ``used[d]`` is its level after every known
    event (what is held for good or not freed yet), and :meth:`fits` checks
    a new node's allocations against the whole future, not only the booking
    frontier: a copy sent to a device when its producer ends, long before the
    consumer booked now, counts from then on (FORMATS.md, rule 6).
    ``capacity_scale`` (per device) shrinks the devices that a previous
    schedule overflowed.

    Examples
    --------
    >>> m = MemoryTimeline(np.array([10.0]))
    >>> m.add(0, 2.0, 6.0); m.add(0, 5.0, -6.0)       # 6 bytes held over [2, 5)
    >>> m.fits(0, [(0.0, 4.0)]), m.fits(0, [(0.0, 5.0)]), m.fits(0, [(5.0, 10.0)])
    (True, False, True)
    >>> float(m.used[0])
    0.0
    """

    def __init__(self, capacity: np.ndarray, capacity_scale: np.ndarray | None = None):
        self.capacity = capacity.astype(np.float64) * (1.0 if capacity_scale is None else capacity_scale)
        n_dev = len(self.capacity)
        self.limits: list[float] = self.capacity.tolist()     # read at every check: Python floats
        self.used = [0.0] * n_dev
        # Per device, breakpoints and the level from each until the next (grown by doubling).
        self.times = [np.full(64, -np.inf) for _ in range(n_dev)]
        self.levels = [np.zeros(64) for _ in range(n_dev)]
        self.count = [1] * n_dev
        # Per device, a level no instant exceeds: raised by every allocation, reset to the true
        # peak when it is too high to settle a question on its own (frees do not lower it).
        self.ceiling = [0.0] * n_dev
        # Per device, the times and bytes of the steps added since its step function was last brought up
        # to date: a check the ceiling settles needs none of them, and on graphs whose memory is not tight
        # that is every check (bench/scaling.py). Arrays of floats: a schedule keeps its timeline.
        self.pending_times = [array("d") for _ in range(n_dev)]
        self.pending_bytes = [array("d") for _ in range(n_dev)]
        self._seen = np.zeros(n_dev)
        # Per device, the highest level from each breakpoint on, made when a check needs it and kept until the
        # step function changes: where memory is tight, a scheduler checks several nodes and devices between
        # two bookings, each event of a check held to the end (NASNet over 4xcpu, m-ETF counting outputs
        # whole: 336k checks, each taking a maximum over tens of thousands of breakpoints).
        self._suffix_max: list[np.ndarray | None] = [None] * n_dev

    @property
    def seen(self) -> np.ndarray:
        """Per device, the highest level the timeline ever reached: what its checks compared with the capacity."""
        for d in range(len(self.capacity)):
            self._settle(d)
        return self._seen

    def _settle(self, d: int) -> None:
        """Apply ``d``'s pending steps to its step function, in the order they were added."""
        if self.pending_times[d]:
            self._suffix_max[d] = None
        for time, amount in zip(self.pending_times[d], self.pending_bytes[d]):
            k = self._breakpoint(d, time)
            after = self.levels[d][k:self.count[d]]
            after += amount
            if amount > 0:
                self._seen[d] = max(self._seen[d], after.max())
        self.pending_times[d], self.pending_bytes[d] = array("d"), array("d")

    def _breakpoint(self, d: int, time: float) -> int:
        """Index of the breakpoint at ``time`` on device ``d``, made where there is none."""
        n, times, levels = self.count[d], self.times[d], self.levels[d]
        k = int(times[:n].searchsorted(time, side="right")) - 1
        if times[k] == time:
            return k
        if n == len(times):
            self.times[d] = times = np.concatenate([times, np.full(n, np.inf)])
            self.levels[d] = levels = np.concatenate([levels, np.zeros(n)])
        times[k + 2:n + 1] = times[k + 1:n]
        levels[k + 2:n + 1] = levels[k + 1:n]
        times[k + 1] = time
        levels[k + 1] = levels[k]
        self.count[d] = n + 1
        return k + 1

    def add(self, d: int, time: float, amount: float) -> None:
        """Hold ``amount`` more bytes on ``d`` from ``time`` on (less, when negative: a free)."""
        if amount:
            self.pending_times[d].append(time)
            self.pending_bytes[d].append(amount)
            self.used[d] += amount
            if amount > 0:
                self.ceiling[d] += amount

    def surely_fits(self, d: int, most: float) -> bool:
        """Whether ``d`` holds ``most`` more bytes at every instant, by its ceiling alone (:meth:`fits` may
        still say so where this does not)."""
        return self.ceiling[d] + most <= self.limits[d]

    def fits(self, d: int, events: list[tuple[float, float]]) -> bool:
        """Whether ``d`` stays within its capacity with ``events`` added: (time, bytes) each."""
        limit = self.limits[d]
        added = sum(amount for _, amount in events if amount > 0)
        if self.surely_fits(d, added):
            return True
        self._settle(d)
        n, times, levels = self.count[d], self.times[d][:self.count[d]], self.levels[d]
        suffix_max = self._suffix_max[d]
        if suffix_max is None:
            suffix_max = self._suffix_max[d] = np.maximum.accumulate(levels[n - 1::-1])[::-1]
        self.ceiling[d] = float(suffix_max[0])
        if self.ceiling[d] + added <= limit:
            return True
        events = sorted(events)
        held = 0.0
        for i, (time, amount) in enumerate(events):
            held += amount
            end = events[i + 1][0] if i + 1 < len(events) else np.inf
            if end == time:
                continue
            lo = int(times.searchsorted(time, side="right")) - 1
            hi = n if end == np.inf else int(times.searchsorted(end, side="left"))
            highest = suffix_max[lo] if hi >= n else levels[lo:max(hi, lo + 1)].max()
            if highest + held > limit:
                return False
        return True


class ScheduleTables:
    """What every schedule of one graph on one cluster reads and none changes (:func:`schedule_tables`).

    Attributes
    ----------
    dur : list of list of float
        Each node's time on each device.
    unit_of, units : placement units (:func:`~placer.algorithms.common.placement_units`)
    unit_ok : list of list of bool
        Whether each unit may use each device (its nodes' kinds).
    unit_links : list of (list of int, list of int), or None
        On devices not all linked, the units each unit sends to and receives
        from (:meth:`ScheduleState.narrow_neighbours`); None where every
        device sends to every other.
    device_links : (list of int, list of int), or None
        On devices not all linked, per device the bit mask of the devices it
        sends to and of those that send to it (itself included).
    params, output_bytes, temp_bytes : array of float
        Per node, its parameter, output and workspace bytes.
    unit_params : list of float
        Parameter bytes of each unit.
    grouped : list of bool
        Whether each unit is a colocation group of several nodes.
    group_members : dict
        The nodes of each such group, as a list.
    reserved_at : (list of float, list of float)
        Per node, the earliest it can start and end (its fastest time, no transfers).
    incoming : dict
        Per colocation group, the bytes of each tensor (producer, tensor) it
        reads from outside it.
    inputs : list of list of (producer, tensor, bytes)
        Each node's inputs; edges carrying the same tensor merge at their max.
    input_bytes : list of int
        Each node's inputs' bytes together.
    consumers : list of list of int
        Each node's consumers.
    readers : dict
        Per tensor (producer, tensor), the nodes reading it.
    fewest_bytes : dict
        Per tensor, the fewest bytes any reader's copy of it carries.
    channel_of, receivers, ch_lat, ch_inv_bw
        Channel of each device pair, the devices each channel brings data to,
        each channel's latency and inverse bandwidth.
    name_rank : list of int
        :attr:`~placer.cluster.Cluster.name_rank` (the channel queue's tie
        rule: :class:`QueueOrder`).
    """

    def __init__(self, graph: OpGraph, cluster: Cluster):
        n = graph.num_nodes
        self.dur = graph.durations(cluster).tolist()
        unit_of, self.units = placement_units(graph)
        self.unit_of: list[int] = unit_of.tolist()     # read node by node: a list's items are Python ints
        self.unit_ok: list[list[bool]] = unit_allowed(graph, cluster, self.units).tolist()
        self.params = graph.param_bytes.astype(np.float64)
        self.output_bytes = graph.output_bytes.astype(np.float64)
        self.temp_bytes = graph.temp_bytes.astype(np.float64)
        self.unit_params = np.bincount(unit_of, weights=self.params, minlength=len(self.units)).tolist()
        linked, bits = cluster.linked, 1 << np.arange(cluster.num_devices, dtype=object)
        self.unit_links = None if linked.all() else unit_neighbours(graph, unit_of, len(self.units))
        self.device_links = None if linked.all() else ((linked * bits).sum(axis=1).tolist(),
                                                       (linked.T * bits).sum(axis=1).tolist())
        self.channel_of = cluster.channel_index.tolist()
        # The devices each channel brings data to: a booking on it changes their estimates.
        self.receivers = [sorted({d for row in self.channel_of for d, c in enumerate(row) if c == k})
                          for k in range(len(cluster.channels))]
        self.ch_lat = [c.latency_s for c in cluster.channels]
        self.ch_inv_bw = [1.0 / c.bandwidth_bytes_per_s for c in cluster.channels]
        self.name_rank = cluster.name_rank.tolist()
        u_in, t_in, b_in, v_in = _merged_inputs(graph)
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(v_in, minlength=n), out=bounds[1:])
        triples, at = list(zip(u_in.tolist(), t_in.tolist(), b_in.tolist())), bounds.tolist()
        self.inputs: list[list[tuple[int, int, int]]] = [triples[at[v]:at[v + 1]] for v in range(n)]
        summed = np.concatenate([[0], np.cumsum(b_in)])
        self.input_bytes: list[int] = (summed[bounds[1:]] - summed[bounds[:-1]]).tolist()
        # A colocation group reserves room for its members from the earliest each can start, and
        # for each tensor it receives from outside (the gradients an optimizer update bound to its
        # parameters gets may come from anywhere) from the earliest its producer can end.
        self.grouped = [len(members) > 1 for members in self.units]
        self.group_members = {unit: members.tolist() for unit, members in enumerate(self.units) if self.grouped[unit]}
        fastest = fastest_durations(graph, cluster)
        fastest = np.where(np.isfinite(fastest), fastest, 0.0)
        earliest = top_levels(graph, fastest)
        self.reserved_at = (earliest.tolist(), (earliest + fastest).tolist())
        self.incoming: dict[int, dict[tuple[int, int], int]] = {
            unit: {(u, t): b for v in members.tolist() for u, t, b in self.inputs[v] if self.unit_of[u] != unit}
            for unit, members in enumerate(self.units) if self.grouped[unit]}
        # Each node's consumers, once each, in index order.
        by_pair = np.lexsort((v_in, u_in))
        once = by_pair[_first_of_runs(u_in[by_pair], v_in[by_pair])]
        pair_u, pair_v = u_in[once], v_in[once]
        np.cumsum(np.bincount(pair_u, minlength=n), out=bounds[1:])
        consumers, at = pair_v.tolist(), bounds.tolist()
        self.consumers: list[list[int]] = [consumers[at[u]:at[u + 1]] for u in range(n)]
        # Each tensor's readers in index order, and the fewest bytes among their copies; the tensors in the
        # order of their first reader's inputs.
        by_tensor = np.lexsort((np.arange(u_in.size), t_in, u_in))
        first = _first_of_runs(u_in[by_tensor], t_in[by_tensor])
        fewest = np.minimum.reduceat(b_in[by_tensor], first) if first.size else np.zeros(0, dtype=np.int64)
        tensors = np.argsort(by_tensor[first])
        keys = list(zip(u_in[by_tensor][first][tensors].tolist(), t_in[by_tensor][first][tensors].tolist()))
        readers, at = v_in[by_tensor].tolist(), np.append(first, u_in.size).tolist()
        self.readers: dict[tuple[int, int], list[int]] = {
            key: readers[at[k]:at[k + 1]] for key, k in zip(keys, tensors.tolist())}
        self.fewest_bytes: dict[tuple[int, int], int] = dict(zip(keys, fewest[tensors].tolist()))


def _first_of_runs(*keys: np.ndarray) -> np.ndarray:
    """Where each run of equal ``keys`` (arrays of one length, sorted together) starts."""
    if not keys[0].size:
        return np.zeros(0, dtype=np.int64)
    changed = np.zeros(keys[0].size - 1, dtype=bool)
    for key in keys:
        changed |= key[1:] != key[:-1]
    return np.flatnonzero(np.concatenate([[True], changed]))


def _merged_inputs(graph: OpGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every node's inputs: producer, tensor, bytes and node, one entry per (node, producer, tensor).

    A tensor's edges into one node merge at their most bytes (no fewer than 0). Entries go by node, then
    in the order of each tensor's first edge into it (:attr:`~placer.graph.OpGraph.in_edges`).
    """
    _, eids = graph.in_edges
    src, dst, tensor = graph.src[eids], graph.dst[eids], graph.edge_tensor[eids]
    by_key = np.lexsort((np.arange(eids.size), tensor, src, dst))
    first = _first_of_runs(dst[by_key], src[by_key], tensor[by_key])
    if not first.size:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    most = np.maximum(np.maximum.reduceat(graph.edge_bytes[eids][by_key], first), 0)
    entry = by_key[first]       # each merged input's first edge, in in_edges order
    back = np.argsort(entry)
    return src[entry][back], tensor[entry][back], most[back], dst[entry][back]


def unit_neighbours(graph: OpGraph, unit_of: np.ndarray, count: int) -> list[tuple[list[int], list[int]]]:
    """Per unit, the other units its nodes send to and those they receive from, each once."""
    pairs = np.unique(np.stack([unit_of[graph.src], unit_of[graph.dst]], axis=1).reshape(-1, 2), axis=0)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]].tolist()
    links: list[tuple[list[int], list[int]]] = [([], []) for _ in range(count)]
    for a, b in pairs:
        links[a][0].append(b)
        links[b][1].append(a)
    return links


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def schedule_tables(graph: OpGraph, cluster: Cluster) -> ScheduleTables:
    """The :class:`ScheduleTables` of ``graph`` on ``cluster``, built once while both live.

    The memory retries schedule one graph many times (:func:`schedule_with_memory_retries`);
    building these tables took a third of each schedule of a 29k-node graph.
    """
    per_cluster = _TABLES.setdefault(graph, weakref.WeakKeyDictionary())
    tables = per_cluster.get(cluster)
    if tables is None:
        tables = per_cluster[cluster] = ScheduleTables(graph, cluster)
    return tables


_PRIORITIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scheduling_priorities(graph: OpGraph, cluster: Cluster, reduce: str, earliest_first: bool = False) -> np.ndarray:
    """:func:`upward_ranks`, or with ``earliest_first`` :func:`earliest_start_priorities`, computed once
    while ``graph`` and ``cluster`` live, like :func:`schedule_tables` (read-only): the schedulers that book
    by rank need them for every schedule of the retries and the refinement."""
    known = _PRIORITIES.setdefault(graph, weakref.WeakKeyDictionary()).setdefault(cluster, {})
    priorities = known.get((reduce, earliest_first))
    if priorities is None:
        priorities = (earliest_start_priorities if earliest_first else upward_ranks)(graph, cluster, reduce)
        priorities.flags.writeable = False
        known[reduce, earliest_first] = priorities
    return priorities


class ScheduleState:
    """A partial list schedule under the reference model's devices, channels and memory.

    Parameters
    ----------
    graph, cluster
    ratio : float
        Memory ratio: the share of a node's output and workspace (and of
        the copies of its inputs) it holds on its device's
        :class:`MemoryTimeline`, beside its parameters (1: the reference model's
        bytes; :func:`schedule_with_memory_retries` moves it).
    insertion : bool
        Whether operations may take idle gaps between booked ones (HEFT, DPOS)
        or only go at the end of a device's timeline (ETF).
    contention : bool
        Whether transfers on one channel exclude each other (the reference
        model) or every transfer goes at once (the classic model of the
        list-scheduling papers, used to reproduce their examples).
    capacity_scale : array of float, optional
        Per device, the share of its memory the schedule may use (default all).
    sends : dict, optional
        Per node, the transfers of its outputs to book as soon as it is
        booked, as ``(tensor, device, bytes)``: the reference model queues a
        transfer at its producer's finish, before a list scheduler would
        place the consumer that needs it (:func:`simulated_sends`).
    """

    def __init__(self, graph: OpGraph, cluster: Cluster, ratio: float, *, insertion: bool,
                 contention: bool = True, capacity_scale: np.ndarray | None = None,
                 sends: dict[int, list[tuple[int, int, int]]] | None = None):
        self.graph = graph
        self.cluster = cluster
        self.insertion = insertion
        self.contention = contention
        n, n_dev = graph.num_nodes, cluster.num_devices
        tables = schedule_tables(graph, cluster)
        # Read-only, shared by every schedule of this graph on this cluster.
        self.dur, self.unit_of, self.units = tables.dur, tables.unit_of, tables.units
        self.unit_links = tables.unit_links
        self.group_members = tables.group_members
        self.unit_params, self.grouped, self.reserved_at = tables.unit_params, tables.grouped, tables.reserved_at
        self.channel_of, self.receivers = tables.channel_of, tables.receivers
        self.ch_lat, self.ch_inv_bw, self.name_rank = tables.ch_lat, tables.ch_inv_bw, tables.name_rank
        self.inputs, self.consumers, self.readers = tables.inputs, tables.consumers, tables.readers
        self.fewest_bytes = tables.fewest_bytes
        self.ratio = ratio
        self.memory = MemoryTimeline(cluster.memory, capacity_scale)
        # What a unit holds from its first booking: its parameters for the whole step, the rest from that start.
        need = tables.params + ratio * (tables.output_bytes + tables.temp_bytes)
        alone = need.tolist()       # most units are one node: no sum to take
        self.unit_need = [alone[members[0]] if len(members) == 1 else float(need[members].sum())
                          for members in self.units]
        self.unit_device = [-1] * len(self.units)
        #: Per unit, the devices it may use: its kinds allow them and, on devices not all linked, each leaves
        #: every neighbour a device to go to (:meth:`narrow_neighbours` narrows this copy as units are placed).
        self.unit_ok = tables.unit_ok
        if self.unit_links is not None:
            self.device_links = tables.device_links
            self.unit_ok = [row.copy() for row in tables.unit_ok]
            #: :attr:`unit_ok` as bit masks, which :meth:`narrow_neighbours` narrows.
            self.unit_bits = [sum(1 << d for d, ok in enumerate(row) if ok) for row in tables.unit_ok]
            everywhere = (1 << n_dev) - 1
            for unit, bits in enumerate(self.unit_bits):
                if bits != everywhere:      # its kinds keep it off some devices
                    self.narrow_neighbours(unit)
        # A colocation group's first member fixes the device of the others, so it reserves room
        # for them there (see ScheduleTables.incoming); booking a member turns its reservations
        # into its allocations, which start no later.
        self.incoming: dict[int, dict[tuple[int, int], float]] = {
            unit: {key: ratio * b for key, b in incoming.items()} for unit, incoming in tables.incoming.items()}
        for unit, incoming in self.incoming.items():
            self.unit_need[unit] += sum(incoming.values())
        #: Copies (producer, tensor, device) already on some device's memory timeline.
        self.budgeted: set[tuple[int, int, int]] = set()
        # When memory is freed is known once the nodes that hold it are booked: a node's
        # workspace at its finish; its output and the copies of it once every consumer is booked.
        self.consumers_left = [len(c) for c in self.consumers]
        #: Per node, the bytes a copy of each of its inputs would hold (the most its copies can add).
        self.copy_need = [ratio * b for b in tables.input_bytes]
        self.sent_until = [0.0] * n     # when the last transfer of each node's outputs ends
        self.copies_held: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self.transient = (ratio * tables.output_bytes).tolist()
        self.workspace = (ratio * tables.temp_bytes).tolist()
        self.device_of = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.devices = [Timeline() for _ in range(n_dev)]
        self.channels = [Timeline() for _ in cluster.channels]
        self.queues = [QueueOrder() for _ in cluster.channels]
        #: Per (producer, channel), the (destination name rank, tensor) of its transfers booked there, sorted.
        self.sent_to: dict[tuple[int, int], list[tuple[int, int]]] = {}
        #: Channel, start and end (its arrival) of each transfer booked, by (producer, tensor, device).
        self.booked: dict[tuple[int, int, int], tuple[int, float, float]] = {}
        #: The (node, device) pairs with some input already sent to the device.
        self.input_sent: set[tuple[int, int]] = set()
        self.sends = sends or {}
        #: The transfers booked from ``sends``, by (producer, tensor, device) (their start: ``booked``).
        self.sent_ahead: set[tuple[int, int, int]] = set()
        #: Bumped whenever a device's timeline, incoming channels or memory change.
        self.version = [0] * n_dev
        #: Per channel, the transfers booked after its end, leaving it idle before them, as how long each
        #: left it idle, in booking order: only such a booking can bring a transfer still to book forward
        #: (one in an idle slot only takes time from the channel, and a transfer starts at its turn in the
        #: queue or at the channel's end).
        self.gap_bookings: list[list[float]] = [[] for _ in cluster.channels]

    # ------------------------------------------------------------ queries
    def devices_for(self, v: int) -> list[int]:
        """Devices node ``v`` may go to now (:meth:`may_take`)."""
        unit = self.unit_of[v]
        fixed = self.unit_device[unit]
        if fixed >= 0:
            return [fixed]
        # may_take's test, its reads made once: asked for every node a scheduler places.
        ok, need, used = self.unit_ok[unit], self.unit_need[unit], self.memory.used
        return [d for d, limit in enumerate(self.memory.limits) if ok[d] and used[d] + need <= limit]

    def may_take(self, v: int, d: int) -> bool:
        """Whether node ``v`` may go to device ``d`` now: its unit's device once fixed, else an allowed one with room."""
        unit = self.unit_of[v]
        fixed = self.unit_device[unit]
        if fixed >= 0:
            return d == fixed
        return self.unit_ok[unit][d] and self.memory.used[d] + self.unit_need[unit] <= self.memory.limits[d]

    def any_input_sent(self, v: int, d: int) -> bool:
        """Whether some input of ``v`` is on device ``d`` already, sent there for another consumer."""
        return (v, d) in self.input_sent

    def same_routes(self, v: int, d: int, bookings: list) -> list[int]:
        """The devices other than ``d`` that every input of ``v`` would reach just as it reaches ``d``.

        ``bookings`` are the transfers :meth:`data_ready` gave for ``d``. When
        every input of ``v`` must be sent to ``d``, another device that none of
        them is on or was sent to, and that each reaches over the channel it
        takes to ``d``, gets the same transfers at the same times; as bookings
        only fill channels, its data-ready time stays at least what it is for
        ``d`` now, for as long as none of the inputs is sent there
        (:meth:`any_input_sent`), provided the same transfers queue ahead of
        each input on its way to either device: none of the same producer
        is booked on that channel whose (destination name, tensor) sorts
        between the input's to ``d`` and to the other (the queue's ties).
        """
        inputs = self.inputs[v]
        if not bookings or len(bookings) != len(inputs):
            return []
        others = [j for j in self.receivers[bookings[0][0]] if j != d]
        if not others:      # a channel per pair of devices
            return []
        routes = [(self.device_of[inputs[k][0]], c) for c, _, _, k in bookings]
        # Per input whose producer has transfers booked on its channel: the (rank, tensor) ties next
        # below and above its own to d, between which its tie to another device must fall.
        rank, windows = self.name_rank, []
        for c, _, _, k in bookings:
            u, t, _ = inputs[k]
            sent = self.sent_to.get((u, c))
            if sent:
                i = bisect_left(sent, (rank[d], t))
                windows.append((sent[i - 1] if i else (-1, -1), sent[i] if i < len(sent) else (len(rank), 0), t))
        return [j for j in others
                if all(below < (rank[j], t) < above for below, above, t in windows)
                and all(self.channel_of[du][j] == c and du != j for du, c in routes)
                and not self.any_input_sent(v, j)]

    def data_ready(self, v: int, d: int) -> tuple[float, list[tuple[int, float, float, int]]]:
        """When every input of ``v`` is on device ``d``, and the transfers that would be booked for it.

        Transfers are tried in the order they would queue in, each once its
        producer ends and every transfer booked on its channel that queues
        ahead of it has ended (:class:`QueueOrder`) if the channel is idle
        then, else after every transfer booked there (see the module's
        docstring); two of them on one channel go one after the other.
        """
        ready = 0.0
        bookings: list[tuple[int, float, float, int]] = []   # (channel, start, end, input)
        pending = []
        device_of, finish, booked = self.device_of, self.finish, self.booked   # a list scheduler's hottest loop
        for k, (u, t, b) in enumerate(self.inputs[v]):
            if device_of[u] == d:
                arrives = finish[u]
            else:
                known = booked.get((u, t, d))
                if known is None:
                    pending.append((finish[u], u, t, k))
                    continue
                arrives = known[2]
            if arrives > ready:
                ready = arrives
        if not pending:
            return ready, bookings
        pending.sort()
        # This node's own transfers on one channel go in the order they queue, one after another.
        channel_free: dict[int, float] = {}
        for queued, u, t, k in pending:
            c = self.channel_of[self.device_of[u]][d]
            if c < 0:
                return float("inf"), []
            length = self.transfer_s(c, self.inputs[v][k][2])
            if self.contention:
                begin = self._channel_slot(c, self._queue_key(u, t, d), channel_free.get(c, queued), length)
                channel_free[c] = begin + length
            else:
                begin = queued
            bookings.append((c, begin, begin + length, k))
            ready = max(ready, begin + length)
        return ready, bookings

    def arrives_by(self, v: int, d: int) -> float:
        """A time before which not every input of ``v`` can be on ``d``: each is there no sooner than its
        producer's finish, plus, from another device, the shortest transfer of it there (a channel's
        latency and the fewest bytes any copy of it carries; waiting for the channel only adds).
        Never above :meth:`data_ready`'s time."""
        ready = 0.0
        device_of, finish = self.device_of, self.finish
        for u, t, _ in self.inputs[v]:
            arrives, home = finish[u], device_of[u]
            c = self.channel_of[home][d] if home != d else -1
            if c >= 0:
                # Summed as an estimate sums a transfer (start + length): no rounding lifts it above one.
                arrives += self.transfer_s(c, self.fewest_bytes[(u, t)])
            if arrives > ready:
                ready = arrives
        return ready

    def transfer_s(self, c: int, nbytes: float) -> float:
        """Seconds a transfer of ``nbytes`` takes on channel ``c``: its latency plus ``nbytes / bandwidth``."""
        return self.ch_lat[c] + nbytes * self.ch_inv_bw[c]

    def _queue_key(self, u: int, t: int, d: int) -> tuple:
        """Where the transfer of output ``t`` of ``u`` to device ``d`` stands in its channel's queue (:class:`QueueOrder`)."""
        return self.finish[u], u, self.name_rank[d], t

    def _channel_slot(self, c: int, key: tuple, after: float, length: float) -> float:
        """Where channel ``c`` would start a transfer of ``length`` with queue key ``key`` (producer's
        finish first), not before ``after``: see the module's docstring."""
        after = max(after, key[0])
        queue, channel = self.queues[c], self.channels[c]
        if queue.latest_end > after:
            after = max(after, queue.ahead_until(key))
        # Where its slot in the queue is taken, the rest of the crowd comes ahead of it too
        # (bench/list_prediction.py).
        if channel.last[-1] <= after or channel.idle_at(after, length):
            return after
        return channel.find(after, length, insertion=False)[0]

    def estimate(self, v: int, d: int) -> tuple[float, float, tuple[int, int], list]:
        """``(EST, EFT, place on the device's timeline, transfer bookings)`` of node ``v`` on device ``d``."""
        ready, bookings = self.data_ready(v, d)
        if ready == float("inf"):
            return ready, ready, (0, 0), bookings
        length = self.dur[v][d]
        begin, b, k = self.devices[d].find(ready, length, self.insertion)
        return begin, begin + length, (b, k), bookings

    def cached_estimate(self, v: int, d: int, cache: dict) -> tuple[float, float, tuple[int, int], list]:
        """:meth:`estimate`, kept in ``cache`` by (node, device) for as long as that device's version holds."""
        version, est = cache.get((v, d), (-1, None))
        if version != self.version[d]:
            est = self.estimate(v, d)
            cache[(v, d)] = (self.version[d], est)
        return est

    def copies(self, v: int, d: int, bookings: list) -> dict[tuple[int, int, int], tuple[float, float]]:
        """The input copies placing ``v`` on ``d`` would create: (producer, tensor, device) -> (transfer start, bytes).

        A copy is held from the start of its transfer (ratio-scaled bytes);
        a colocation group's copies are in its reservation already.
        """
        if self.grouped[self.unit_of[v]]:
            return {}
        out = {}
        for _, begin, _, k in bookings:
            u, t, b = self.inputs[v][k]
            if (u, t, d) not in self.budgeted:
                out[(u, t, d)] = (begin, self.ratio * b)
        if self.sent_ahead:
            for u, t, b in self.inputs[v]:
                if (u, t, d) in self.sent_ahead and (u, t, d) not in self.budgeted:
                    out[(u, t, d)] = (self.booked[(u, t, d)][1], self.ratio * b)
        return out

    def need(self, v: int, d: int, estimate: tuple) -> float:
        """Bytes placing ``v`` on ``d`` adds there: its unit (unless already placed) and the
        input copies ``estimate``'s transfers create."""
        unit = self.unit_of[v]
        copies = sum(amount for _, amount in self.copies(v, d, estimate[3]).values())
        return copies + (self.unit_need[unit] if self.unit_device[unit] < 0 else 0.0)

    def _allocations(self, v: int, d: int, estimate: tuple) -> list[tuple[float, float]]:
        """What placing ``v`` on ``d`` adds to its memory timeline, as (time, bytes) steps.

        ``v``'s unit's parameters for the whole step (unless the unit is placed
        already); ``v``'s output and workspace from its start, the workspace
        freed at its finish; each new copy of an input from the start of its
        transfer. The output and the copies are freed once every consumer is
        booked (:meth:`_release`). A colocation group's first member adds
        the group's reservations instead (see ``__init__``).
        """
        unit = self.unit_of[v]
        steps = [(0.0, self.unit_params[unit])] if self.unit_device[unit] < 0 else []
        if self.grouped[unit]:
            if self.unit_device[unit] < 0:
                start, end = self.reserved_at
                steps += [(start[m], self.transient[m] + self.workspace[m]) for m in self.group_members[unit]]
                steps += [(end[u], amount) for (u, _), amount in self.incoming[unit].items()]
            return steps
        begin, end = estimate[0], estimate[1]
        steps += [(begin, self.transient[v] + self.workspace[v]), (end, -self.workspace[v])]
        return steps + list(self.copies(v, d, estimate[3]).values())

    def holds(self, v: int, d: int, estimate: tuple) -> bool:
        """Whether ``d``'s memory, over the whole step, holds what placing ``v`` there adds (:meth:`_allocations`).

        Always true where ``v``'s colocation group lives on ``d`` already: its
        reservations there start no later than what ``v`` takes.
        """
        unit = self.unit_of[v]
        if self.unit_device[unit] == d:
            return True
        # Most checks are settled by the most placing v could add (its unit, a copy of every input; a
        # group's copies are in its reservations), without listing what it adds.
        if self.memory.surely_fits(d, self.unit_need[unit] + (0.0 if self.grouped[unit] else self.copy_need[v])):
            return True
        return self.memory.fits(d, self._allocations(v, d, estimate))

    def best_device(self, v: int, devices: list[int] | None = None, key: int = 1,
                    cache: dict | None = None) -> tuple[int, tuple]:
        """The device (among ``devices``, default :meth:`devices_for`) where ``v`` finishes earliest.

        A device is passed over when its memory cannot hold ``v`` with the
        copies of inputs placing it there would create (:meth:`holds`).
        ``key=0`` picks the earliest start instead (ETF). Ties go to the lowest device index.
        ``cache`` keeps estimates by (node, device) for as long as that device's version holds.
        A device whose bound (:meth:`arrives_by`, plus ``v``'s time there for the finish) is no
        earlier than the best so far cannot win, and is not estimated.
        """
        candidates = self.devices_for(v) if devices is None else devices
        # No candidate at all: :meth:`may_take` found no room, unless no device is linked to the unit's placed
        # neighbours (a node's kinds and group are checked up front).
        best_d, best, reached = -1, None, not candidates and any(self.unit_ok[self.unit_of[v]])
        for d in candidates:
            if best is not None and self.arrives_by(v, d) + (self.dur[v][d] if key else 0.0) >= best[key]:
                continue
            est = self.estimate(v, d) if cache is None else self.cached_estimate(v, d, cache)
            if est[0] == float("inf"):
                continue        # no channel brings an input to d
            reached = True
            if not self.holds(v, d, est):
                continue
            if best is None or est[key] < best[key]:
                best_d, best = d, est
        if best is None:
            raise (InfeasibleError(f"node {self.graph.ids[v]!r} fits no device's remaining memory") if reached
                   else self.unreached(v))
        return best_d, best

    def unreached(self, v: int) -> InfeasibleError:
        """The error where no device ``v`` may use has the channels its edges to placed units need, naming
        one missing link: on its colocation group's device where an earlier member placed the group."""
        unit, names = self.unit_of[v], [d.name for d in self.cluster.devices]
        fixed, members = self.unit_device[unit], self.units[unit]
        placed = np.asarray(self.unit_device)[np.asarray(self.unit_of)]     # each node's unit's device
        placed[members] = -1
        kinds = schedule_tables(self.graph, self.cluster).unit_ok[unit]
        devices = [fixed] if fixed >= 0 else [d for d, ok in enumerate(kinds) if ok]
        linked = linked_devices(self.graph, self.cluster.linked, placed, members)
        d = next((d for d in devices if not linked[d]), devices[0])     # else missing_link raises: a bug
        why = missing_link(self.graph, self.cluster, placed, members, d)
        if fixed < 0:
            return InfeasibleError(f"node {self.graph.ids[v]!r}: no device it may use is linked to its neighbours' "
                                   f"devices, as on {names[d]!r}: {why}")
        return InfeasibleError(f"node {self.graph.ids[v]!r} must join its colocation group on {names[fixed]!r} "
                               f"(an earlier member's device): {why}")

    # ------------------------------------------------------------ booking
    def commit(self, v: int, d: int, estimate: tuple) -> None:
        """Book node ``v`` on device ``d`` with the figures :meth:`estimate` gave."""
        begin, end, (block, index), bookings = estimate
        for c, s, f, k in sorted(bookings, key=lambda booking: booking[1]):
            u, t, _ = self.inputs[v][k]
            self._book_transfer(u, t, d, c, s, f)
        self.devices[d].book(begin, block, index, end - begin, v)
        self.device_of[v] = d
        self.start[v] = begin
        self.finish[v] = end
        for time, amount in self._allocations(v, d, estimate):
            self.memory.add(d, time, amount)
        unit = self.unit_of[v]
        if self.unit_links is not None and self.unit_device[unit] < 0:
            self.unit_device[unit], self.unit_bits[unit] = d, 1 << d
            self.narrow_neighbours(unit)
        self.unit_device[unit] = d
        for key, (_, amount) in self.copies(v, d, bookings).items():
            self.budgeted.add(key)
            self.copies_held[key[0]].append((d, amount))
        if self.grouped[unit]:
            self._claim(v, d, begin, end, bookings)
        for _, _, f, k in bookings:
            u = self.inputs[v][k][0]
            self.sent_until[u] = max(self.sent_until[u], f)
        for u in {u for u, _, _ in self.inputs[v]} | ({v} if self.consumers_left[v] == 0 else set()):
            if u != v:
                self.consumers_left[u] -= 1
            if self.consumers_left[u] == 0:
                self._release(u)
        self.version[d] += 1
        self._send_ahead(v)

    def narrow_neighbours(self, unit: int) -> None:
        """Narrow the devices of the units not yet placed, from ``unit``'s (its own once placed), so that each
        keeps only devices where every neighbour has one to go to: a unit that sends to another needs a
        channel from its device to the other's (a tensor never goes through a third device).

        Each narrowed unit narrows its own neighbours in turn (arc consistency), so that a colocation group
        placed by its first member, or a producer of one of its members, is not left where a member's inputs
        cannot reach it: that dead end, met only at the later member, refused problems a plan existed for.
        Narrowing from a placed unit always applies; from one not yet placed, not where it would leave a unit
        no device: that unit cannot be placed whatever comes next, and is refused when placed next to its
        neighbour (:meth:`unreached` names the missing link).
        """
        work, n_dev = [unit], self.cluster.num_devices
        while work:
            x = work.pop()
            bits, placed = self.unit_bits[x], self.unit_device[x] >= 0
            for others, reach in zip(self.unit_links[x], self.device_links):
                support = 0     # the devices linked to one of x's: from it to those x sends to, else to it
                for j in range(n_dev):
                    if bits >> j & 1:
                        support |= reach[j]
                for y in others:
                    was = self.unit_bits[y]
                    now = was & support
                    if now != was and self.unit_device[y] < 0 and (now or placed):
                        self.unit_bits[y] = now
                        self.unit_ok[y] = [now >> j & 1 == 1 for j in range(n_dev)]
                        if now:
                            work.append(y)

    def _book_transfer(self, u: int, t: int, d: int, c: int, begin: float, end: float) -> None:
        """Book the transfer of output ``t`` of ``u`` to device ``d`` on channel ``c`` over ``[begin, end)``."""
        self.booked[(u, t, d)] = (c, begin, end)
        self.input_sent.update((w, d) for w in self.readers[(u, t)])
        insort(self.sent_to.setdefault((u, c), []), (self.name_rank[d], t))
        if self.contention:
            channel = self.channels[c]
            if begin > channel.last[-1]:
                self.gap_bookings[c].append(begin - channel.last[-1])
            channel.book(*channel.find(begin, end - begin, insertion=True), end - begin)
            self.queues[c].add(self._queue_key(u, t, d), end)
            for receiver in self.receivers[c]:
                self.version[receiver] += 1

    def _send_ahead(self, u: int) -> None:
        """Book the transfers of ``u``'s outputs that ``sends`` names, as the reference model queues them at its finish.

        A copy sent ahead is budgeted on its device's memory once a consumer
        there uses it (:meth:`copies`); until then it only takes channel time.
        """
        sends = self.sends.get(u)
        if not sends:
            return
        home, rank = self.device_of[u], self.name_rank
        for t, d, nbytes in sorted(sends, key=lambda send: (rank[send[1]], send[0])):  # queue order
            c = self.channel_of[home][d]
            if d == home or c < 0 or (u, t, d) in self.booked or (u, t) not in self.readers:
                continue
            length = self.transfer_s(c, nbytes)
            begin = (self._channel_slot(c, self._queue_key(u, t, d), self.finish[u], length)
                     if self.contention else self.finish[u])
            self._book_transfer(u, t, d, c, begin, begin + length)
            self.sent_ahead.add((u, t, d))
            self.sent_until[u] = max(self.sent_until[u], begin + length)

    def _claim(self, v: int, d: int, begin: float, end: float, bookings: list) -> None:
        """Turn the reservations of ``v``'s colocation group for ``v`` into ``v``'s allocations on ``d``."""
        start, arrive = self.reserved_at
        self.memory.add(d, start[v], -(self.transient[v] + self.workspace[v]))
        self.memory.add(d, begin, self.transient[v] + self.workspace[v])
        self.memory.add(d, end, -self.workspace[v])
        sent = {self.inputs[v][k][:2]: s for _, s, _, k in bookings}
        incoming = self.incoming[self.unit_of[v]]
        for u, t, _ in self.inputs[v]:
            amount = incoming.pop((u, t), None)
            if amount is None:
                continue
            self.memory.add(d, arrive[u], -amount)
            copied_from = sent.get((u, t), self.booked[(u, t, d)][1] if (u, t, d) in self.sent_ahead else None)
            if copied_from is not None and (u, t, d) not in self.budgeted:      # else already on d: no new copy
                self.memory.add(d, copied_from, amount)
                self.budgeted.add((u, t, d))
                self.copies_held[u].append((d, amount))

    def _release(self, u: int) -> None:
        """Every consumer of ``u`` is booked: free its output and the copies of it when the reference model does.

        An output lives until its last consumer on its device has finished and
        its last transfer has ended; a copy, until its last consumer there has finished.
        """
        last: dict[int, float] = {}
        device_of, finish = self.device_of, self.finish
        for w in self.consumers[u]:
            d = device_of[w]
            last[d] = max(last.get(d, 0.0), finish[w])
        home = device_of[u]
        self.memory.add(home, max(finish[u], last.get(home, 0.0), self.sent_until[u]), -self.transient[u])
        self.version[home] += 1
        for device, amount in self.copies_held[u]:
            self.memory.add(device, last[device], -amount)
            self.version[device] += 1

    def schedule(self) -> Schedule:
        """The finished schedule (every node committed)."""
        return Schedule(np.asarray(self.device_of, dtype=np.int64),
                        [np.asarray(t.items(), dtype=np.int64) for t in self.devices],
                        np.asarray(self.start), np.asarray(self.finish), memory=self.memory,
                        transfers=dict(self.booked))


#: Share of a running time limit's remaining seconds that :func:`plan_from_schedule` may spend on
#: simulating earliest-ready dispatch.
DISPATCH_SHARE = 0.9
#: Schedules built again knowing the transfers of the best so far (:func:`refined_schedule`).
REFINEMENTS = 3
#: The share by which a schedule built again must shorten the step for another to be tried: most of
#: the gain comes from the first (bench/list_prediction.py), and each costs a whole schedule.
REFINE_GAIN = 0.02
#: Overflowing schedules in a row that do not cut the smallest excess so far by a tenth, before
#: :func:`schedule_with_memory_retries` gives up on the node-level placement.
STALE_SCHEDULES = 1
#: Overflowing schedules in a row at the first ratio that do not cut the smallest excess so far by a
#: tenth, before :func:`_retry` stops moving budgets there: a schedule at the liveness ratio costs a
#: fraction of one counting outputs whole (m-ETF on NASNet over ``4xcpu``: 5 s against 27 and 35 s).
REBUDGETS_AT_FIRST_RATIO = 3
#: The most a device's budget grows from one schedule to the next (:func:`rebudgeted`).
MOST_RAISE = 2.0
#: Where the fitting schedule's step is within this factor of the first schedule's (which
#: overflowed), memory cost the step little, and :func:`_search_budgets` does not run.
PRESSURE_COST = 1.25
#: A schedule at the liveness ratio that overflows no device by more than this share of its capacity
#: is built once again knowing the transfers its simulation ran, before the ratio gives way (:func:`_retry`).
RETIME_EXCESS = 0.1
#: Schedules :func:`_search_budgets` may build.
SEARCH_BUILDS = 24
#: Halvings of the ratio interval per way of scheduling in :func:`_search_budgets`.
SEARCH_HALVINGS = 3
#: From a way's smallest fitting ratio, :func:`_search_budgets` tries ratios this factor apart upwards,
#: up to :data:`SEARCH_CLIMBS` of them, while each is faster than the one below it.
SEARCH_CLIMB = 1.15
SEARCH_CLIMBS = 2


@gc_paused()     # its schedules book hundreds of thousands of tuples: placer.gcpause
def schedule_with_memory_retries(build: Callable[..., Schedule], graph: OpGraph,
                                 cluster: Cluster, name: str, ratio: float | None = None,
                                 tries: int = 16, pressed: Callable[..., Schedule] | None = None,
                                 refine: bool = True, dispatch: bool = False) -> Schedule:
    """Call ``build(graph, ratio, capacity_scale)`` until its schedule fits under the reference model.

    With ``refine``, the fitting schedule is then built again, knowing the
    transfers its simulation ran (``build(graph, ratio, capacity_scale,
    sends=...)``: :func:`refined_schedule`), while that makes the step shorter:
    the step of the plan :func:`plan_from_schedule` makes of it with ``dispatch``.

    Like :func:`~placer.algorithms.common.fitting_plan_with_retries`, but the
    reference simulation runs the schedule's own per-device order, since
    memory over time depends on it. :class:`ScheduleState` follows each
    device's memory over time (:class:`MemoryTimeline`), but it learns when
    an output is freed only once its last consumer is booked, so until then
    it counts the output as held for good: with a ``ratio`` of 1 (outputs,
    workspaces and copies counted whole) it is safe but pessimistic, and
    spreads work that would have fitted. So the first schedule counts them
    at the :func:`~placer.algorithms.common.liveness_ratio` (the share of the
    step's footprint live at the peak of a one-device run), unless ``ratio``
    is given. Where that schedule overflows (by no more than
    :data:`RETIME_EXCESS` of any device's capacity, it is first built once
    again at its ratio, told the transfers its simulation ran: a slight
    overflow may be the copies', which arrive at other times than the
    scheduler booked them), the budgets move (:func:`rebudgeted`): the
    devices it overflowed get a smaller share of their capacity, in
    proportion to the excess, and those it left room on a larger one, since
    the scheduler's count of a device is not the reference model's (the
    simulator's channels serve transfers first come, first served, which
    moves when copies arrive). The schedule is built again at the same ratio
    while that cuts the excess (:data:`REBUDGETS_AT_FIRST_RATIO` schedules
    without progress at most), then the ratio becomes 1, with every device's
    whole capacity. Where a schedule at ratio 1 still overflows, the budgets
    move in the same way. Where that leaves
    the scheduler too little room to place every node, the ratio shrinks by a
    fifth. Up to ``tries`` schedules.

    Where moving work only moves the excess (:data:`STALE_SCHEDULES`
    overflowing schedules without progress, a schedule whose devices' peaks
    sum to more than their capacities unless the cut before it shrank the
    excess, or ``tries`` spent), or where counting whole leaves no room for
    some node and the schedules at the first ratio held more than all the
    devices together, the copies
    of activations sent between devices are what overflows: the retries
    start again, as many, from the ratio reached, on the graph with every
    layer colocated (:func:`~placer.transform.colocate.colocate_layers`),
    whose schedules send only what one layer hands the next. ``build`` gets
    the graph to schedule; the schedule's nodes are the same.

    ``pressed`` (optional) is a scheduler's other way of ordering its nodes,
    one that holds less memory at once: where the schedules at the first
    ratio overflow, ``pressed`` schedules once at that ratio, with whole
    budgets, before the ratio becomes 1 (the overflow may be the order's,
    not the placement's); and where every
    retry above fails, the colocated-layer retries run again with
    ``pressed``, from the ratio reached.

    The first schedule that fits is seldom the fastest that does: counting
    outputs whole spreads work that would have fitted, and another way of
    scheduling (on the colocated layers, or ``pressed``) may fit with far less
    spread. So where the fitting schedule's step (refined) exceeds the first
    schedule's (which overflowed) by more than :data:`PRESSURE_COST`, the
    memory cost the step dearly, and :func:`_search_budgets` looks for the
    fastest fitting schedule over the ratio for every way of scheduling, with
    the time that the retries and the refinement left; one that is faster is
    refined in turn and kept.
    """
    built = 0

    def counted(maker: Callable[..., Schedule] | None) -> Callable[..., Schedule] | None:
        def build_and_count(*args, **kwargs) -> Schedule:
            nonlocal built
            built += 1
            return maker(*args, **kwargs)
        return None if maker is None else build_and_count

    build, pressed = counted(build), counted(pressed)
    if ratio is None:
        ratio = liveness_ratio(graph, cluster)
    loosest = ratio
    fit, failure, ratio, free_step = _retry(build, graph, graph, cluster, name, ratio, ratio >= 1.0, tries, pressed)
    failures = [failure]
    layered = None
    if fit is None:
        layered = colocate_layers(graph)
        if layered is not None:
            # The liveness ratio and whole counting were tried on the nodes: go on from the ratio reached.
            fit, failure, ratio, _ = _retry(build, layered, graph, cluster, name, ratio, True, tries)
            failures.append(failure)
    if fit is None and pressed is not None:
        fit, failure, _, _ = _retry(pressed, graph if layered is None else layered, graph, cluster, name, ratio, True,
                                    tries)
        failures.append(failure)
    if fit is None:
        raise min(failures, key=lambda excess_and_error: excess_and_error[0])[1]     # the closest to fitting

    def refined(chosen: _Fit) -> Schedule:
        if not refine:
            return chosen.sched
        return refined_schedule(chosen.build, graph, cluster, chosen.sched, chosen.ratio, chosen.scale, chosen.stage,
                                chosen.took_s, dispatch)

    sched = refined(fit)
    step = plan_simulation(graph, cluster, sched, dispatch).makespan_s
    if step > PRESSURE_COST * free_step:
        if layered is None:
            layered = colocate_layers(graph)
        ways = [(stage, maker) for stage in (layered, graph) if stage is not None
                for maker in (build, pressed) if maker is not None]
        found = _search_budgets(fit, step, ways, graph, cluster, loosest, dispatch, built)
        if found is not None:       # faster already; refining never slows a schedule
            sched = refined(found)
    return sched


def rank_ordered_with_memory_retries(schedule: Callable[..., Schedule], graph: OpGraph, cluster: Cluster, name: str,
                                     refine: bool = True, **options) -> Schedule:
    """:func:`schedule_with_memory_retries` for a scheduler that books by rank (HEFT, DPOS).

    ``schedule(graph, cluster, ratio, capacity_scale=..., earliest_first=..., sends=..., **options)``;
    its way of holding less memory at once (``pressed``) is booking by earliest start
    (:func:`earliest_start_priorities`).
    """
    def build(g: OpGraph, ratio: float, scale: np.ndarray, sends: dict | None = None,
              earliest_first: bool = False) -> Schedule:
        return schedule(g, cluster, ratio, capacity_scale=scale, earliest_first=earliest_first, sends=sends, **options)

    return schedule_with_memory_retries(build, graph, cluster, name, pressed=partial(build, earliest_first=True),
                                        refine=refine)


@dataclass
class _Fit:
    """A fitting schedule (simulated) and how it was built, so that it can be built again."""

    sched: Schedule
    build: Callable[..., Schedule]
    stage: OpGraph
    ratio: float
    scale: np.ndarray
    took_s: float


def _retry(build: Callable[..., Schedule], stage: OpGraph, graph: OpGraph,
           cluster: Cluster, name: str, ratio: float, counted_whole: bool, tries: int,
           pressed: Callable[..., Schedule] | None = None,
           ) -> tuple[_Fit | None, InfeasibleError, float, float]:
    """One stage of :func:`schedule_with_memory_retries` on ``stage`` (``graph``, or it with its layers colocated).

    Before outputs are counted whole, a schedule that overflows is built
    again at the same ratio with moved budgets while that makes progress,
    then once by ``pressed`` (if given) with whole budgets.
    Returns the fitting schedule (None if there is none); why the schedule closest to fitting failed,
    as its excess over the devices' capacities in bytes and the error to raise (the last build's
    failure, with an infinite excess, where no schedule was built); the ratio the retries reached;
    and the simulated step of the first schedule built (inf if none was).
    """
    scale = np.ones(cluster.num_devices)
    capacity = cluster.memory.astype(np.float64)
    error = InfeasibleError(f"{name}: no schedule tried")
    closest = np.inf
    on_layers = "" if stage is graph else " (its layers colocated)"
    least_excess, stale = np.inf, 0
    use_pressed = False
    first_step = np.inf
    # Whether every schedule at the first ratio held more than all devices together (None before the first).
    overfilled = None

    def count_whole() -> None:
        nonlocal use_pressed, ratio, counted_whole, scale, least_excess, stale
        use_pressed, ratio, counted_whole = False, 1.0, True
        scale, least_excess, stale = np.ones(cluster.num_devices), np.inf, 0

    for _ in range(tries):
        began = time.perf_counter()
        try:
            maker = pressed if use_pressed else build
            sched = maker(stage, ratio, scale)
        except InfeasibleError as exc:
            if np.isinf(closest):       # an overflow says more: how far from fitting
                error = InfeasibleError(f"{name}: {exc}")
            if not counted_whole and (use_pressed or np.any(scale != 1.0)):
                # Budgets moved at the first ratio left some node no room, or ``pressed`` did: go on as if the
                # schedule had overflowed without progress.
                if pressed is not None and not use_pressed:
                    use_pressed, scale = True, np.ones(cluster.num_devices)
                else:
                    count_whole()
                continue
            ratio /= 1.2
            if overfilled and np.all(scale == 1.0):
                # Counting outputs whole leaves no room for every node, and the first ratio's schedules
                # held more than the devices do together: on no bundled case did a smaller ratio then fit
                # on the nodes (NASNet over 4xcpu: 1.26x the cluster's memory at 0.345, 1.27x at 0.579
                # after builds at 1, 0.833 and 0.694 failed, 2 s each), so the layers are tried next.
                break
            continue
        result = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
        if np.isinf(first_step):
            first_step = result.makespan_s
        if not (result.fits or counted_whole) and np.all(result.peak_memory_bytes <= (1 + RETIME_EXCESS) * capacity):
            # A slight overflow may be the transfers': the scheduler books a copy when it places the
            # consumer, the reference model queues it as its producer ends, so copies arrive (and are held)
            # at other times. Told those transfers, the schedule may fit at the same ratio (DPOS on
            # Inception-v3 over 4 V100s, booking by earliest start: 0.08 GiB over, then fits at 486.0 ms,
            # where counting outputs whole spread the step to 593.5 ms).
            try:
                again = maker(stage, ratio, scale, sends=simulated_sends(result))
            except InfeasibleError:
                pass
            else:
                retimed = simulate(graph, cluster, again.device_of, again.orders, check=False)
                if retimed.fits:
                    sched, result = again, retimed
        if result.fits:
            sched.simulated = result
            return (_Fit(sched, maker, stage, ratio, scale, time.perf_counter() - began), (closest, error), ratio,
                    first_step)
        peak = result.peak_memory_bytes
        held_more = peak.sum() > capacity.sum()     # than all the devices together
        excess = float(np.maximum(peak - capacity, 0).sum())
        if excess < closest:
            j = int(np.argmax(peak - capacity))
            needs, has = shown_sizes(peak[j], capacity[j])
            closest, error = excess, InfeasibleError(
                f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}{on_layers}")
        progress = excess < 0.9 * least_excess
        # A new budget moves work, it sheds none: where the peaks sum to more than the devices hold and no
        # budget made this schedule's excess smaller (or none was made yet), the next would only move it
        # (ResNet-200 over 2xcpu, m-ETF: 10.4 + 6.7 GiB of 8 + 8, then 8.6 + 12.0 after a cut).
        moves_only = held_more and not (progress and np.isfinite(least_excess))
        least_excess, stale = (excess, 0) if progress else (least_excess, stale + 1)
        if not counted_whole:
            overfilled = held_more and overfilled is not False
            if not use_pressed and not moves_only and stale < REBUDGETS_AT_FIRST_RATIO:
                scale = rebudgeted(scale, peak, capacity, sched.memory_seen)
                continue
            if pressed is not None and not use_pressed:
                use_pressed, scale = True, np.ones(cluster.num_devices)
                continue
            count_whole()
            continue
        if moves_only or stale >= STALE_SCHEDULES:
            break
        scale = rebudgeted(scale, peak, capacity, sched.memory_seen)
    return None, (closest, error), ratio, first_step


def rebudgeted(scale: np.ndarray, peak: np.ndarray, capacity: np.ndarray, seen: np.ndarray | None) -> np.ndarray:
    """The budgets (shares of each device's capacity) for the next schedule, after one with ``scale`` overflowed.

    The scheduler's count of a device's memory is not the reference
    model's: it holds an output until its last consumer is booked, and books
    a copy when it books the reader, where the reference model sends it as
    its producer ends (the producer's device holds it the shorter, the
    reader's the longer). So each device's simulated ``peak`` calibrates its
    budget. A device that overflowed gets less, in proportion to its excess;
    where every cut budget would still hold the most the scheduler counted
    there (``seen``: :attr:`Schedule.memory_seen`), each booking would pass
    its memory check again and the same schedule would come back, so those
    are cut from that count instead. A device that held less than 95% of its
    capacity gets more, by the square root of its headroom (more work there
    raises its peak), at most :data:`MOST_RAISE` times as much, so that the work moved off the others has somewhere to
    go where the count was full but the memory was not (DPOS on NASNet over
    ``4xcpu`` at ratio 0.694: cpu0 counted full, 3.8 of its 8 GiB held under
    the reference model, cpu3 8.4).
    """
    over = peak > capacity
    headroom = 0.95 * capacity / np.maximum(peak, 1.0)
    cut = scale[over] * headroom[over]
    if seen is not None:
        counted = seen[over] / capacity[over]
        if np.all(cut >= counted):
            cut = counted * headroom[over]
    new = scale * np.clip(np.sqrt(headroom), 1.0, MOST_RAISE)
    new[over] = cut
    return new


def _search_budgets(fit: _Fit, step: float, ways: list[tuple[OpGraph, Callable[..., Schedule]]], graph: OpGraph,
                    cluster: Cluster, low: float, dispatch: bool, spent_builds: int) -> _Fit | None:
    """The fastest fitting schedule that a way of scheduling builds over the ratio, where its step is below ``step``.

    ``fit`` is the retries' fitting schedule, whose budgets need not be built again.

    For each ``(stage, build)`` of ``ways``, the ratio (every device's
    whole capacity) is halved between ``low``, where budgets are loosest,
    and 1: a schedule that overflows raises the lower end, one that fits or
    that finds no device with room for some node (InfeasibleError) lowers the
    upper end, since a smaller ratio leaves work less spread. The step is not
    monotone in the ratio, though: budgets a notch tighter than the smallest
    that fits can spread the work better (Inception-v3 over ``2xcpu``, HEFT on
    the layers: 483.7 ms at the liveness ratio 0.44, 352.0 ms at 0.50), so once
    every way is halved, the search climbs from each way's smallest fitting
    ratio by :data:`SEARCH_CLIMB` while that is faster.
    Every schedule that fits competes by the step of its plan
    (:func:`plan_simulation`); None where none is below ``step``. Up to
    :data:`SEARCH_BUILDS` schedules, :data:`SEARCH_HALVINGS` halvings and
    :data:`SEARCH_CLIMBS` climbs per way. Optional work
    (:func:`~placer.algorithms.timebox.optional_work`) as a whole and each build
    in it, like :func:`refined_schedule`; within
    :func:`~placer.algorithms.timebox.frugal` (``auto``, Pesto's warm
    start), the search also builds no more schedules than ``spent_builds``,
    those the scheduler built so far, so that it at most doubles what the
    scheduler costs its caller.
    """
    best, best_step = None, step
    whole = np.ones(cluster.num_devices)       # every device's whole capacity
    took_s, builds = fit.took_s, 0
    most_builds = min(SEARCH_BUILDS, spent_builds) if is_frugal() else SEARCH_BUILDS
    # Outcomes by (stage, build, ratio), the stages and builds being the very objects of ``ways``. The
    # retries' first schedules, at the loosest ratio on the nodes, did not fit (else no search); theirs did.
    known: dict[tuple[int, int, float], str] = {(id(graph), id(build), low): "overflows" for _, build in ways
                                                if low < 1.0}
    steps: dict[tuple[int, int, float], float] = {}     # the plan's step of each schedule that fits
    if np.all(fit.scale == 1.0):
        known[id(fit.stage), id(fit.build), fit.ratio] = "fits"
        steps[id(fit.stage), id(fit.build), fit.ratio] = step     # refined: a climb from it must beat that

    def probe(stage: OpGraph, build: Callable[..., Schedule], ratio: float) -> str | None:
        """``"fits"``, ``"overflows"``, ``"infeasible"``; None where the search must stop."""
        nonlocal best, best_step, took_s, builds
        key = (id(stage), id(build), ratio)
        if key in known:
            return known[key]
        box = optional_work(took_s) if builds < most_builds else None
        if box is None:
            return None
        builds += 1
        began = time.perf_counter()
        with box:
            try:
                sched = build(stage, ratio, whole)
            except InfeasibleError:
                outcome = "infeasible"
            else:
                sched.simulated = simulate(graph, cluster, sched.device_of, sched.orders, check=False)
                outcome = "fits" if sched.simulated.fits else "overflows"
                if outcome == "fits":
                    its_step = plan_simulation(graph, cluster, sched, dispatch).makespan_s
        took_s = time.perf_counter() - began
        if box.expired:
            return None
        if outcome == "fits":
            steps[key] = its_step
            if its_step < best_step:
                best, best_step = _Fit(sched, build, stage, ratio, whole, took_s), its_step
        known[key] = outcome
        return outcome

    def halve(stage: OpGraph, build: Callable[..., Schedule]) -> bool:
        """Halve the way's ratio interval; False where the search must stop."""
        lo, hi = low, 1.0
        for ratio in (lo, hi):
            outcome = probe(stage, build, ratio)
            if outcome != "overflows":
                break
        if outcome is None:
            return False
        if ratio == lo or outcome == "overflows":
            return True     # the loosest budgets fit or leave no room, or the tightest overflow: nothing between
        for _ in range(SEARCH_HALVINGS):
            mid = (lo + hi) / 2
            outcome = probe(stage, build, mid)
            if outcome is None:
                return False
            lo, hi = (mid, hi) if outcome == "overflows" else (lo, mid)
        return True

    def climb(stage: OpGraph, build: Callable[..., Schedule]) -> bool:
        """Climb from the way's smallest fitting ratio while faster; False where the search must stop."""
        fitting = [ratio for s, b, ratio in steps if s == id(stage) and b == id(build)]
        if not fitting:
            return True
        ratio = min(fitting)
        for _ in range(SEARCH_CLIMBS):
            above = ratio * SEARCH_CLIMB
            if above >= 1.0:
                return True
            outcome = probe(stage, build, above)
            if outcome is None:
                return False
            if outcome != "fits" or steps[id(stage), id(build), above] >= steps[id(stage), id(build), ratio]:
                return True
            ratio = above
        return True

    def search() -> None:
        # Every way's halvings first: the climbs, which seldom pay as much, get what is left.
        for part in (halve, climb):
            for stage, build in ways:
                if not part(stage, build):
                    return

    # The whole search is optional work too, so that a running time limit leaves room to refine.
    box = optional_work(took_s)
    if box is not None:
        with box:
            search()
    return best


def refined_schedule(build: Callable[..., Schedule], graph: OpGraph, cluster: Cluster, sched: Schedule,
                     ratio: float, scale: np.ndarray, stage: OpGraph | None = None, took_s: float = 0.0,
                     dispatch: bool = False) -> Schedule:
    """``sched``, or a faster fitting schedule that ``build`` makes knowing what ``sched`` sends.

    A list scheduler books a transfer when it places the consumer; the
    reference model queues it at its producer's finish, so a transfer booked
    late can go ahead of those booked earlier and delay them. Knowing the
    transfers the simulation of ``sched`` ran, the next schedule books
    each as soon as its producer is booked (:class:`ScheduleState`'s
    ``sends``), where the channel's queue puts it. Kept where the step gets
    shorter, and tried again while it gets shorter by :data:`REFINE_GAIN`,
    up to :data:`REFINEMENTS` times. Optional work (:func:`~placer.algorithms.timebox.optional_work`):
    a try cut short by a running time limit is dropped.

    Parameters
    ----------
    build : callable
        ``build(stage, ratio, scale, sends=...)``, as :func:`schedule_with_memory_retries` calls it.
    graph, cluster
    sched : Schedule
        A schedule of ``graph`` with its reference simulation (``sched.simulated``), which fits.
    ratio, scale
        The memory ratio and capacity scale ``sched`` was built with.
    stage : OpGraph, optional
        The graph ``build`` schedules (``graph``, or it with its layers colocated); default ``graph``.
    took_s : float
        Seconds ``sched`` took to build and simulate.
    dispatch : bool
        Compare schedules by the step of the plan :func:`plan_from_schedule` makes with
        ``dispatch`` (:func:`plan_simulation`), not by their own order's.

    Returns
    -------
    Schedule
        The fastest schedule tried, with its simulation.
    """
    best = sched
    for _ in range(REFINEMENTS):
        box = optional_work(took_s)
        if box is None:
            break
        began = time.perf_counter()
        with box:
            step = plan_simulation(graph, cluster, best, dispatch).makespan_s
            try:
                again = build(graph if stage is None else stage, ratio, scale, sends=simulated_sends(best.simulated))
            except InfeasibleError:
                break
            again.simulated = simulate(graph, cluster, again.device_of, again.orders, check=False)
            if again.simulated.fits:
                new_step = plan_simulation(graph, cluster, again, dispatch).makespan_s
        took_s = time.perf_counter() - began
        if box.expired or not again.simulated.fits or new_step >= step:
            break
        best = again
        if new_step > (1 - REFINE_GAIN) * step:
            break
    return best


def plan_simulation(graph: OpGraph, cluster: Cluster, sched: Schedule, dispatch: bool) -> SimResult:
    """The reference simulation of the plan :func:`plan_from_schedule` makes of ``sched`` (simulated).

    Its own order's; with ``dispatch``, the earliest-ready dispatch of its
    placement where that fits and is faster (simulated once, kept in ``sched.dispatched``).
    """
    if not dispatch:
        return sched.simulated
    if sched.dispatched is None:
        sched.dispatched = simulate(graph, cluster, sched.device_of, check=False)
    faster = sched.dispatched.fits and sched.dispatched.makespan_s < sched.simulated.makespan_s
    return sched.dispatched if faster else sched.simulated


def plan_from_schedule(graph: OpGraph, cluster: Cluster, sched: Schedule, *, dispatch: bool = False,
                       **kwargs) -> Plan:
    """A plan with the schedule's placement and per-device order.

    With ``dispatch``, the order is instead the one the reference model's
    earliest-ready dispatch gives the placement (FORMATS.md, rule 2: no
    order), where that fits and is faster: for placers whose output is a
    placement that the framework then runs (Baechi's), as Celeritas keeps
    the faster of its own order and that one. A schedule's order can lose to
    it where transfers queue on a channel: the channel serves them first
    come, first served, not in the order the schedule booked them.
    """
    orders = sched.orders
    if dispatch:
        if sched.simulated is None:
            sched.simulated = simulate(graph, cluster, sched.device_of, orders, check=False)
        # Optional: where a time limit is running, it must not cost the plan in hand.
        left = seconds_left()
        with TimeBox(None if left is None else DISPATCH_SHARE * left) as box:
            run = plan_simulation(graph, cluster, sched, dispatch)
        if not box.expired and run is sched.dispatched:
            orders = run.device_orders()
    return Plan.from_arrays(graph, cluster, sched.device_of, orders, **kwargs)


def simulated_sends(result: SimResult) -> dict[int, list[tuple[int, int, int]]]:
    """The transfers of a simulated step as :class:`ScheduleState`'s ``sends``: per producer, (tensor, device, bytes)."""
    sent = result.transfers
    sends: dict[int, list[tuple[int, int, int]]] = {}
    for u, t, d, b in zip(sent.producer.tolist(), sent.tensor.tolist(), sent.dst_device.tolist(), sent.nbytes.tolist()):
        sends.setdefault(u, []).append((t, d, b))
    return sends
