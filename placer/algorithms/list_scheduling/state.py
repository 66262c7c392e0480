"""The partial schedule of a list scheduler (:class:`ScheduleState`) and the finished one (:class:`Schedule`).

A list scheduler places operations one at a time and books each on a device
timeline, under the reference model of FORMATS.md:

- one timeline per device; an operation takes the earliest idle slot after
  its inputs arrive that is long enough (insertion-based, HEFT's and DPOS's
  rule), or the end of the timeline (append, ETF's rule);
- one timeline per *channel*: a tensor sent to another device is one
  transfer per (producer, tensor, destination device), booked on the
  channel of that pair where the channel's first-come-first-served queue
  puts it: once its producer has finished and every transfer booked there
  that queues ahead of it has ended (:class:`~.timeline.QueueOrder`). Where
  that slot is taken, the channel is crowded, and more of the crowd is still
  to be booked (a scheduler books a transfer when it places the consumer),
  so the transfer goes after every transfer booked there. Transfers that
  share a channel do not overlap, and a tensor already sent to a device is
  reused there;
- placement units (colocation groups) whose first scheduled member fixes
  the device of the whole group, kinds a unit may not use, and each
  device's memory over time (:class:`~.memory.MemoryTimeline`);
- on devices not all linked, the devices each unit may still use without
  leaving a neighbour no device that a channel links to it
  (:meth:`ScheduleState.narrow_neighbours`, once per unit placed).

The per-device order is the order of each timeline. Where no transfer waits
for its channel, the start times a scheduler predicts are exactly those the
reference simulator measures when it runs that order. Where transfers queue
they can differ: the reference model serves a transfer booked late before
the booked ones that queue behind it, and delays those; a list scheduler
learns of a transfer only when it places the consumer. So the retries build
a schedule again, told the transfers the simulation of the last one ran
(``sends``: :func:`~.retries.refined_schedule`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...cluster import Cluster
from ...errors import InfeasibleError
from ...graph import OpGraph
from ...sim.simulator import SimResult
from ..common import linked_devices, missing_link
from .memory import MemoryTimeline
from .tables import schedule_tables
from .timeline import QueueOrder, Timeline

__all__ = ["Schedule", "ScheduleState", "Estimate", "Booking", "BookedTransfer", "Send"]


#: Makes a named tuple from a tuple of its fields, as ``Estimate._make`` does: without the Python frame of the
#: class's own constructor, which would double the cost of an estimate's tuples (made for every node and device
#: a scheduler weighs).
_make = tuple.__new__


class Booking(NamedTuple):
    """A transfer an estimate would book: one input of the node, on ``channel`` over ``[start, end)``.

    ``input`` is the input's index among the node's :attr:`ScheduleState.inputs`.
    """

    channel: int
    start: float
    end: float
    input: int


class Estimate(NamedTuple):
    """When and where a node would run on a device (:meth:`ScheduleState.estimate`).

    ``start`` and ``finish`` are its EST and EFT; ``place`` is ``(block, index)`` on the device's
    :class:`~.timeline.Timeline` (what :meth:`ScheduleState.commit` books); ``bookings`` are the
    transfers of its inputs it needs. An input no channel brings to the device makes
    ``start = finish = inf``.
    """

    start: float
    finish: float
    place: tuple[int, int]
    bookings: list[Booking]


class BookedTransfer(NamedTuple):
    """A transfer booked on ``channel`` over ``[start, end)``; ``end`` is when the copy has arrived."""

    channel: int
    start: float
    end: float


class Send(NamedTuple):
    """A transfer of output ``tensor`` of a node to ``device``, ``nbytes`` long (:class:`ScheduleState`'s ``sends``)."""

    tensor: int
    device: int
    nbytes: int


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
    simulated, dispatched : SimResult or None
        The reference simulation of the schedule's own order, and of its placement under
        earliest-ready dispatch, once the retries ran them
        (:func:`~.retries.schedule_with_memory_retries`, :func:`~.to_plan.plan_simulation`).
    memory : MemoryTimeline or None
        The memory timeline the scheduler checked its bookings against, for :attr:`memory_seen`.
    transfers : dict or None
        The transfers the scheduler booked, by (producer, tensor, device).
    budget_seen : ndarray or None
        Per device, the bytes of its budgeted capacity that a limit of the scheduler's own used
        (m-TOPO's share), where that limit, not the memory over time, decided what went there.
    """

    device_of: np.ndarray
    orders: list[np.ndarray]
    start: np.ndarray
    finish: np.ndarray
    simulated: SimResult | None = None
    dispatched: SimResult | None = None
    memory: MemoryTimeline | None = None
    transfers: dict[tuple[int, int, int], BookedTransfer] | None = None
    budget_seen: np.ndarray | None = None

    @property
    def memory_seen(self) -> np.ndarray | None:
        """Per device, the most memory the scheduler counted there while building it
        (:attr:`~.memory.MemoryTimeline.seen`), or of its budget its own limit used (:attr:`budget_seen`),
        whichever is more."""
        if self.memory is None:
            return None
        seen = self.memory.seen.copy()
        return seen if self.budget_seen is None else np.maximum(seen, self.budget_seen)

    @property
    def makespan_s(self) -> float:
        """The latest predicted finish (0 for an empty graph)."""
        return float(self.finish.max()) if self.finish.size else 0.0


class ScheduleState:
    """A partial list schedule under the reference model's devices, channels and memory (see the module).

    A scheduler asks :meth:`estimate` (or :meth:`best_device`) where and when
    a node would run, :meth:`holds` whether the device's memory takes it,
    and books it with :meth:`commit`; :meth:`schedule` gives the result once
    every node is booked. Estimates only grow as the schedule fills, but for
    two events that may bring a node forward: a transfer booked after its
    channel's end (:attr:`gap_bookings`), and an input sent to a device for
    another reader (:meth:`any_input_sent`).

    Parameters
    ----------
    graph, cluster
    ratio : float
        Memory ratio: the share of a node's output and workspace (and of
        the copies of its inputs) it holds on its device's
        :class:`~.memory.MemoryTimeline`, beside its parameters (1: the
        reference model's bytes; the memory retries move it).
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
        Per node, the transfers of its outputs (:class:`Send`) to book as soon
        as it is booked: the reference model queues a transfer at its
        producer's finish, before a list scheduler would place the consumer
        that needs it (:func:`~.retries.simulated_sends`).

    Attributes
    ----------
    dur, unit_of, unit_ok, grouped, inputs, readers, channel_of, receivers
        The graph's tables (:class:`~.tables.ScheduleTables`), read-only; ``unit_ok`` is this
        schedule's copy where :meth:`narrow_neighbours` narrows it.
    unit_need : list of float
        Per unit, the bytes it holds on its device from its first booking.
    unit_device : list of int
        Per unit, its device once a member is booked, else -1.
    device_of, start, finish : list
        Per node, its device (-1 until booked) and its booked times.
    devices, channels : list of Timeline
        Per device, its operations; per channel, its transfers.
    memory : MemoryTimeline
    booked : dict
        Each transfer booked (:class:`BookedTransfer`), by (producer, tensor, device).
    gap_bookings : list of list of float
        Per channel, the transfers booked after its end, as how long each left it idle, in
        booking order: only such a booking can bring a transfer still to book forward (one in
        an idle slot only takes time from the channel).
    sends : dict
        As given (empty if not).

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> g = OpGraph(["a", "b"], [1.0, 2.0], [0], [1], [0], [0])
    >>> state = ScheduleState(g, load_cluster("2xcpu"), 1.0, insertion=False)
    >>> for v in (0, 1):
    ...     d, estimate = state.best_device(v)
    ...     state.commit(v, d, estimate)
    >>> state.device_of, state.finish, state.schedule().makespan_s
    ([0, 0], [1.0, 3.0], 3.0)
    """

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        ratio: float,
        *,
        insertion: bool,
        contention: bool = True,
        capacity_scale: np.ndarray | None = None,
        sends: dict[int, list[Send]] | None = None,
    ):
        self.graph = graph
        self.cluster = cluster
        self.insertion = insertion
        self.contention = contention
        n, n_dev = graph.num_nodes, cluster.num_devices
        tables = schedule_tables(graph, cluster)
        # Read-only, shared by every schedule of this graph on this cluster.
        self.dur, self.unit_of, self._units = tables.dur, tables.unit_of, tables.units
        self._unit_links = tables.unit_links
        self._group_members = tables.group_members
        self._unit_params, self.grouped, self._reserved_at = tables.unit_params, tables.grouped, tables.reserved_at
        self.channel_of, self.receivers = tables.channel_of, tables.receivers
        self._ch_lat, self._ch_inv_bw, self._name_rank = tables.ch_lat, tables.ch_inv_bw, tables.name_rank
        self.inputs, self._consumers, self.readers = tables.inputs, tables.consumers, tables.readers
        self._fewest_bytes = tables.fewest_bytes
        self.ratio = ratio
        self.memory = MemoryTimeline(cluster.memory, capacity_scale)
        # What a unit holds from its first booking: its parameters for the whole step, the rest from that start.
        need = tables.params + ratio * (tables.output_bytes + tables.temp_bytes)
        alone = need.tolist()  # most units are one node: no sum to take
        self.unit_need = [
            alone[members[0]] if len(members) == 1 else float(need[members].sum()) for members in self._units
        ]
        self.unit_device = [-1] * len(self._units)
        # Per unit, the devices it may use: its kinds allow them and, on devices not all linked, each leaves
        # every neighbour a device to go to (narrow_neighbours narrows this copy as units are placed).
        self.unit_ok = tables.unit_ok
        if self._unit_links is not None:
            self._device_links = tables.device_links
            self.unit_ok = [row.copy() for row in tables.unit_ok]
            # unit_ok as bit masks, which narrow_neighbours narrows.
            self._unit_bits = [sum(1 << d for d, ok in enumerate(row) if ok) for row in tables.unit_ok]
            everywhere = (1 << n_dev) - 1
            for unit, bits in enumerate(self._unit_bits):
                if bits != everywhere:  # its kinds keep it off some devices
                    self.narrow_neighbours(unit)
        # A colocation group's first member fixes the device of the others, so it reserves room
        # for them there (see ScheduleTables.incoming); booking a member turns its reservations
        # into its allocations, which start no later.
        self._incoming: dict[int, dict[tuple[int, int], float]] = {
            unit: {key: ratio * b for key, b in incoming.items()} for unit, incoming in tables.incoming.items()
        }
        for unit, incoming in self._incoming.items():
            self.unit_need[unit] += sum(incoming.values())
        # Copies (producer, tensor, device) already on some device's memory timeline.
        self._budgeted: set[tuple[int, int, int]] = set()
        # When memory is freed is known once the nodes that hold it are booked: a node's
        # workspace at its finish; its output and the copies of it once every consumer is booked.
        self._consumers_left = [len(c) for c in self._consumers]
        # Per node, the bytes a copy of each of its inputs would hold (the most its copies can add).
        self._copy_need = [ratio * b for b in tables.input_bytes]
        self._sent_until = [0.0] * n  # when the last transfer of each node's outputs ends
        self._copies_held: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        self._transient = (ratio * tables.output_bytes).tolist()
        self._workspace = (ratio * tables.temp_bytes).tolist()
        self.device_of = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.devices = [Timeline() for _ in range(n_dev)]
        self.channels = [Timeline() for _ in cluster.channels]
        self._queues = [QueueOrder() for _ in cluster.channels]
        # Per (producer, channel), the (destination name rank, tensor) of its transfers booked there, sorted.
        self._sent_to: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.booked: dict[tuple[int, int, int], BookedTransfer] = {}
        # The (node, device) pairs with some input already sent to the device.
        self._input_sent: set[tuple[int, int]] = set()
        self.sends = {u: [Send(*send) for send in sent] for u, sent in sends.items()} if sends else {}
        # The transfers booked from sends, by (producer, tensor, device) (their start: booked).
        self._sent_ahead: set[tuple[int, int, int]] = set()
        # Bumped whenever a device's timeline, incoming channels or memory change (cached_estimate).
        self._version = [0] * n_dev
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
        """Whether node ``v`` may go to device ``d`` now: its unit's device once fixed, else an allowed one with
        room."""
        unit = self.unit_of[v]
        fixed = self.unit_device[unit]
        if fixed >= 0:
            return d == fixed
        return self.unit_ok[unit][d] and self.memory.used[d] + self.unit_need[unit] <= self.memory.limits[d]

    def any_input_sent(self, v: int, d: int) -> bool:
        """Whether some input of ``v`` is on device ``d`` already, sent there for another consumer."""
        return (v, d) in self._input_sent

    def same_routes(self, v: int, d: int, bookings: list[Booking]) -> list[int]:
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
        others = [j for j in self.receivers[bookings[0].channel] if j != d]
        if not others:  # a channel per pair of devices
            return []
        # Per input, the device it comes from and its channel; per input whose producer has transfers booked
        # on its channel, the (rank, tensor) ties next below and above its own to d, between which its tie to
        # another device must fall.
        rank, routes, windows = self._name_rank, [], []
        for c, _, _, k in bookings:
            u, t, _ = inputs[k]
            routes.append((self.device_of[u], c))
            sent = self._sent_to.get((u, c))
            if sent:
                i = bisect_left(sent, (rank[d], t))
                windows.append((sent[i - 1] if i else (-1, -1), sent[i] if i < len(sent) else (len(rank), 0), t))
        return [
            j
            for j in others
            if all(below < (rank[j], t) < above for below, above, t in windows)
            and all(self.channel_of[du][j] == c and du != j for du, c in routes)
            and not self.any_input_sent(v, j)
        ]

    def data_ready(self, v: int, d: int) -> tuple[float, list[Booking]]:
        """When every input of ``v`` is on device ``d`` (inf where no channel brings one), and the transfers
        that would be booked for it.

        An input on ``d`` arrives at its producer's finish, one sent there
        already when its transfer ends. The others are tried in the order they
        would queue in, each once its producer ends and every transfer booked
        on its channel that queues ahead of it has ended
        (:class:`~.timeline.QueueOrder`) if the channel is idle then, else
        after every transfer booked there (see the module's docstring); two of
        them on one channel go one after the other.
        """
        ready = 0.0
        bookings: list[Booking] = []
        pending = []
        device_of, finish, booked = self.device_of, self.finish, self.booked  # a list scheduler's hottest loop
        for k, (u, t, b) in enumerate(self.inputs[v]):
            if device_of[u] == d:
                arrives = finish[u]
            else:
                known = booked.get((u, t, d))
                if known is None:
                    pending.append((finish[u], u, t, k, b))
                    continue
                arrives = known.end
            if arrives > ready:
                ready = arrives
        if not pending:
            return ready, bookings
        pending.sort()
        # This node's own transfers on one channel go in the order they queue, one after another.
        channel_free: dict[int, float] = {}
        for queued, u, t, k, b in pending:
            c = self.channel_of[self.device_of[u]][d]
            if c < 0:
                return float("inf"), []
            length = self.transfer_s(c, b)
            if self.contention:
                begin = self._channel_slot(c, self._queue_key(u, t, d), channel_free.get(c, queued), length)
                channel_free[c] = begin + length
            else:
                begin = queued
            bookings.append(_make(Booking, (c, begin, begin + length, k)))
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
                arrives += self.transfer_s(c, self._fewest_bytes[(u, t)])
            if arrives > ready:
                ready = arrives
        return ready

    def transfer_s(self, c: int, nbytes: float) -> float:
        """Seconds a transfer of ``nbytes`` takes on channel ``c``: its latency plus ``nbytes / bandwidth``."""
        return self._ch_lat[c] + nbytes * self._ch_inv_bw[c]

    def _queue_key(self, u: int, t: int, d: int) -> tuple[float, int, int, int]:
        """Where the transfer of output ``t`` of ``u`` to device ``d`` stands in its channel's queue
        (:class:`~.timeline.QueueOrder`): ``(queued, producer, destination name rank, tensor)``."""
        return self.finish[u], u, self._name_rank[d], t

    def _channel_slot(self, c: int, key: tuple[float, int, int, int], after: float, length: float) -> float:
        """Where channel ``c`` would start a transfer of ``length`` with queue key ``key``, not before
        ``after`` nor its producer's finish (``queued``): see the module's docstring."""
        queued, _, _, _ = key
        after = max(after, queued)
        queue, channel = self._queues[c], self.channels[c]
        if queue.latest_end > after:
            after = max(after, queue.ahead_until(key))
        # Where its slot in the queue is taken, the rest of the crowd comes ahead of it too
        # (bench/list_prediction.py).
        if channel.last[-1] <= after or channel.idle_at(after, length):
            return after
        begin, _, _ = channel.find(after, length, insertion=False)
        return begin

    def estimate(self, v: int, d: int) -> Estimate:
        """When and where node ``v`` would run on device ``d``: once its data is ready (:meth:`data_ready`),
        in the first slot of its device's timeline that holds it (any gap with ``insertion``, else the end)."""
        ready, bookings = self.data_ready(v, d)
        if ready == float("inf"):
            return _make(Estimate, (ready, ready, (0, 0), bookings))
        length = self.dur[v][d]
        begin, b, k = self.devices[d].find(ready, length, self.insertion)
        return _make(Estimate, (begin, begin + length, (b, k), bookings))

    def cached_estimate(self, v: int, d: int, cache: dict) -> Estimate:
        """:meth:`estimate`, kept in ``cache`` by (node, device) for as long as that device's version holds."""
        version, est = cache.get((v, d), (-1, None))
        if version != self._version[d]:
            est = self.estimate(v, d)
            cache[(v, d)] = (self._version[d], est)
        return est

    def copies(self, v: int, d: int, bookings: list[Booking]) -> dict[tuple[int, int, int], tuple[float, float]]:
        """The input copies placing ``v`` on ``d`` would create: (producer, tensor, device) -> (transfer start, bytes).

        A copy is held from the start of its transfer (ratio-scaled bytes);
        a colocation group's copies are in its reservation already.
        """
        if self.grouped[self.unit_of[v]]:
            return {}
        out = {}
        for _, begin, _, k in bookings:
            u, t, b = self.inputs[v][k]
            if (u, t, d) not in self._budgeted:
                out[(u, t, d)] = (begin, self.ratio * b)
        if self._sent_ahead:
            for u, t, b in self.inputs[v]:
                if (u, t, d) in self._sent_ahead and (u, t, d) not in self._budgeted:
                    out[(u, t, d)] = (self.booked[(u, t, d)].start, self.ratio * b)
        return out

    def need(self, v: int, d: int, estimate: Estimate) -> float:
        """Bytes placing ``v`` on ``d`` adds there: its unit (unless already placed) and the
        input copies ``estimate``'s transfers create."""
        unit = self.unit_of[v]
        copies = sum(amount for _, amount in self.copies(v, d, estimate.bookings).values())
        return copies + (self.unit_need[unit] if self.unit_device[unit] < 0 else 0.0)

    def _allocations(self, v: int, d: int, estimate: Estimate) -> list[tuple[float, float]]:
        """What placing ``v`` on ``d`` adds to its memory timeline, as (time, bytes) steps.

        ``v``'s unit's parameters for the whole step (unless the unit is placed
        already); ``v``'s output and workspace from its start, the workspace
        freed at its finish; each new copy of an input from the start of its
        transfer. The output and the copies are freed once every consumer is
        booked (:meth:`_release`). A colocation group's first member adds
        the group's reservations instead (see ``__init__``).
        """
        unit = self.unit_of[v]
        steps = [(0.0, self._unit_params[unit])] if self.unit_device[unit] < 0 else []
        if self.grouped[unit]:
            if self.unit_device[unit] < 0:
                start, end = self._reserved_at
                steps += [(start[m], self._transient[m] + self._workspace[m]) for m in self._group_members[unit]]
                steps += [(end[u], amount) for (u, _), amount in self._incoming[unit].items()]
            return steps
        steps += [(estimate.start, self._transient[v] + self._workspace[v]), (estimate.finish, -self._workspace[v])]
        return steps + list(self.copies(v, d, estimate.bookings).values())

    def holds(self, v: int, d: int, estimate: Estimate) -> bool:
        """Whether ``d``'s memory, over the whole step, holds what placing ``v`` there adds (:meth:`_allocations`).

        Always true where ``v``'s colocation group lives on ``d`` already: its
        reservations there start no later than what ``v`` takes.
        """
        unit = self.unit_of[v]
        if self.unit_device[unit] == d:
            return True
        # Most checks are settled by the most placing v could add (its unit, a copy of every input; a
        # group's copies are in its reservations), without listing what it adds.
        if self.memory.surely_fits(d, self.unit_need[unit] + (0.0 if self.grouped[unit] else self._copy_need[v])):
            return True
        return self.memory.fits(d, self._allocations(v, d, estimate))

    def best_device(
        self, v: int, devices: list[int] | None = None, earliest_start: bool = False, cache: dict | None = None
    ) -> tuple[int, Estimate]:
        """The device (among ``devices``, default :meth:`devices_for`) where ``v`` finishes earliest, and its estimate.

        A device is passed over when its memory cannot hold ``v`` with the
        copies of inputs placing it there would create (:meth:`holds`).
        ``earliest_start`` picks the earliest start instead (ETF). Ties go to the lowest device index.
        ``cache`` keeps estimates by (node, device) for as long as that device's version holds.
        A device whose bound (:meth:`arrives_by`, plus ``v``'s time there for the finish) is no
        earlier than the best so far cannot win, and is not estimated.

        Raises
        ------
        InfeasibleError
            Where no device takes ``v``: its memory (:meth:`holds`), or its links (:meth:`unreached`).
        """
        candidates = self.devices_for(v) if devices is None else devices
        # No candidate at all: :meth:`may_take` found no room, unless no device is linked to the unit's placed
        # neighbours (a node's kinds and group are checked up front).
        best_d, best, best_time, reached = -1, None, 0.0, not candidates and any(self.unit_ok[self.unit_of[v]])
        for d in candidates:
            if best is not None and self.arrives_by(v, d) + (0.0 if earliest_start else self.dur[v][d]) >= best_time:
                continue
            est = self.estimate(v, d) if cache is None else self.cached_estimate(v, d, cache)
            if est.start == float("inf"):
                continue  # no channel brings an input to d
            reached = True
            if not self.holds(v, d, est):
                continue
            time = est.start if earliest_start else est.finish
            if best is None or time < best_time:
                best_d, best, best_time = d, est, time
        if best is None:
            raise (
                InfeasibleError(f"node {self.graph.ids[v]!r} fits no device's remaining memory")
                if reached
                else self.unreached(v)
            )
        return best_d, best

    def unreached(self, v: int) -> InfeasibleError:
        """The error where no device ``v`` may use has the channels its edges to placed units need, naming
        one missing link: on its colocation group's device where an earlier member placed the group."""
        unit, names = self.unit_of[v], [d.name for d in self.cluster.devices]
        fixed, members = self.unit_device[unit], self._units[unit]
        placed = np.asarray(self.unit_device)[np.asarray(self.unit_of)]  # each node's unit's device
        placed[members] = -1
        kinds = schedule_tables(self.graph, self.cluster).unit_ok[unit]
        devices = [fixed] if fixed >= 0 else [d for d, ok in enumerate(kinds) if ok]
        linked = linked_devices(self.graph, self.cluster.linked, placed, members)
        d = next((d for d in devices if not linked[d]), devices[0])  # else missing_link raises: a bug
        why = missing_link(self.graph, self.cluster, placed, members, d)
        if fixed < 0:
            return InfeasibleError(
                f"node {self.graph.ids[v]!r}: no device it may use is linked to its neighbours' "
                f"devices, as on {names[d]!r}: {why}"
            )
        return InfeasibleError(
            f"node {self.graph.ids[v]!r} must join its colocation group on {names[fixed]!r} "
            f"(an earlier member's device): {why}"
        )

    # ------------------------------------------------------------ booking
    def commit(self, v: int, d: int, estimate: Estimate) -> None:
        """Book node ``v`` on device ``d`` with the figures :meth:`estimate` gave.

        Books its input transfers and itself, adds its allocations to the
        memory timeline, fixes its unit's device, frees what its booking
        makes freeable (:meth:`_release`) and books the transfers ``sends``
        names for it.
        """
        begin, end, (block, index), bookings = estimate
        for c, s, f, k in sorted(bookings, key=lambda booking: booking.start):
            u, t, _ = self.inputs[v][k]
            self._book_transfer(u, t, d, c, s, f)
        self.devices[d].book(begin, block, index, end - begin, v)
        self.device_of[v] = d
        self.start[v] = begin
        self.finish[v] = end
        for at, amount in self._allocations(v, d, estimate):
            self.memory.add(d, at, amount)
        unit = self.unit_of[v]
        if self._unit_links is not None and self.unit_device[unit] < 0:
            self.unit_device[unit], self._unit_bits[unit] = d, 1 << d
            self.narrow_neighbours(unit)
        self.unit_device[unit] = d
        for (u, t, _), (_, amount) in self.copies(v, d, bookings).items():
            self._budgeted.add((u, t, d))
            self._copies_held[u].append((d, amount))
        if self.grouped[unit]:
            self._claim(v, d, begin, end, bookings)
        for _, _, f, k in bookings:
            u, _, _ = self.inputs[v][k]
            self._sent_until[u] = max(self._sent_until[u], f)
        for u in {u for u, _, _ in self.inputs[v]} | ({v} if self._consumers_left[v] == 0 else set()):
            if u != v:
                self._consumers_left[u] -= 1
            if self._consumers_left[u] == 0:
                self._release(u)
        self._version[d] += 1
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
            bits, placed = self._unit_bits[x], self.unit_device[x] >= 0
            for others, reach in zip(self._unit_links[x], self._device_links):
                support = 0  # the devices linked to one of x's: from it to those x sends to, else to it
                for j in range(n_dev):
                    if bits >> j & 1:
                        support |= reach[j]
                for y in others:
                    was = self._unit_bits[y]
                    now = was & support
                    if now != was and self.unit_device[y] < 0 and (now or placed):
                        self._unit_bits[y] = now
                        self.unit_ok[y] = [now >> j & 1 == 1 for j in range(n_dev)]
                        if now:
                            work.append(y)

    def _book_transfer(self, u: int, t: int, d: int, c: int, begin: float, end: float) -> None:
        """Book the transfer of output ``t`` of ``u`` to device ``d`` on channel ``c`` over ``[begin, end)``."""
        self.booked[(u, t, d)] = _make(BookedTransfer, (c, begin, end))
        self._input_sent.update((w, d) for w in self.readers[(u, t)])
        insort(self._sent_to.setdefault((u, c), []), (self._name_rank[d], t))
        if self.contention:
            channel = self.channels[c]
            if begin > channel.last[-1]:
                self.gap_bookings[c].append(begin - channel.last[-1])
            channel.book(*channel.find(begin, end - begin, insertion=True), end - begin)
            self._queues[c].add(self._queue_key(u, t, d), end)
            for receiver in self.receivers[c]:
                self._version[receiver] += 1

    def _send_ahead(self, u: int) -> None:
        """Book the transfers of ``u``'s outputs that ``sends`` names, as the reference model queues them at its finish.

        A copy sent ahead is budgeted on its device's memory once a consumer
        there uses it (:meth:`copies`); until then it only takes channel time.
        """
        sends = self.sends.get(u)
        if not sends:
            return
        home, rank = self.device_of[u], self._name_rank
        for t, d, nbytes in sorted(sends, key=lambda send: (rank[send.device], send.tensor)):  # queue order
            c = self.channel_of[home][d]
            if d == home or c < 0 or (u, t, d) in self.booked or (u, t) not in self.readers:
                continue
            length = self.transfer_s(c, nbytes)
            begin = (
                self._channel_slot(c, self._queue_key(u, t, d), self.finish[u], length)
                if self.contention
                else self.finish[u]
            )
            self._book_transfer(u, t, d, c, begin, begin + length)
            self._sent_ahead.add((u, t, d))
            self._sent_until[u] = max(self._sent_until[u], begin + length)

    def _claim(self, v: int, d: int, begin: float, end: float, bookings: list[Booking]) -> None:
        """Turn the reservations of ``v``'s colocation group for ``v`` into ``v``'s allocations on ``d``."""
        start, arrive = self._reserved_at
        self.memory.add(d, start[v], -(self._transient[v] + self._workspace[v]))
        self.memory.add(d, begin, self._transient[v] + self._workspace[v])
        self.memory.add(d, end, -self._workspace[v])
        inputs = self.inputs[v]
        sent = {}
        for _, s, _, k in bookings:
            u, t, _ = inputs[k]
            sent[(u, t)] = s
        incoming = self._incoming[self.unit_of[v]]
        for u, t, _ in self.inputs[v]:
            amount = incoming.pop((u, t), None)
            if amount is None:
                continue
            self.memory.add(d, arrive[u], -amount)
            copied_from = sent.get((u, t), self.booked[(u, t, d)].start if (u, t, d) in self._sent_ahead else None)
            if copied_from is not None and (u, t, d) not in self._budgeted:  # else already on d: no new copy
                self.memory.add(d, copied_from, amount)
                self._budgeted.add((u, t, d))
                self._copies_held[u].append((d, amount))

    def _release(self, u: int) -> None:
        """Every consumer of ``u`` is booked: free its output and the copies of it when the reference model does.

        An output lives until its last consumer on its device has finished and
        its last transfer has ended; a copy, until its last consumer there has finished.
        """
        last: dict[int, float] = {}
        device_of, finish = self.device_of, self.finish
        for w in self._consumers[u]:
            d = device_of[w]
            last[d] = max(last.get(d, 0.0), finish[w])
        home = device_of[u]
        self.memory.add(home, max(finish[u], last.get(home, 0.0), self._sent_until[u]), -self._transient[u])
        self._version[home] += 1
        for device, amount in self._copies_held[u]:
            self.memory.add(device, last[device], -amount)
            self._version[device] += 1

    def schedule(self) -> Schedule:
        """The finished schedule (every node committed)."""
        return Schedule(
            np.asarray(self.device_of, dtype=np.int64),
            [np.asarray(t.items(), dtype=np.int64) for t in self.devices],
            np.asarray(self.start),
            np.asarray(self.finish),
            memory=self.memory,
            transfers=dict(self.booked),
        )
