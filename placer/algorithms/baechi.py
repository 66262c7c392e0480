"""Baechi's memory-constrained placers: m-TOPO, m-ETF and m-SCT.

Jeon et al., "Baechi: fast device placement of machine learning graphs",
ACM SoCC 2020, Section 4, and its public code. All three place colocation
groups whole (the
first member scheduled fixes the group's device), never exceed a device's
memory budget, and emit the per-device order of their schedule.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import NamedTuple

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptionError
from ..graph import OpGraph
from ..plan import Plan
from ..transform.colocate import colocate_sole_consumers
from .list_scheduling.priorities import edge_transfer_times
from .list_scheduling.retries import schedule_with_memory_retries
from .list_scheduling.state import Estimate, Schedule, ScheduleState
from .list_scheduling.to_plan import plan_from_schedule
from .registry import register

__all__ = ["m_topo", "m_etf", "m_sct", "m_topo_schedule", "etf_schedule", "EtfScheduler", "favourite_children"]


#: Resolution (s) at which m-ETF compares start times: estimates of one time reached by sums in another
#: order differ in their last bits, and a heap key a few ulps high would lose a tie it should win.
TICK_S = 2.0**-40
# Where EtfScheduler.device_front found a device's first node (its heaps); a channel's index otherwise.
_STARTABLE, _WAITING = -2, -1
#: Seconds m-SCT's LP may take when the caller gives no time limit.
LP_TIME_LIMIT_S = 60.0


class _Crowd:
    """The nodes waiting on one device for one channel (m-ETF's crowd), in buckets that come due together."""

    __slots__ = ("buckets", "order", "gaps")

    def __init__(self, gaps: int):
        self.buckets: dict[float, _Bucket] = {}  # rel -> its bucket
        self.order: list[tuple[float, int, _Bucket]] = []  # the buckets not due: (rel, bucket serial, bucket)
        self.gaps = gaps  # the channel's count of bookings that left it idle when its buckets were last checked


class _Bucket:
    """A crowd's members whose inputs would arrive ``rel`` after the channel's last booking ends, by position."""

    __slots__ = ("channel", "rel", "serial", "members", "due", "entry", "alive", "shortest")

    def __init__(self, channel: int, rel: float, serial: int):
        self.channel, self.rel, self.serial = channel, rel, serial
        self.shortest = math.inf  # the shortest transfer on the channel of any member: what an idle span must hold
        # Heap of (position, node, membership serial, a key the node starts no sooner than).
        self.members: list[tuple[int, int, int, float]] = []
        self.due = False  # its key has reached the time the device frees: it competes by position
        self.entry = -1  # the position of its live entry among the device's due buckets
        self.alive = True


def _grouped(graph: OpGraph, coplace: bool) -> OpGraph:
    """The graph to schedule: with Baechi's co-placement where asked (same nodes and edges, more colocated)."""
    return (colocate_sole_consumers(graph) if coplace else None) or graph


def _position(graph: OpGraph) -> np.ndarray:
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    return position


def m_topo_schedule(
    graph: OpGraph,
    cluster: Cluster,
    ratio: float = 1.0,
    capacity_scale: np.ndarray | None = None,
    sends: dict | None = None,
) -> Schedule:
    """m-TOPO under a memory ratio: topological order, devices filled one after another.

    Each device's share is the total need (every unit's reservation) over the
    number of devices plus the largest unit's need (its memory when the
    devices' memories differ), times its budget (``capacity_scale``), capped
    at its budgeted capacity; what a device was given
    counts against its share whether or not it is freed later. A unit that the
    current device may not run, or that would take it past its share or its
    memory over time (with the copies of inputs that placing it there makes),
    goes to the next device that can, else to any device whose memory holds it
    (beyond its share).
    Every node starts as early as its device and inputs allow, in
    topological order on its device.
    """
    state = ScheduleState(graph, cluster, ratio, insertion=False, capacity_scale=capacity_scale, sends=sends)
    n_dev = cluster.num_devices
    memory = cluster.memory.astype(np.float64)
    total = float(sum(state.unit_need))
    share = np.full(n_dev, total / n_dev + max(state.unit_need, default=0.0))
    if np.unique(memory).size > 1:
        share = memory
    # A budget cut or raised by the memory retries moves the share with it.
    share = np.minimum(share * (1.0 if capacity_scale is None else capacity_scale), state.memory.capacity)
    given = np.zeros(n_dev)

    def takes(v: int, j: int, within_share: bool, estimates: dict) -> bool:
        """Whether device j may run v and hold it, with the input copies it needs there, within its share and memory."""
        if not state.unit_ok[state.unit_of[v]][j]:
            return False
        if j not in estimates:
            estimates[j] = state.estimate(v, j)
        if estimates[j].start == float("inf"):
            return False  # no channel brings an input to j
        if within_share and given[j] + state.need(v, j, estimates[j]) > share[j]:
            return False
        return state.holds(v, j, estimates[j])

    current = 0
    for v in graph.topological_order.tolist():
        d = state.unit_device[state.unit_of[v]]
        if d >= 0:
            estimate = state.estimate(v, d)
            if estimate.start == float("inf"):
                raise state.unreached(v)
            state.commit(v, d, estimate)
            continue
        estimates: dict[int, Estimate] = {}
        choices = (
            [(j, True) for j in range(current, n_dev)]
            + [(j, True) for j in range(current)]
            + [(j, False) for j in range(n_dev)]
        )
        d = next((j for j, within_share in choices if takes(v, j, within_share, estimates)), -1)
        if d < 0:  # memory, where some device it may use has its inputs brought to it; else the links
            reached = any(estimate.start != float("inf") for estimate in estimates.values())
            raise (
                InfeasibleError(f"node {graph.ids[v]!r} fits no device's remaining memory")
                if reached
                else state.unreached(v)
            )
        if state.unit_ok[state.unit_of[v]][current] and d > current:
            current = d
        given[d] += state.need(v, d, estimates[d])
        state.commit(v, d, estimates[d])
    sched = state.schedule()
    # Its share, not its memory over time, is what fills a device first: the retries read how much of
    # each device's budget the share used as what was counted there (Schedule.memory_seen).
    sched.budget_seen = np.minimum(given / np.maximum(share, 1.0), 1.0) * state.memory.capacity
    return sched


class _Bound(NamedTuple):
    """A time before which a node's inputs cannot all be on a device, learnt from another device that they
    would reach over the same channels (:meth:`~placer.algorithms.list_scheduling.ScheduleState.same_routes`).

    With ``channel`` -1 the bound is ``static``; otherwise it is the channel's last booking's end plus
    ``rel`` (the node waits in the channel's crowd, its shortest transfer there taking ``shortest``), for
    as long as no booking leaves the channel idle (``gaps``: the channel's count of those then).
    """

    static: float
    channel: int
    rel: float
    shortest: float
    gaps: int


class _DueMember(NamedTuple):
    """The first member of a device's due buckets by ``position``: the ``node`` and its ``bucket``."""

    position: int
    node: int
    bucket: _Bucket


class _CrowdSpot(NamedTuple):
    """Where a node's inputs reach a device last in a channel's crowd: the ``channel`` (-1 where they do
    not), ``rel`` after its last booking ends, its shortest transfer there taking ``shortest``."""

    channel: int
    rel: float
    shortest: float


_NO_CROWD = _CrowdSpot(-1, 0.0, 0.0)
_NO_BOUND = _Bound(0.0, -1, 0.0, 0.0, 0)


class EtfScheduler:
    """Earliest-time-first list scheduling within each device's memory (m-ETF), or m-SCT with favourite children.

    Repeatedly, among every ready node and every device that may take it,
    the pair with the smallest start time ``max(device free, data ready)``
    is booked (ties: lower topological position, then lower device index;
    start times are compared at :data:`TICK_S`, below float noise), where
    the device's memory holds it (:meth:`ScheduleState.holds
    <placer.algorithms.list_scheduling.ScheduleState.holds>`).

    With ``favourite`` (the favourite child of every node, -1 for none), a
    favourite child that becomes ready while its parent is still the last
    node on the parent's device, and that could start there as soon as the
    parent finishes and no later than on any other device, runs there next,
    ahead of every other node (m-SCT: the device waits for its favourite
    child; its "urgent" exception is not modelled).

    Rather than estimating every ready node on every device at each step,
    each device keeps its ready nodes in heaps keyed by a lower bound on
    their start there, and only the device whose first node (its *front*)
    comes first is looked at: that node is estimated, and booked if its
    estimate is its key, else put back with the estimate as its key. A
    booking changes the front of the devices it touches only, so a graph
    with hundreds of optimizer updates ready at once costs
    ``O(V log V * devices)`` rather than ``O(V * ready)``. Per device:

    - ``waiting``: nodes whose inputs arrive after the device frees, by that
      time (first keyed by :meth:`ScheduleState.arrives_by
      <placer.algorithms.list_scheduling.ScheduleState.arrives_by>`);
    - ``startable``: nodes that could start as soon as it frees, by position;
    - ``crowds``: per channel, nodes whose inputs come last on the channel,
      after every transfer booked there, by how long after the channel's last
      booking ends they would arrive (``rel``), in buckets of equal ``rel``
      (:class:`_Crowd`): each booking on the channel moves the whole crowd
      back without touching a heap, and a member is estimated again only
      when its turn comes;
    - ``held`` and ``held_for_room``: nodes its memory cannot take for now,
      back once memory is freed there, or once it has the room their unit
      needs.

    A key stays a lower bound because an estimate only grows as the schedule
    fills, but for two events, after which the nodes concerned are estimated
    again: a transfer booked after its channel's end, leaving it idle before
    (:meth:`check_crowd`), and an input sent to a device for another reader,
    which may arrive there sooner than a transfer of one's own. A node whose
    inputs would reach several devices over the same channels raises its key
    on all of them at one estimate (:class:`_Bound`). So the schedule is
    exactly ETF's; the tests compare it with a plain ETF that estimates every
    pair at each step.

    Build one per schedule and call :meth:`run` once.

    References
    ----------
    J.-J. Hwang, Y.-C. Chow, F. D. Anger, C.-Y. Lee, "Scheduling precedence
    graphs in systems with interprocessor communication times", SIAM J.
    Comput. 18(2), 1989 (ETF). C. Hanen, A. Munier, "An approximation
    algorithm for scheduling dependent tasks on m processors with small
    communication delays", Discrete Applied Mathematics 108(3), 2001 (SCT).
    Baechi (Jeon et al., SoCC 2020), Sections 4.2 and 4.3 (m-ETF, m-SCT).
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        ratio: float = 1.0,
        favourite: np.ndarray | None = None,
        capacity_scale: np.ndarray | None = None,
        sends: dict | None = None,
    ):
        self.graph = graph
        self.state = ScheduleState(graph, cluster, ratio, insertion=False, capacity_scale=capacity_scale, sends=sends)
        n, n_dev = graph.num_nodes, cluster.num_devices
        self.n, self.n_dev = n, n_dev
        self.position = _position(graph).tolist()
        self.pending = np.bincount(graph.dst, minlength=n).tolist()  # inputs not booked yet, per node
        # One entry per edge (parallel edges included) so that `pending` reaches zero; each node's in index order.
        ptr, _ = graph.out_edges
        successors, at = graph.dst[np.lexsort((graph.dst, graph.src))].tolist(), ptr.tolist()
        self.succ = [successors[at[v] : at[v + 1]] for v in range(n)]
        self.fav_parent = [-1] * n  # a node's favourite parent, until it is offered everywhere
        if favourite is not None:
            for u, v in enumerate(favourite.tolist()):
                if v >= 0:
                    self.fav_parent[v] = u
        self.cache: dict = {}  # ScheduleState.cached_estimate's
        self.arrives_after: dict[tuple[int, int], _Bound] = {}  # by (node, device)
        self.waiting: list[list[tuple[float, int, int]]] = [[] for _ in range(n_dev)]  # (key, position, node)
        self.startable: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]  # (position, node)
        self.crowds: list[dict[int, _Crowd]] = [{} for _ in range(n_dev)]  # per device, by channel
        self.crowd_serial: dict[tuple[int, int], int] = {}  # (node, device) -> serial of its live crowd membership
        # Per device, the crowds' buckets that came due, by their first member's position: (position, serial, bucket).
        self.due_buckets: list[list[tuple[int, int, _Bucket]]] = [[] for _ in range(n_dev)]
        self.serials = itertools.count()
        self.held: list[list[tuple[float, int, int, int]]] = [[] for _ in range(n_dev)]  # (key, position, node, device)
        self.held_used = [-np.inf] * n_dev  # the most memory in use when a node was held, per device
        # Nodes whose unit needs more room than a device has left, by that need: (need, key, position, node, device).
        self.held_for_room: list[list[tuple[float, float, int, int, int]]] = [[] for _ in range(n_dev)]
        # Each device's front (device_front's), recomputed only for the devices whose heaps or timeline changed.
        self.front: list[tuple[float, int, int, int, int] | None] = [None] * n_dev
        # When each device frees, as its front was found (its timeline is the same since).
        self.free_at = [0.0] * n_dev
        self.dirty: set[int] = set()  # the devices whose front must be found again

    # ------------------------------------------------------------ the main loop
    def run(self) -> Schedule:
        """Book every node; the finished schedule.

        Raises
        ------
        InfeasibleError
            If the ready nodes left fit no device's remaining memory, or no device they may use is
            linked to their neighbours' devices (the missing link named).
        """
        state, n, front, dirty = self.state, self.n, self.front, self.dirty
        device_front, device_of = self.device_front, state.device_of
        unit_of, unit_device = state.unit_of, state.unit_device
        for v in range(n):
            if self.pending[v] == 0:
                self.become_ready(v)
        done, stuck = 0, False
        while done < n:
            for d in dirty:
                front[d] = device_front(d)
            dirty.clear()
            # Ties: lower position, then lower device index (whichever heap the node waits in).
            fronts = [f for f in front if f is not None]
            if not fronts:
                self.unstick(stuck)
                stuck = True
                continue
            start, _, v, d, source = min(fronts)
            dirty.add(d)
            if source == _STARTABLE:
                heapq.heappop(self.startable[d])
            elif source == _WAITING:
                heapq.heappop(self.waiting[d])
            else:
                del self.crowd_serial[(v, d)]  # its bucket drops it when it comes first there
            if device_of[v] >= 0:
                continue  # booked already from another of its entries (a reader weighed again waits twice)
            if not self.may_wait_on(v, d):  # its group went elsewhere meanwhile, or a unit placed since narrowed it
                if self.fav_parent[v] >= 0:
                    self.offer_everywhere(v)
                continue
            fixed = unit_device[unit_of[v]]
            if not state.may_take(v, d):
                self.hold_for_room(v, d, start)
                continue
            bound, c = self.bound_on(v, d, start)
            if bound > start:
                self.lift(v, d, bound, c)  # the bound still holds: nothing came to d since
                continue
            est = state.cached_estimate(v, d, self.cache)
            if est.start == float("inf"):
                continue  # no channel brings an input to d
            if _tick(est.start) > start:
                self.put_back(v, d, est)
                continue
            if not state.holds(v, d, est):
                self.hold(v, d, start)
                continue
            state.commit(v, d, est)
            done += 1
            stuck = False
            self.booked(v, d, est, fixed)
        return state.schedule()

    def unstick(self, stuck: bool) -> None:
        """No device has a ready node in its heaps: weigh the held nodes again, or raise where that was done
        already (``stuck``) or no node is held."""
        waiting_nodes = [v for entries in self.held for _, _, v, _ in entries] + [
            v for entries in self.held_for_room for _, _, _, v, _ in entries
        ]
        if not waiting_nodes:  # the ready nodes left were dropped where no channel links a neighbour
            v = next(v for v in range(self.n) if self.pending[v] == 0 and self.state.device_of[v] < 0)
            raise self.state.unreached(v)
        if stuck:  # every node waiting was held for memory on a device its inputs reach
            raise InfeasibleError(f"node {self.graph.ids[min(waiting_nodes)]!r} fits no device's remaining memory")
        for j, entries in enumerate(self.held):  # what held them may have eased elsewhere: weigh them again
            self.release(entries)
            self.release_room(j, everything=True)

    def put_back(self, v: int, d: int, est: Estimate) -> None:
        """``v`` starts on ``d`` later than its key: back with its estimate as key, in a channel's crowd where
        its inputs come last there, and with that bound on the devices its inputs reach the same way."""
        c, rel, shortest = self.crowd_of(v, d, est)
        if c < 0:
            self.wait_on(d, (est.start, self.position[v], v))
        else:
            self.join_crowd(v, d, c, rel, _tick(est.start), shortest)
        # Where v's inputs would travel the very channels they take to d, they arrive no earlier.
        ready = max((booking.end for booking in est.bookings), default=0.0)
        gaps = len(self.state.gap_bookings[c]) if c >= 0 else 0
        for j in self.state.same_routes(v, d, est.bookings):
            self.arrives_after[(v, j)] = _Bound(_tick(ready), c, rel, shortest, gaps)
            if self.fronts_on(j, v):
                self.dirty.add(j)  # its front is v at a key the bound now lifts

    def booked(self, v: int, d: int, est: Estimate, fixed: int) -> None:
        """After ``v`` is booked on ``d`` (its unit's device was ``fixed`` before): call back the nodes whose
        keys it may have lowered or whose memory it may have freed, and make its successors ready."""
        state, position, pending, dirty = self.state, self.position, self.pending, self.dirty
        # Readers of an input now on d may have it sooner than by a transfer of their own (a copy of
        # fewer bytes, or sent earlier): those waiting for d weigh it again.
        inputs = state.inputs[v]
        for booking in est.bookings:
            u, t, _ = inputs[booking.input]
            for w in state.readers[(u, t)]:
                self.crowd_serial.pop((w, d), None)
                if pending[w] == 0 and state.device_of[w] < 0 and self.offered(w, d):
                    self.wait_on(d, (0.0, position[w], w))
        # Bookings on a channel move its crowds back: the devices they wait for are due again.
        channels = {booking.channel for booking in est.bookings} | {
            state.channel_of[d][send.device] for send in state.sends.get(v, ())
        }
        for c in channels:
            if c >= 0:
                dirty.update(j for j in state.receivers[c] if c in self.crowds[j])
        # Held nodes come back when what held them may have changed: v's colocation group
        # now lives on d (its parameters are in), or memory was freed.
        if fixed < 0 and state.grouped[state.unit_of[v]]:
            self.release(self.held[d])
            self.release_room(d, everything=True)
        held, held_used, held_for_room = self.held, self.held_used, self.held_for_room
        for j in range(self.n_dev):
            if self.fronts_on(j, v):
                dirty.add(j)
            if held[j] and state.memory.used[j] < held_used[j]:
                self.release(held[j])
                held_used[j] = -np.inf
            if held_for_room[j]:
                self.release_room(j)
        for w in self.succ[v]:
            pending[w] -= 1
            if pending[w] == 0:
                self.become_ready(w)

    # ------------------------------------------------------------ ready nodes
    def parent_device(self, v: int) -> int:
        """The device of v's favourite parent while that parent is still the last node there, else -1."""
        u = self.fav_parent[v]
        if u < 0:
            return -1
        state = self.state
        d = state.device_of[u]
        return d if d >= 0 and state.devices[d].last_item() == u else -1

    def become_ready(self, v: int) -> None:
        """``v``'s inputs are all booked: next on its favourite parent's device where m-SCT keeps it there,
        else on every device it may use."""
        home = self.parent_device(v)
        if home >= 0 and self.state.may_take(v, home) and self.starts_earliest_at(v, home):
            heapq.heappush(self.startable[home], (-1, v))  # next on its parent's device, before any other
            self.dirty.add(home)
        else:
            self.offer_everywhere(v)

    def starts_earliest_at(self, v: int, home: int) -> bool:
        """Whether ``v`` could start on ``home`` when its favourite parent ends there, and nowhere sooner.

        Nowhere sooner follows: no device has an input before its producer ends.
        """
        return self.state.estimate(v, home).start <= self.state.finish[self.fav_parent[v]]

    def offer_everywhere(self, v: int) -> None:
        """Put ``v`` in the heap of every device it may use, keyed by when its inputs can be there at the earliest."""
        self.fav_parent[v] = -1
        state, pos = self.state, self.position[v]
        for d in range(self.n_dev):
            if self.may_wait_on(v, d):
                self.wait_on(d, (state.arrives_by(v, d), pos, v))

    def may_wait_on(self, v: int, d: int) -> bool:
        """Whether ``v`` may wait on device ``d`` (its unit's device, or a kind it may use)."""
        state = self.state
        unit = state.unit_of[v]
        fixed = state.unit_device[unit]
        return fixed == d if fixed >= 0 else state.unit_ok[unit][d]

    def offered(self, v: int, d: int) -> bool:
        """Whether ready node ``v`` waits on device ``d``: its favourite parent's, or any it may use."""
        if self.fav_parent[v] >= 0:
            return self.state.device_of[self.fav_parent[v]] == d
        return self.may_wait_on(v, d)

    def wait_on(self, d: int, entry: tuple[float, int, int]) -> None:
        """Put ``entry`` (a data-ready time, position, node) in ``d``'s waiting heap, its time ticked."""
        ready, pos, v = entry
        key = _tick(ready)
        heapq.heappush(self.waiting[d], (key, pos, v))
        first, free = self.front[d], self.free_at[d]
        if first is None:
            self.dirty.add(d)
            return
        # It could start at max(key, free) at the earliest: behind d's first node, it cannot come first there.
        earliest = key if key > free else free
        first_start, first_pos, _, _, _ = first
        if earliest < first_start or (earliest == first_start and pos < first_pos):
            self.dirty.add(d)

    def bound_on(self, v: int, d: int, key: float) -> tuple[float, int]:
        """The bound learnt for ``v`` on ``d`` (:class:`_Bound`) and its channel if it is above ``key`` and still
        holds, else ``(key, -1)``."""
        static, c, rel, _, gaps = self.arrives_after.get((v, d), _NO_BOUND)
        if c < 0:
            bound = static
        elif gaps != len(self.state.gap_bookings[c]):
            return key, -1
        else:
            bound = _tick(self.state.channels[c].last[-1] + rel)
        return (bound, c) if bound > key and not self.state.any_input_sent(v, d) else (key, -1)

    def lift(self, v: int, d: int, bound: float, c: int) -> None:
        """Put ``v`` back on ``d`` at a bound that holds: in channel ``c``'s crowd, or by ``bound`` (``c`` is -1)."""
        if c < 0:
            heapq.heappush(self.waiting[d], (bound, self.position[v], v))
        else:
            learnt = self.arrives_after[(v, d)]
            self.join_crowd(v, d, c, learnt.rel, bound, learnt.shortest)

    # ------------------------------------------------------------ memory
    def hold(self, v: int, d: int, key: float) -> None:
        """Set ``v`` aside on ``d`` until memory is freed there (a favourite child goes back to every device)."""
        if self.fav_parent[v] >= 0:
            self.offer_everywhere(v)
            return
        self.held[d].append((key, self.position[v], v, d))
        self.held_used[d] = max(self.held_used[d], float(self.state.memory.used[d]))

    def hold_for_room(self, v: int, d: int, key: float) -> None:
        """Set ``v`` aside on ``d`` until ``d`` has the room its unit needs (``ScheduleState.may_take``)."""
        if self.fav_parent[v] >= 0:
            self.offer_everywhere(v)
            return
        need = self.state.unit_need[self.state.unit_of[v]]
        heapq.heappush(self.held_for_room[d], (need, key, self.position[v], v, d))

    def release(self, entries: list) -> None:
        """Put held nodes back in their devices' heaps."""
        for key, pos, v, d in entries:
            self.wait_on(d, (key, pos, v))
        entries.clear()

    def release_room(self, d: int, everything: bool = False) -> None:
        """Put back the nodes held for room on ``d`` that have it now (``everything``: all of them)."""
        waiting_room, capacity, used = self.held_for_room[d], self.state.memory.limits[d], self.state.memory.used
        while waiting_room:
            need, key, pos, v, _ = waiting_room[0]
            if not (everything or used[d] + need <= capacity):
                break
            heapq.heappop(waiting_room)
            self.wait_on(d, (key, pos, v))

    # ------------------------------------------------------------ crowds
    def fronts_on(self, d: int, v: int) -> bool:
        """Whether ``v`` is device ``d``'s front."""
        first = self.front[d]
        if first is None:
            return False
        _, _, node, _, _ = first
        return node == v

    def channel_end(self, c: int) -> float:
        """When channel ``c``'s last booking ends."""
        return self.state.channels[c].last[-1]

    def crowd_of(self, v: int, d: int, est: Estimate) -> _CrowdSpot:
        """Where ``v``'s inputs reach ``d`` last in a channel's crowd (:class:`_CrowdSpot`), ``rel`` after its
        last booking ends (the estimate's start); ``_NO_CROWD`` where they do not.

        They do when the input that arrives last is sent after every transfer
        booked on its channel, right after ``v``'s other inputs on it, if any.
        Inputs already on ``d`` (sent there for another reader) do not keep
        ``v`` out: they are there at a time that bookings leave as it is (the
        key's floor, the estimate's start, covers it), and an input of its own
        sent there for another reader later calls ``v`` back (:meth:`booked`).
        """
        bookings = est.bookings
        if not bookings:
            return _NO_CROWD
        c, _, end, _ = max(bookings, key=lambda booking: booking.end)
        last = previous = self.channel_end(c)
        if last < 0 or _tick(end) != _tick(est.start):
            return _NO_CROWD
        shortest = math.inf
        for begin, finish in sorted((begin, finish) for channel, begin, finish, _ in bookings if channel == c):
            if _tick(begin) != _tick(previous):
                return _NO_CROWD
            previous, shortest = finish, min(shortest, finish - begin)
        return _CrowdSpot(c, _tick(end - last), shortest)  # rel ticked: crowds of equal lengths order by position

    def join_crowd(self, v: int, d: int, c: int, rel: float, key: float, shortest: float) -> None:
        """Put ``v`` in channel ``c``'s crowd on ``d``, ``rel`` after the channel's last booking and no sooner than
        ``key``, its shortest transfer on ``c`` taking ``shortest``."""
        crowd = self.crowds[d].get(c)
        if crowd is None or self.check_crowd(d, c):
            crowd = self.crowds[d][c] = _Crowd(len(self.state.gap_bookings[c]))
        bucket = crowd.buckets.get(rel)
        if bucket is None:
            bucket = crowd.buckets[rel] = _Bucket(c, rel, next(self.serials))
            heapq.heappush(crowd.order, (rel, bucket.serial, bucket))
        bucket.shortest = min(bucket.shortest, shortest)
        serial, pos = next(self.serials), self.position[v]
        self.crowd_serial[(v, d)] = serial
        heapq.heappush(bucket.members, (pos, v, serial, key))
        if bucket.due and pos < bucket.entry:
            bucket.entry = pos
            heapq.heappush(self.due_buckets[d], (pos, bucket.serial, bucket))
        self.dirty.add(d)

    def check_crowd(self, d: int, c: int) -> bool:
        """Disband the buckets of channel ``c``'s crowd on ``d`` that a booking leaving the channel idle since
        their keys were taken may bring forward; say whether that disbanded the whole crowd.

        A crowd's keys (the channel's last booking's end plus ``rel``) hold
        while no booking on the channel leaves it idle before it: the channel
        is then busy from before each member's turn in its queue to its end
        (a booking in an idle slot only fills it), so each member still goes
        after the last booking. A booking that leaves the channel idle before
        it may let a member's transfer start sooner, in that idle span: then
        the members of every bucket whose shortest transfer the span could
        hold go back among the startable, to be estimated again. The others
        still go after the last booking: each idle span left since is too
        short for any of their transfers.
        """
        crowd, gap_bookings = self.crowds[d][c], self.state.gap_bookings[c]
        if crowd.gaps == len(gap_bookings):
            return False
        # The margin covers rounding, as Timeline's does.
        widest = max(gap_bookings[crowd.gaps :]) + 1e-9
        crowd.gaps = len(gap_bookings)
        for rel, bucket in list(crowd.buckets.items()):
            if bucket.shortest > widest:
                continue
            bucket.alive = False
            del crowd.buckets[rel]
            for pos, v, serial, _ in bucket.members:
                if self.crowd_serial.get((v, d)) == serial:
                    del self.crowd_serial[(v, d)]
                    heapq.heappush(self.startable[d], (pos, v))
            self.dirty.add(d)
        if crowd.buckets:
            return False
        del self.crowds[d][c]
        return True

    def first_member(self, d: int, bucket: _Bucket) -> tuple[int, int, float] | None:
        """``(position, node, key)`` of ``bucket``'s first member still waiting in it, its key when it could
        start at the earliest: the channel's last booking's end plus the bucket's ``rel``, no sooner than the
        member's floor. None when no member is (the bucket is removed)."""
        members, crowd_serial, device_of = bucket.members, self.crowd_serial, self.state.device_of
        while members:
            pos, v, serial, floor = members[0]
            if crowd_serial.get((v, d)) == serial and device_of[v] < 0:
                return pos, v, max(_tick(self.channel_end(bucket.channel) + bucket.rel), floor)
            heapq.heappop(members)
        bucket.alive = False
        crowd = self.crowds[d][bucket.channel]
        del crowd.buckets[bucket.rel]
        if not crowd.buckets:
            del self.crowds[d][bucket.channel]
        return None

    def first_not_due(self, d: int, crowd: _Crowd) -> tuple[_Bucket, tuple[int, int, float]] | None:
        """``crowd``'s first bucket not due (smallest ``rel``) and its first member (:meth:`first_member`)."""
        order = crowd.order
        while order:
            _, _, bucket = order[0]
            first = self.first_member(d, bucket) if bucket.alive else None
            if first is not None:
                return bucket, first
            heapq.heappop(order)
        return None

    def come_due(self, d: int, free: float) -> None:
        """Move the buckets whose key has reached ``free`` (when ``d`` frees) among ``d``'s due buckets."""
        for crowd in list(self.crowds[d].values()):
            while (top := self.first_not_due(d, crowd)) is not None:
                bucket, (pos, _, key) = top
                if key > free:
                    break
                heapq.heappop(crowd.order)
                bucket.due, bucket.entry = True, pos
                heapq.heappush(self.due_buckets[d], (pos, bucket.serial, bucket))

    def first_due(self, d: int, free: float) -> _DueMember | None:
        """The first member of ``d``'s due buckets by position.

        A bucket that bookings on its channel (none leaving it idle) have moved
        past ``free`` goes back among its crowd's, whole, without an estimate:
        each booking on a channel would otherwise have every member that came
        due estimated again, k squared estimates for a crowd of k.
        """
        due = self.due_buckets[d]
        while due:
            pos, _, bucket = due[0]
            first = self.first_member(d, bucket) if bucket.alive and bucket.due and bucket.entry == pos else None
            if first is None:
                heapq.heappop(due)
                continue
            first_pos, v, key = first
            if first_pos != pos:  # its first member left: the bucket goes by its next one
                heapq.heapreplace(due, (first_pos, bucket.serial, bucket))
                bucket.entry = first_pos
            elif key > free:
                heapq.heappop(due)
                bucket.due = False
                heapq.heappush(self.crowds[d][bucket.channel].order, (bucket.rel, bucket.serial, bucket))
            else:
                return _DueMember(pos, v, bucket)
        return None

    # ------------------------------------------------------------ fronts
    def device_front(self, d: int) -> tuple[float, int, int, int, int] | None:
        """The first ready node on device ``d`` by its heap keys: ``(start, position, node, d, heap)``, where
        ``heap`` is the one it waits in (``_STARTABLE``, ``_WAITING`` or a channel's crowd). Plain tuples:
        made at every turn of the main loop, which takes the smallest.

        A node whose key is below a bound learnt from another device goes back with the bound as its
        key (as the main loop would do on popping it), so that the loop only sees keys that hold.
        """
        state = self.state
        device_of = state.device_of
        free = self.free_at[d] = _tick(max(0.0, state.devices[d].last[-1]))  # when its last booking ends
        wait, start, on_channels = self.waiting[d], self.startable[d], self.crowds[d]
        if on_channels:  # most devices, most of the time, have no crowd: none of this is needed
            for c in list(on_channels):
                self.check_crowd(d, c)
            self.come_due(d, free)
        best = None
        while True:
            while wait:
                key, pos, v = wait[0]
                if key > free and device_of[v] < 0:
                    break
                heapq.heappop(wait)
                if device_of[v] < 0:
                    heapq.heappush(start, (pos, v))
            while start:
                pos, v = start[0]
                if device_of[v] < 0:
                    break
                heapq.heappop(start)
            due = self.first_due(d, free) if self.due_buckets[d] else None
            # Startable nodes and due crowd members could all start when d frees: they go by position.
            if start and (due is None or pos <= due.position):
                bound, c = self.bound_on(v, d, free)
                if bound == free:
                    best = free, pos, v, d, _STARTABLE
                    break
                heapq.heappop(start)
                self.lift(v, d, bound, c)
                continue
            if due is not None:
                bound, c = self.bound_on(due.node, d, free)
                if bound == free:
                    best = free, due.position, due.node, d, due.bucket.channel
                    break
                del self.crowd_serial[(due.node, d)]
                self.lift(due.node, d, bound, c)
                continue
            if not wait:
                break
            key, pos, v = wait[0]
            bound, c = self.bound_on(v, d, key)
            if bound == key:
                best = key, pos, v, d, _WAITING
                break
            heapq.heappop(wait)
            self.lift(v, d, bound, c)
        if not on_channels:
            return best
        crowd_best = None
        for c, crowd in list(on_channels.items()):
            top = self.first_not_due(d, crowd)
            if top is not None:
                _, (pos, v, key) = top
                candidate = key, pos, v, d, c
                crowd_best = min(crowd_best, candidate) if crowd_best else candidate
        return min(best, crowd_best) if best and crowd_best else best or crowd_best


def etf_schedule(
    graph: OpGraph,
    cluster: Cluster,
    ratio: float = 1.0,
    favourite: np.ndarray | None = None,
    capacity_scale: np.ndarray | None = None,
    sends: dict | None = None,
) -> Schedule:
    """Earliest-time-first list scheduling (m-ETF), or m-SCT when ``favourite`` children are given.

    The schedule :class:`EtfScheduler` makes under memory ratio ``ratio``,
    per-device budgets ``capacity_scale`` and transfers booked ahead
    ``sends`` (as :class:`~placer.algorithms.list_scheduling.ScheduleState` takes them).

    Raises
    ------
    InfeasibleError
        If the ready nodes left fit no device's remaining memory, or no device they may use is
        linked to their neighbours' devices (the missing link named).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["a", "b", "c"], [1.0, 2.0, 2.0], [0, 0], [1, 2], [0, 0], [0, 1])
    >>> sched = etf_schedule(g, load_cluster("2xcpu"))     # c goes to cpu1: it starts there once its input arrives
    >>> sched.device_of.tolist(), sched.start.tolist()
    ([0, 0, 1], [0.0, 1.0, 1.000016])
    """
    return EtfScheduler(graph, cluster, ratio, favourite, capacity_scale, sends).run()


def _tick(t: float) -> float:
    """``t`` rounded down to a multiple of :data:`TICK_S` (infinity as it is)."""
    return t if t == math.inf else math.floor(t / TICK_S) * TICK_S


def favourite_children(
    graph: OpGraph, cluster: Cluster, theta: float = 0.1, time_limit: float | None = None
) -> np.ndarray:
    """m-SCT's favourite child of every node (-1 for none), from the LP relaxation of Baechi Sec. 4.3.

    Variables: ``x_e`` in [0, 1] per edge (1 = its transfer is paid), start
    times ``s_i >= 0`` and the makespan ``w``. Constraints:
    ``s_i + p_i + c_e x_e <= s_j`` per edge, ``sum_j x_ij >= outdeg(i) - 1``
    and ``sum_i x_ij >= indeg(j) - 1`` (at most one favourite child and one
    favourite parent), ``s_i + p_i <= w``; minimise ``w``. Times are means
    over the devices and device pairs. An edge is a pair of nodes, as in
    Baechi's graph: parallel edges (one node handing another several
    tensors) are one, which pays each tensor's transfer. An edge whose ``x_e`` rounds to 0
    (``x_e < theta``) may be a favourite; each node keeps the one with the
    smallest ``x_e`` whose child has no favourite parent yet. Solved with
    HiGHS (scipy); if it stops without a solution, no node has a favourite.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = graph.num_nodes
    favourite = np.full(n, -1, dtype=np.int64)
    if graph.num_edges == 0:
        return favourite
    dur = graph.durations(cluster)
    allowed = graph.allowed(cluster)
    p = np.where(allowed, dur, 0.0).sum(axis=1) / np.maximum(allowed.sum(axis=1), 1)
    # One transfer per tensor (the largest of its edges), summed per pair of nodes.
    tensors, tensor_of = np.unique(np.stack([graph.src, graph.dst, graph.edge_tensor]), axis=1, return_inverse=True)
    per_tensor = np.zeros(tensors.shape[1])
    np.maximum.at(per_tensor, tensor_of.reshape(-1), edge_transfer_times(graph, cluster, "mean"))
    pairs, pair_of = np.unique(tensors[:2], axis=1, return_inverse=True)
    src, dst = pairs
    m = src.size
    c = np.bincount(pair_of.reshape(-1), weights=per_tensor, minlength=m)
    # Variable layout: x_0..x_{m-1}, s_0..s_{n-1}, w.
    rows, cols, vals, rhs = [], [], [], []
    e = np.arange(m)
    rows += [e, e, e]
    cols += [e, m + src, m + dst]
    vals += [c, np.ones(m), -np.ones(m)]
    rhs.append(-p[src])
    row = m
    for ends in (src, dst):
        degree = np.bincount(ends, minlength=n)
        busy = np.flatnonzero(degree >= 2)
        row_of = np.full(n, -1)
        row_of[busy] = row + np.arange(busy.size)
        sel = np.flatnonzero(degree[ends] >= 2)
        rows.append(row_of[ends[sel]])
        cols.append(sel)
        vals.append(-np.ones(sel.size))
        rhs.append(-(degree[busy] - 1.0))
        row += busy.size
    sinks = np.flatnonzero(np.bincount(src, minlength=n) == 0)
    r = row + np.arange(sinks.size)
    rows += [r, r]
    cols += [m + sinks, np.full(sinks.size, m + n)]
    vals += [np.ones(sinks.size), -np.ones(sinks.size)]
    rhs.append(-p[sinks])
    row += sinks.size
    a_ub = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, m + n + 1)
    ).tocsr()
    objective = np.zeros(m + n + 1)
    objective[-1] = 1.0
    bounds = np.array([(0.0, 1.0)] * m + [(0.0, None)] * (n + 1), dtype=object)
    options = {} if time_limit is None else {"time_limit": float(time_limit)}
    result = linprog(
        objective, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds.tolist(), method="highs", options=options
    )
    if result.x is None:
        return favourite
    x = result.x[:m]
    candidate = np.flatnonzero(x < theta)
    has_parent = np.zeros(n, dtype=bool)
    # Smallest x first, ties by edge index: each node keeps its best favourite edge.
    for k in candidate[np.lexsort((candidate, x[candidate]))].tolist():
        u, v = int(src[k]), int(dst[k])
        if favourite[u] < 0 and not has_parent[v]:
            favourite[u] = v
            has_parent[v] = True
    return favourite


_REFERENCE = """
    References
    ----------
    B. Jeon, L. Cai, P. Srivastava, J. Jiang, X. Ke, Y. Meng, C. Xie, I. Gupta,
    "Baechi: fast device placement of machine learning graphs", ACM SoCC 2020,
    Section 4 ({section}).
"""


@register("m_topo")
def m_topo(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    refine: bool = True,
    coplace: bool = False,
) -> Plan:
    """Baechi's m-TOPO: topological order, each device filled to its memory share before the next.

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        Held by :func:`~placer.algorithms.place`; the refinement takes a share of what is left.
    refine : bool
        Schedule again knowing the transfers the last schedule sent, keeping what shortens the step
        (:func:`~placer.algorithms.list_scheduling.refined_schedule`); False: the paper's one pass.
    coplace : bool
        Place each operation whose outputs one operation reads with that operation (Baechi's
        co-placement, :func:`~placer.transform.colocate.colocate_sole_consumers`); off by default, as in
        Baechi's driver.

    Returns
    -------
    Plan
        Placement and each device's nodes in topological order, or the reference model's
        earliest-ready order where that fits and is faster (Baechi outputs a placement, which the
        framework runs; :func:`~placer.algorithms.list_scheduling.plan_from_schedule`).

    Raises
    ------
    InfeasibleError
        If a unit fits no device's remaining share or the result does not fit
        under the reference model.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> sorted(set(m_topo(training_graph(layers=2), load_cluster("2xV100-nvlink")).placement.values()))
    ['gpu0', 'gpu1']
    """
    sched = schedule_with_memory_retries(
        lambda g, ratio, scale, sends=None: m_topo_schedule(g, cluster, ratio, scale, sends),
        _grouped(graph, coplace),
        cluster,
        "m_topo",
        refine=refine,
        dispatch=True,
    )
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


@register("m_etf")
def m_etf(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    refine: bool = True,
    coplace: bool = False,
) -> Plan:
    """Baechi's m-ETF: earliest-time-first list scheduling within each device's memory.

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        Held by :func:`~placer.algorithms.place`; the refinement takes a share of what is left.
    refine : bool
        Schedule again knowing the transfers the last schedule sent, keeping what shortens the step
        (:func:`~placer.algorithms.list_scheduling.refined_schedule`); False: the paper's one pass.
    coplace : bool
        Baechi's co-placement first, as :func:`m_topo`.

    Returns
    -------
    Plan
        Placement and the per-device order of the ETF schedule, or the reference model's
        earliest-ready order where that fits and is faster (as :func:`m_topo`).

    Raises
    ------
    InfeasibleError
        If a node fits no device's remaining budget or the result does not
        fit under the reference model.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> len(m_etf(training_graph(layers=2), load_cluster("2xV100-nvlink")).placement)
    24
    """
    sched = schedule_with_memory_retries(
        lambda g, ratio, scale, sends=None: etf_schedule(g, cluster, ratio, capacity_scale=scale, sends=sends),
        _grouped(graph, coplace),
        cluster,
        "m_etf",
        refine=refine,
        dispatch=True,
    )
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


@register("m_sct")
def m_sct(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    theta: float = 0.1,
    refine: bool = True,
    coplace: bool = False,
) -> Plan:
    """Baechi's m-SCT: m-ETF that keeps each LP-chosen favourite child on its parent's device.

    Parameters
    ----------
    graph, cluster
    seed : ignored (deterministic)
    time_limit : float, optional
        Seconds for the whole call: the LP solver may take half of them (60 s
        when not given), the schedule the rest; if the solver stops without
        a solution the schedule is m-ETF's.
    theta : float
        Rounding threshold in (0, 1): an edge whose LP value is below it may
        be a favourite (Baechi's driver uses 0.1).
    refine : bool
        Schedule again knowing the transfers the last schedule sent, keeping what shortens the step
        (:func:`~placer.algorithms.list_scheduling.refined_schedule`); False: the paper's one pass.
    coplace : bool
        Baechi's co-placement first, as :func:`m_topo`.

    Returns
    -------
    Plan
        As :func:`m_etf`.

    Raises
    ------
    OptionError
        If ``theta`` is not in (0, 1).
    InfeasibleError
        As :func:`m_etf`.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> len(m_sct(training_graph(layers=2), load_cluster("2xV100-nvlink")).placement)
    24
    """
    if not 0 < theta < 1:
        raise OptionError(f"option theta of 'm_sct' must be in (0, 1), got {theta!r}")
    favourite = favourite_children(graph, cluster, theta, LP_TIME_LIMIT_S if time_limit is None else time_limit / 2)
    sched = schedule_with_memory_retries(
        lambda g, ratio, scale, sends=None: etf_schedule(g, cluster, ratio, favourite, scale, sends=sends),
        _grouped(graph, coplace),
        cluster,
        "m_sct",
        refine=refine,
        dispatch=True,
    )
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


m_topo.__doc__ += _REFERENCE.format(section="4.1, m-TOPO")
m_etf.__doc__ += _REFERENCE.format(section="4.2, m-ETF")
m_sct.__doc__ += _REFERENCE.format(section="4.3, m-SCT")
