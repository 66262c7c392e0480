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

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptionError
from ..graph import OpGraph
from ..plan import Plan
from ..transform.colocate import colocate_sole_consumers
from .list_scheduling import (Schedule, ScheduleState, edge_transfer_times, plan_from_schedule,
                              schedule_with_memory_retries)
from .registry import register

__all__ = ["m_topo", "m_etf", "m_sct", "m_topo_schedule", "etf_schedule", "favourite_children"]


#: Resolution (s) at which m-ETF compares start times: estimates of one time reached by sums in another
#: order differ in their last bits, and a heap key a few ulps high would lose a tie it should win.
TICK_S = 2.0 ** -40
# Where device_front found a device's first node (the heaps of etf_schedule); a channel's index otherwise.
_STARTABLE, _WAITING = -2, -1
#: Seconds m-SCT's LP may take when the caller gives no time limit.
LP_TIME_LIMIT_S = 60.0


class _Crowd:
    """The nodes waiting on one device for one channel (m-ETF's crowd), in buckets that come due together."""

    __slots__ = ("buckets", "order", "gaps")

    def __init__(self, gaps: int):
        self.buckets: dict[float, _Bucket] = {}    # rel -> its bucket
        self.order: list[tuple[float, int, _Bucket]] = []     # the buckets not due: (rel, bucket serial, bucket)
        self.gaps = gaps    # the channel's count of bookings that left it idle when its buckets were last checked


class _Bucket:
    """A crowd's members whose inputs would arrive ``rel`` after the channel's last booking ends, by position."""

    __slots__ = ("channel", "rel", "serial", "members", "due", "entry", "alive", "shortest")

    def __init__(self, channel: int, rel: float, serial: int):
        self.channel, self.rel, self.serial = channel, rel, serial
        self.shortest = math.inf    # the shortest transfer on the channel of any member: what an idle span must hold
        # Heap of (position, node, membership serial, a key the node starts no sooner than).
        self.members: list[tuple[int, int, int, float]] = []
        self.due = False        # its key has reached the time the device frees: it competes by position
        self.entry = -1         # the position of its live entry among the device's due buckets
        self.alive = True


def _grouped(graph: OpGraph, coplace: bool) -> OpGraph:
    """The graph to schedule: with Baechi's co-placement where asked (same nodes and edges, more colocated)."""
    return (colocate_sole_consumers(graph) if coplace else None) or graph


def _position(graph: OpGraph) -> np.ndarray:
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    return position


def m_topo_schedule(graph: OpGraph, cluster: Cluster, ratio: float = 1.0,
                    capacity_scale: np.ndarray | None = None, sends: dict | None = None) -> Schedule:
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
        if estimates[j][0] == float("inf"):
            return False        # no channel brings an input to j
        if within_share and given[j] + state.need(v, j, estimates[j]) > share[j]:
            return False
        return state.holds(v, j, estimates[j])

    current = 0
    for v in graph.topological_order.tolist():
        d = state.unit_device[state.unit_of[v]]
        if d >= 0:
            estimate = state.estimate(v, d)
            if estimate[0] == float("inf"):
                raise state.unreached(v)
            state.commit(v, d, estimate)
            continue
        estimates: dict[int, tuple] = {}
        choices = ([(j, True) for j in range(current, n_dev)] + [(j, True) for j in range(current)]
                   + [(j, False) for j in range(n_dev)])
        d = next((j for j, within_share in choices if takes(v, j, within_share, estimates)), -1)
        if d < 0:       # memory, where some device it may use has its inputs brought to it; else the links
            reached = any(estimate[0] != float("inf") for estimate in estimates.values())
            raise (InfeasibleError(f"node {graph.ids[v]!r} fits no device's remaining memory") if reached
                   else state.unreached(v))
        if state.unit_ok[state.unit_of[v]][current] and d > current:
            current = d
        given[d] += state.need(v, d, estimates[d])
        state.commit(v, d, estimates[d])
    sched = state.schedule()
    # Its share, not its memory over time, is what fills a device first: the retries read how much of
    # each device's budget the share used as what was counted there (Schedule.memory_seen).
    sched.budget_seen = np.minimum(given / np.maximum(share, 1.0), 1.0) * state.memory.capacity
    return sched


def etf_schedule(graph: OpGraph, cluster: Cluster, ratio: float = 1.0,
                 favourite: np.ndarray | None = None, capacity_scale: np.ndarray | None = None,
                 sends: dict | None = None) -> Schedule:
    """Earliest-time-first list scheduling (m-ETF), or m-SCT when ``favourite`` children are given.

    Repeatedly, among every ready node and every device that may take it,
    the pair with the smallest start time ``max(device free, data ready)``
    is scheduled (ties: lower topological index, then lower device index;
    start times are compared to :data:`TICK_S`, below float noise).

    With ``favourite`` (the favourite child of every node, -1 for none), a
    favourite child that becomes ready while its parent is still the last
    node on the parent's device, and that could start there as soon as the
    parent finishes and no later than on any other device, runs there next,
    ahead of every other node (Baechi's m-SCT: the device waits for its
    favourite child; its "urgent" exception is not modelled).

    Each device keeps its ready nodes in two heaps: those whose inputs would
    arrive after the device frees, by data-ready time, and those that could
    start as soon as it frees, by topological index. Booking a node then
    changes nothing for the other ready nodes, so wide graphs (a captured
    training step has hundreds of optimizer operations ready at once) cost
    O(V log V * devices) rather than O(V * ready). Heap keys are lower bounds
    (below); the winner is re-estimated before it is booked, and goes back
    with its new key when it grew. A node's first key on a device counts, for
    each input from another device, the shortest transfer it could take there
    (the channel's latency and the fewest bytes any copy of that tensor
    carries): keyed by its producers' finish alone, most nodes of a generated
    10k-node graph came first somewhere, were estimated and went back (18,653
    of 29,155 turns of the loop; 2.1 times the calls of a schedule now). Where many nodes wait for one channel
    (hundreds of optimizer steps whose state lives on another device), each
    booking on it pushes every other back by one transfer, and re-estimating
    all of them after each costs k squared estimates for a crowd of k. So a
    node sent back because its inputs come last on their channel, after every
    transfer booked there, waits in a heap of that channel's crowd on the
    device, keyed by how long after the channel's last booking ends its inputs
    would be there: a booking on the channel moves the whole crowd back
    without touching the heap, and each node is re-estimated only when its
    turn comes (NASNet over 8 H100s, where 93% of the re-estimates were of
    such nodes: a schedule in 12 s before, 4 s after). A crowd keeps its
    members in buckets of equal ``rel``, by position, which come due whole
    (their key reached the time the device frees, where they compete by
    position with the startable nodes) and go back whole when the next
    booking on their channel overtakes them, without an estimate (ResNet-152
    over ``2xcpu``: hundreds of step counts, each waiting for one transfer on
    a device faster than the channel, 308k estimates and 6.2 s a schedule
    when each was estimated again, 16.5k and 2.1 s when each went back alone,
    0.85 s by buckets). Keys are lower bounds because an
    estimate only grows as the schedule fills, but for two events, after which
    the nodes they concern are estimated again: a transfer booked after its
    channel's end, leaving it idle before, may let a crowd's transfer start
    sooner, where its turn in the queue now finds the channel idle
    (``check_crowd``); and an input sent to a device for another
    reader may arrive there sooner than a transfer of one's own would (a copy
    of fewer bytes: one tensor's edges in a captured graph may differ).
    So m-ETF is exact ETF (``plain_etf`` in the tests). A device whose memory
    cannot take a node for now holds it aside until memory is freed there; one
    whose unit needs more room than the device has left comes back once the
    device has that room, not at every free (NASNet with its layers colocated
    over 2 V100s: hundreds of large units were weighed again after every
    booking, 11 s to 0.7 s a schedule).

    On shared channels (one per source device: NVSwitch, PCIe, a host's NIC)
    a booking pushes back every ready node waiting for that channel on every
    device it reaches, and each would be re-estimated on each device. A node
    whose inputs reach several devices over the same channels needs the same
    transfers for each, so one re-estimate raises its key on all of them
    (:meth:`~placer.algorithms.list_scheduling.ScheduleState.same_routes`).

    Raises
    ------
    InfeasibleError
        If the ready nodes left fit no device's remaining memory, or no device they may use is
        linked to their neighbours' devices (the missing link named).
    """
    state = ScheduleState(graph, cluster, ratio, insertion=False, capacity_scale=capacity_scale, sends=sends)
    n, n_dev = graph.num_nodes, cluster.num_devices
    position = _position(graph).tolist()
    pending = np.bincount(graph.dst, minlength=n).tolist()
    # One entry per edge (parallel edges included) so that `pending` reaches zero; each node's in index order.
    # Sorted at once: a sort per node took a tenth of a schedule's setup.
    ptr, _ = graph.out_edges
    successors, at = graph.dst[np.lexsort((graph.dst, graph.src))].tolist(), ptr.tolist()
    succ = [successors[at[v]:at[v + 1]] for v in range(n)]
    fav_child = [-1] * n if favourite is None else favourite.tolist()
    fav_parent = [-1] * n
    for u, v in enumerate(fav_child):
        if v >= 0:
            fav_parent[v] = u
    cache: dict = {}
    # (node, device) -> a time before which the node's inputs cannot all be on the device,
    # learnt from another device that they would reach over the same channels.
    # The bound is `static`, or with a channel `c` (not -1) the channel's last booking's end plus `rel`
    # (the crowd, where the node's shortest transfer on it takes `shortest`), for as long as no booking
    # leaves the channel idle (`gaps`, its count of those then).
    arrives_after: dict[tuple[int, int], tuple[float, int, float, float, int]] = {}
    waiting: list[list[tuple[float, int, int]]] = [[] for _ in range(n_dev)]    # (data ready, position, node)
    startable: list[list[tuple[int, int]]] = [[] for _ in range(n_dev)]        # (position, node)
    # Per device and channel, nodes whose inputs come last in that channel's crowd, `rel` after its last
    # booking ends (and no sooner than a floor, where rounding put their estimate a tick above that).
    crowds: list[dict[int, _Crowd]] = [{} for _ in range(n_dev)]
    crowd_serial: dict[tuple[int, int], int] = {}   # (node, device) -> serial of its live crowd membership
    # Per device, the crowds' buckets that came due, by their first member's position: (position, serial, bucket).
    due_buckets: list[list[tuple[int, int, _Bucket]]] = [[] for _ in range(n_dev)]
    serials = itertools.count()
    held: list[list[tuple[float, int, int, int]]] = [[] for _ in range(n_dev)]  # waiting for memory
    held_used = [-np.inf] * n_dev       # the most memory in use when a node was held, per device
    # Nodes whose unit needs more room than a device has left, by that need: (need, key, position, node, device).
    held_for_room: list[list[tuple[float, float, int, int, int]]] = [[] for _ in range(n_dev)]
    # Each device's first node by its heap keys, recomputed only for devices whose heaps or timeline changed.
    front: list[tuple[float, int, int, int] | None] = [None] * n_dev
    free_at = [0.0] * n_dev     # when each device frees, as its front was found (its timeline is the same since)
    dirty: set[int] = set()

    def parent_device(v: int) -> int:
        """The device of v's favourite parent while that parent is still the last node there, else -1."""
        u = fav_parent[v]
        if u < 0:
            return -1
        d = state.device_of[u]
        return d if d >= 0 and state.devices[d].last_item() == u else -1

    def wait_on(d: int, entry: tuple[float, int, int]) -> None:
        ready, pos, v = entry
        key = _tick(ready)
        heapq.heappush(waiting[d], (key, pos, v))
        first = front[d]
        # It could start at max(key, free) at the earliest: behind d's first node, it cannot come first there.
        earliest = key if key > free_at[d] else free_at[d]
        if first is None or earliest < first[0] or (earliest == first[0] and pos < first[1]):
            dirty.add(d)

    def release(entries: list) -> None:
        """Put held nodes back in their devices' heaps."""
        for *key, d in entries:
            wait_on(d, tuple(key))
        entries.clear()

    def starts_earliest_at(v: int, home: int) -> bool:
        """Whether ``v`` could start on ``home`` when its favourite parent ends there, and nowhere sooner.

        Nowhere sooner follows: no device has an input before its producer ends.
        """
        return state.estimate(v, home)[0] <= state.finish[fav_parent[v]]

    def become_ready(v: int) -> None:
        home = parent_device(v)
        if home >= 0 and state.may_take(v, home) and starts_earliest_at(v, home):
            heapq.heappush(startable[home], (-1, v))    # next on its parent's device, before any other
            dirty.add(home)
        else:
            offer_everywhere(v)

    def offer_everywhere(v: int) -> None:
        """Put ``v`` in the heap of every device it may use, keyed by when its inputs can be there at the earliest."""
        fav_parent[v] = -1
        for d in range(n_dev):
            if may_wait_on(v, d):
                wait_on(d, (state.arrives_by(v, d), position[v], v))

    def channel_end(c: int) -> float:
        return state.channels[c].last[-1]

    def bound_on(v: int, d: int, key: float) -> tuple[float, int]:
        """The bound learnt for ``v`` on ``d`` and its channel if it is above ``key`` and still holds, else ``(key, -1)``."""
        static, c, rel, _, gaps = arrives_after.get((v, d), (0.0, -1, 0.0, 0.0, 0))
        if c >= 0 and gaps != len(state.gap_bookings[c]):
            return key, -1
        bound = static if c < 0 else _tick(channel_end(c) + rel)
        return (bound, c) if bound > key and not state.any_input_sent(v, d) else (key, -1)

    def may_wait_on(v: int, d: int) -> bool:
        """Whether ``v`` may wait on device ``d`` (its unit's device, or a kind it may use)."""
        fixed = state.unit_device[state.unit_of[v]]
        return fixed == d if fixed >= 0 else state.unit_ok[state.unit_of[v]][d]

    def offered(v: int, d: int) -> bool:
        """Whether ready node ``v`` waits on device ``d``: its favourite parent's, or any it may use."""
        if fav_parent[v] >= 0:
            return state.device_of[fav_parent[v]] == d
        return may_wait_on(v, d)

    def join_crowd(v: int, d: int, c: int, rel: float, key: float, shortest: float) -> None:
        """Put ``v`` in channel ``c``'s crowd on ``d``, ``rel`` after the channel's last booking and no sooner than
        ``key``, its shortest transfer on ``c`` taking ``shortest``."""
        crowd = crowds[d].get(c)
        if crowd is None or check_crowd(d, c):
            crowd = crowds[d][c] = _Crowd(len(state.gap_bookings[c]))
        bucket = crowd.buckets.get(rel)
        if bucket is None:
            bucket = crowd.buckets[rel] = _Bucket(c, rel, next(serials))
            heapq.heappush(crowd.order, (rel, bucket.serial, bucket))
        bucket.shortest = min(bucket.shortest, shortest)
        serial, pos = next(serials), position[v]
        crowd_serial[(v, d)] = serial
        heapq.heappush(bucket.members, (pos, v, serial, key))
        if bucket.due and pos < bucket.entry:
            bucket.entry = pos
            heapq.heappush(due_buckets[d], (pos, bucket.serial, bucket))
        dirty.add(d)

    def check_crowd(d: int, c: int) -> bool:
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
        short for any of their transfers. (A schedule told the transfers of
        the last one books each at its producer's finish, most after their
        channel's end: on the 30k-node graph of bench/scaling.py, disbanding
        every crowd at each of those estimated hundreds of optimizer updates,
        each waiting for its gradient, a hundred times over: 65k estimates
        against the first schedule's 39k, 42k now.)
        """
        crowd = crowds[d][c]
        if crowd.gaps == len(state.gap_bookings[c]):
            return False
        # The margin covers rounding, as Timeline's does.
        widest = max(state.gap_bookings[c][crowd.gaps:]) + 1e-9
        crowd.gaps = len(state.gap_bookings[c])
        for rel, bucket in list(crowd.buckets.items()):
            if bucket.shortest > widest:
                continue
            bucket.alive = False
            del crowd.buckets[rel]
            for pos, v, serial, _ in bucket.members:
                if crowd_serial.get((v, d)) == serial:
                    del crowd_serial[(v, d)]
                    heapq.heappush(startable[d], (pos, v))
            dirty.add(d)
        if crowd.buckets:
            return False
        del crowds[d][c]
        return True

    def crowd_key(c: int, rel: float, floor: float) -> float:
        """When a node in channel ``c``'s crowd, ``rel`` after its last booking and no sooner than ``floor``,
        could start at the earliest (its key for the main loop)."""
        return max(_tick(channel_end(c) + rel), floor)

    def first_member(d: int, bucket: _Bucket) -> tuple[int, int, float] | None:
        """``(position, node, key)`` of ``bucket``'s first member still waiting in it, its key where it would
        start at the earliest; None when none is (the bucket is removed)."""
        members = bucket.members
        while members:
            pos, v, serial, floor = members[0]
            if crowd_serial.get((v, d)) == serial and state.device_of[v] < 0:
                return pos, v, crowd_key(bucket.channel, bucket.rel, floor)
            heapq.heappop(members)
        bucket.alive = False
        crowd = crowds[d][bucket.channel]
        del crowd.buckets[bucket.rel]
        if not crowd.buckets:
            del crowds[d][bucket.channel]
        return None

    def first_not_due(d: int, crowd: _Crowd) -> tuple[_Bucket, tuple[int, int, float]] | None:
        """``crowd``'s first bucket not due (smallest ``rel``) and its first member (:func:`first_member`)."""
        order = crowd.order
        while order:
            bucket = order[0][2]
            first = first_member(d, bucket) if bucket.alive else None
            if first is not None:
                return bucket, first
            heapq.heappop(order)
        return None

    def come_due(d: int, free: float) -> None:
        """Move the buckets whose key has reached ``free`` (when ``d`` frees) among ``d``'s due buckets."""
        for crowd in list(crowds[d].values()):
            while (top := first_not_due(d, crowd)) is not None and top[1][2] <= free:
                bucket, (pos, _, _) = top
                heapq.heappop(crowd.order)
                bucket.due, bucket.entry = True, pos
                heapq.heappush(due_buckets[d], (pos, bucket.serial, bucket))

    def first_due(d: int, free: float) -> tuple[int, int, _Bucket] | None:
        """``(position, node, bucket)`` of the first member of ``d``'s due buckets by position.

        A bucket that bookings on its channel (none leaving it idle) have moved
        past ``free`` goes back among its crowd's, whole: without buckets, each
        booking on a channel would have every member that came due estimated
        again, k squared estimates for a crowd of k (hundreds of step counts,
        each waiting for one transfer, on a device faster than the channel:
        ResNet-152 over ``2xcpu``), and moving them back one by one was k
        squared heap moves (ResNet-200 over ``2xcpu``).
        """
        due = due_buckets[d]
        while due:
            pos, _, bucket = due[0]
            first = first_member(d, bucket) if bucket.alive and bucket.due and bucket.entry == pos else None
            if first is None:
                heapq.heappop(due)
            elif first[0] != pos:      # its first member left: the bucket goes by its next one
                heapq.heapreplace(due, (first[0], bucket.serial, bucket))
                bucket.entry = first[0]
            elif first[2] > free:
                heapq.heappop(due)
                bucket.due = False
                heapq.heappush(crowds[d][bucket.channel].order, (bucket.rel, bucket.serial, bucket))
            else:
                return pos, first[1], bucket
        return None

    def lift(v: int, d: int, bound: float, c: int) -> None:
        """Put ``v`` back on ``d`` at a bound that holds: in channel ``c``'s crowd, or by ``bound`` (``c`` is -1)."""
        if c < 0:
            heapq.heappush(waiting[d], (bound, position[v], v))
        else:
            _, _, rel, shortest, _ = arrives_after[(v, d)]
            join_crowd(v, d, c, rel, bound, shortest)

    def device_front(d: int) -> tuple[float, int, int, int] | None:
        """``(start, position, node, heap)`` of the first ready node on device ``d`` by its heap keys.

        ``heap`` is where it waits: ``_STARTABLE``, ``_WAITING`` or a channel's crowd.
        A node whose key is below a bound learnt from another device goes back with the bound as its
        key (as the main loop would do on popping it), so that the loop only sees keys that hold.
        """
        free = free_at[d] = _tick(max(0.0, state.devices[d].last[-1]))     # when its last booking ends
        wait, start, on_channels = waiting[d], startable[d], crowds[d]
        if on_channels:     # most devices, most of the time, have no crowd: none of this is needed
            for c in list(on_channels):
                check_crowd(d, c)
            come_due(d, free)
        best = None
        while True:
            while wait and (wait[0][0] <= free or state.device_of[wait[0][2]] >= 0):
                _, pos, v = heapq.heappop(wait)
                if state.device_of[v] < 0:
                    heapq.heappush(start, (pos, v))
            while start and state.device_of[start[0][1]] >= 0:
                heapq.heappop(start)
            due = first_due(d, free) if due_buckets[d] else None
            # Startable nodes and due crowd members could all start when d frees: they go by position.
            if start and (due is None or start[0][0] <= due[0]):
                pos, v = start[0]
                bound, c = bound_on(v, d, free)
                if bound == free:
                    best = free, pos, v, _STARTABLE
                    break
                heapq.heappop(start)
                lift(v, d, bound, c)
                continue
            if due is not None:
                pos, v, bucket = due
                bound, c = bound_on(v, d, free)
                if bound == free:
                    best = free, pos, v, bucket.channel
                    break
                del crowd_serial[(v, d)]
                lift(v, d, bound, c)
                continue
            if not wait:
                break
            key, pos, v = wait[0]
            bound, c = bound_on(v, d, key)
            if bound == key:
                best = key, pos, v, _WAITING
                break
            heapq.heappop(wait)
            lift(v, d, bound, c)
        if not on_channels:
            return best
        crowd_best = None
        for c, crowd in list(on_channels.items()):
            top = first_not_due(d, crowd)
            if top is not None:
                pos, v, key = top[1]
                crowd_best = min(crowd_best, (key, pos, v, c)) if crowd_best else (key, pos, v, c)
        return min(best, crowd_best) if best and crowd_best else best or crowd_best

    def crowd_of(v: int, d: int, est: tuple) -> tuple[int, float, float]:
        """``(channel, rel, shortest)`` where ``v``'s inputs reach ``d`` last in a channel's crowd, ``rel`` after
        its last booking ends (the estimate's start), its shortest transfer there taking ``shortest``;
        ``(-1, 0, 0)`` otherwise.

        They do when the input that arrives last is sent after every transfer
        booked on its channel, right after ``v``'s other inputs on it, if any.
        Inputs already on ``d`` (sent there for another reader) do not keep
        ``v`` out: they are there at a time that bookings leave as it is (the
        key's floor, the estimate's start, covers it), and an input of its own
        sent there for another reader later calls ``v`` back (the main loop).
        Kept out, Adam's divisions of Inception-v3 at batch 64 over ``2xcpu``,
        in a schedule told the last one's transfers, were each estimated again
        at every booking on their channel: the scalar all 292 read was sent
        ahead to their device (54.6k estimates, 12.4k now).
        """
        bookings = est[3]
        if not bookings:
            return -1, 0.0, 0.0
        c, _, end, _ = max(bookings, key=lambda booking: booking[2])
        last = previous = channel_end(c)
        if last < 0 or _tick(end) != _tick(est[0]):
            return -1, 0.0, 0.0
        shortest = math.inf
        for begin, finish in sorted((begin, finish) for channel, begin, finish, _ in bookings if channel == c):
            if _tick(begin) != _tick(previous):
                return -1, 0.0, 0.0
            previous, shortest = finish, min(shortest, finish - begin)
        return c, _tick(end - last), shortest     # rel ticked: crowds of equal lengths order by position

    def hold(v: int, d: int, key: float) -> None:
        """Set ``v`` aside on ``d`` until memory is freed there (a favourite child goes back to every device)."""
        if fav_parent[v] >= 0:
            offer_everywhere(v)
            return
        held[d].append((key, position[v], v, d))
        held_used[d] = max(held_used[d], float(state.memory.used[d]))

    def hold_for_room(v: int, d: int, key: float) -> None:
        """Set ``v`` aside on ``d`` until ``d`` has the room its unit needs (``ScheduleState.may_take``)."""
        if fav_parent[v] >= 0:
            offer_everywhere(v)
            return
        heapq.heappush(held_for_room[d], (state.unit_need[state.unit_of[v]], key, position[v], v, d))

    def release_room(d: int, everything: bool = False) -> None:
        """Put back the nodes held for room on ``d`` that have it now (``everything``: all of them)."""
        waiting_room, capacity = held_for_room[d], state.memory.limits[d]
        while waiting_room and (everything or state.memory.used[d] + waiting_room[0][0] <= capacity):
            _, *key, _ = heapq.heappop(waiting_room)
            wait_on(d, tuple(key))

    for v in range(n):
        if pending[v] == 0:
            become_ready(v)
    done, stuck = 0, False
    while done < n:
        for d in dirty:
            front[d] = device_front(d)
        dirty.clear()
        # Ties: lower position, then lower device index (whichever heap the node waits in).
        fronts = [(f[0], f[1], f[2], d, f[3]) for d, f in enumerate(front) if f is not None]
        if not fronts:
            waiting_nodes = ([entry[2] for entries in held for entry in entries]
                             + [entry[3] for entries in held_for_room for entry in entries])
            if not waiting_nodes:       # the ready nodes left were dropped where no channel links a neighbour
                v = next(v for v in range(n) if pending[v] == 0 and state.device_of[v] < 0)
                raise state.unreached(v)
            if stuck:       # every node waiting was held for memory on a device its inputs reach
                raise InfeasibleError(f"node {graph.ids[min(waiting_nodes)]!r} fits no device's remaining memory")
            for j, entries in enumerate(held):   # what held them may have eased elsewhere: weigh them again
                release(entries)
                release_room(j, everything=True)
            stuck = True
            continue
        start, _, v, d, source = min(fronts)
        dirty.add(d)
        if source == _STARTABLE:
            heapq.heappop(startable[d])
        elif source == _WAITING:
            heapq.heappop(waiting[d])
        else:
            del crowd_serial[(v, d)]     # its bucket drops it when it comes first there
        if state.device_of[v] >= 0:
            continue        # booked already from another of its entries (a reader weighed again waits twice)
        if not may_wait_on(v, d):   # its group went elsewhere meanwhile, or a unit placed since narrowed its devices
            if fav_parent[v] >= 0:
                offer_everywhere(v)
            continue
        fixed = state.unit_device[state.unit_of[v]]
        if not state.may_take(v, d):
            hold_for_room(v, d, start)
            continue
        bound, c = bound_on(v, d, start)
        if bound > start:
            lift(v, d, bound, c)     # the bound still holds: nothing came to d since
            continue
        est = state.cached_estimate(v, d, cache)
        if est[0] == float("inf"):
            continue        # no channel brings an input to d
        if _tick(est[0]) > start:
            c, rel, shortest = crowd_of(v, d, est)
            if c < 0:
                wait_on(d, (est[0], position[v], v))
            else:
                join_crowd(v, d, c, rel, _tick(est[0]), shortest)
            # Where v's inputs would travel the very channels they take to d, they arrive no earlier.
            ready = max((booking[2] for booking in est[3]), default=0.0)
            for j in state.same_routes(v, d, est[3]):
                arrives_after[(v, j)] = (_tick(ready), c, rel, shortest, len(state.gap_bookings[c]) if c >= 0 else 0)
                if front[j] is not None and front[j][2] == v:
                    dirty.add(j)    # its front is v at a key the bound now lifts
            continue
        if not state.holds(v, d, est):
            hold(v, d, start)
            continue
        state.commit(v, d, est)
        done += 1
        # Readers of an input now on d may have it sooner than by a transfer of their own (a copy of
        # fewer bytes, or sent earlier): those waiting for d weigh it again.
        for _, _, _, k in est[3]:
            for w in state.readers[state.inputs[v][k][:2]]:
                crowd_serial.pop((w, d), None)
                if pending[w] == 0 and state.device_of[w] < 0 and offered(w, d):
                    wait_on(d, (0.0, position[w], w))
        # Bookings on a channel move its crowds back: the devices they wait for are due again.
        for c in {booking[0] for booking in est[3]} | {state.channel_of[d][j] for _, j, _ in state.sends.get(v, ())}:
            if c >= 0:
                dirty.update(j for j in state.receivers[c] if c in crowds[j])
        stuck = False
        # Held nodes come back when what held them may have changed: v's colocation group
        # now lives on d (its parameters are in), or memory was freed.
        if fixed < 0 and state.grouped[state.unit_of[v]]:
            release(held[d])
            release_room(d, everything=True)
        for j, first in enumerate(front):
            if first is not None and first[2] == v:
                dirty.add(j)
            if held[j] and state.memory.used[j] < held_used[j]:
                release(held[j])
                held_used[j] = -np.inf
            if held_for_room[j]:
                release_room(j)
        for w in succ[v]:
            pending[w] -= 1
            if pending[w] == 0:
                become_ready(w)
    return state.schedule()


def _tick(t: float) -> float:
    """``t`` rounded down to a multiple of :data:`TICK_S` (infinity as it is)."""
    return t if t == math.inf else math.floor(t / TICK_S) * TICK_S


def favourite_children(graph: OpGraph, cluster: Cluster, theta: float = 0.1,
                       time_limit: float | None = None) -> np.ndarray:
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
    a_ub = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(row, m + n + 1)).tocsr()
    objective = np.zeros(m + n + 1)
    objective[-1] = 1.0
    bounds = np.array([(0.0, 1.0)] * m + [(0.0, None)] * (n + 1), dtype=object)
    options = {} if time_limit is None else {"time_limit": float(time_limit)}
    result = linprog(objective, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds.tolist(),
                     method="highs", options=options)
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
def m_topo(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
           refine: bool = True, coplace: bool = False) -> Plan:
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
        _grouped(graph, coplace), cluster, "m_topo", refine=refine, dispatch=True)
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


@register("m_etf")
def m_etf(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
          refine: bool = True, coplace: bool = False) -> Plan:
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
        _grouped(graph, coplace), cluster, "m_etf", refine=refine, dispatch=True)
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


@register("m_sct")
def m_sct(graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None,
          theta: float = 0.1, refine: bool = True, coplace: bool = False) -> Plan:
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
        _grouped(graph, coplace), cluster, "m_sct", refine=refine, dispatch=True)
    return plan_from_schedule(graph, cluster, sched, dispatch=True)


m_topo.__doc__ += _REFERENCE.format(section="4.1, m-TOPO")
m_etf.__doc__ += _REFERENCE.format(section="4.2, m-ETF")
m_sct.__doc__ += _REFERENCE.format(section="4.3, m-SCT")
