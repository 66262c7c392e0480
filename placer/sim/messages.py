"""The host cost of a message: what a process-per-device step spends on sending and receiving.

Each message between two CPU processes costs both of them time their one
thread cannot compute: packing and the send call on one side, posting the
receive, a wait and unpacking on the other. The reference execution model
(FORMATS.md) has no such cost; :func:`messages_graph` adds it to the nodes of
a plan that send and receive, as a richer mode reported under its own name.
Its figures come from a run
(:attr:`placer.runtime.distributed.DistributedResult.message_s`) or from a
calibration (:func:`placer.harness.calibrate.calibrate`).

A message costs less when its rank exchanged another shortly before, so a
calibration also times streams of messages with computation between them
(:attr:`MessageCost.by_gap`), and :func:`simulate_with_messages` charges each
message at the gap the simulated schedule leaves before it on its rank.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..cluster import Cluster
from ..cost.profile import apply_placed_times
from ..errors import FormatError, OptionError
from ..graph import OpGraph
from ..io import Field, check_number
from ..plan import BoundPlan
from .simulator import simulate_bound

if TYPE_CHECKING:
    from .simulator import SimResult

__all__ = [
    "MessageCost",
    "cluster_message_cost",
    "messages_graph",
    "plan_messages",
    "message_gaps",
    "simulate_with_messages",
    "spread_over_gaps",
    "without_after_message",
    "waiting_nodes",
    "fit_after_message",
]


@dataclasses.dataclass(frozen=True)
class MessageCost:
    """Host seconds one message of ``b`` bytes takes a rank: ``fixed_s + b * per_byte_s`` on each side.

    ``by_gap`` holds ``(gap_s, send_fixed_s, receive_fixed_s)`` by ascending gap:
    the fixed parts measured in streams of messages ``gap_s`` of computation apart
    (:func:`placer.harness.calibrate.measure_gloo`). Where given, a message
    ``gap`` seconds after its rank's previous one pays the fixed parts
    interpolated there (held beyond the ends); ``send_fixed_s`` and
    ``receive_fixed_s`` are then a message's cost alone.

    ``after_send_s`` and ``after_receive_s`` are what the rank's next operation
    loses, beyond the message's own host time, for coming right after a send
    (a receive) rather than after another operation; ``after_wait_s`` is what it
    loses right after a receive the rank waited for (its thread slept, which
    costs more). A cost fitted to a run's messages has none of them, since the
    run's own op times include them.
    """

    send_fixed_s: float
    send_per_byte_s: float
    receive_fixed_s: float
    receive_per_byte_s: float
    by_gap: tuple[tuple[float, float, float], ...] = ()
    after_send_s: float = 0.0
    after_receive_s: float = 0.0
    after_wait_s: float = 0.0

    @classmethod
    def fit(cls, messages: Sequence[tuple[int, int, int, float, float]]) -> "MessageCost":
        """Least-squares lines through a run's messages, never below zero.

        Parameters
        ----------
        messages : sequence of (int, int, int, float, float)
            ``(source, destination, bytes, sending seconds, receiving seconds)``, as
            :attr:`placer.runtime.distributed.DistributedResult.message_s` and
            :func:`placer.harness.calibrate.measure_gloo` give.

        Raises
        ------
        ValueError
            Without messages.
        """
        if not messages:
            raise ValueError("MessageCost.fit needs at least one message")
        nbytes = np.array([m[2] for m in messages], dtype=float)

        def line(seconds: np.ndarray) -> tuple[float, float]:
            if np.ptp(nbytes) == 0:  # one size: no slope to tell
                return max(0.0, float(seconds.mean())), 0.0
            slope, fixed = np.polyfit(nbytes, seconds, 1)
            if slope < 0:
                return max(0.0, float(seconds.mean())), 0.0
            if fixed < 0:
                return 0.0, float(seconds @ nbytes / (nbytes @ nbytes))
            return float(fixed), float(slope)

        return cls(*line(np.array([m[3] for m in messages])), *line(np.array([m[4] for m in messages])))

    def to_dict(self) -> dict:
        doc = dataclasses.asdict(self)
        if self.by_gap:
            doc["by_gap"] = [list(point) for point in self.by_gap]
        else:
            del doc["by_gap"]
        for name in ("after_send_s", "after_receive_s", "after_wait_s"):
            if not doc[name]:
                del doc[name]
        return doc

    @classmethod
    def from_dict(cls, doc: Any, where: str = "message cost") -> "MessageCost":
        """Read :meth:`to_dict`'s form; FormatError naming ``where`` and the field at fault."""
        if not isinstance(doc, dict):
            raise FormatError(f"{where}: expected an object, got {type(doc).__name__}")
        f = Field(doc, where)
        by_gap = []
        for k, point in enumerate(f.array("by_gap") or []):
            if not (isinstance(point, list) and len(point) == 3):
                raise FormatError(
                    f"{where}: field 'by_gap': point #{k} must be [gap seconds, sending seconds, "
                    f"receiving seconds], got {point!r}"
                )
            by_gap.append(tuple(check_number(x, f"{where}: field 'by_gap': point #{k}") for x in point))
        if any(b[0] <= a[0] for a, b in zip(by_gap, by_gap[1:])):
            raise FormatError(f"{where}: field 'by_gap': gaps must ascend, got {[p[0] for p in by_gap]}")
        return cls(
            *(f.number(name.name, required=True) for name in dataclasses.fields(cls)[:4]),
            tuple(by_gap),
            *(f.number(name, default=0.0) for name in ("after_send_s", "after_receive_s", "after_wait_s")),
        )

    def host_only(self) -> "MessageCost":
        """This cost without the charges for the operations after messages (the messages' host time alone)."""
        return dataclasses.replace(self, after_send_s=0.0, after_receive_s=0.0, after_wait_s=0.0)

    def after_message_s(self, messages: Sequence[tuple[int, int, int]], waited: "set[int]") -> dict[int, float]:
        """Node index -> what the operation after its messages loses: ``after_send_s`` once for a node
        that sends, plus ``after_receive_s`` once for one that receives (``after_wait_s`` if it is in
        ``waited``)."""
        charged = dict.fromkeys((producer for producer, _, _ in messages), self.after_send_s)
        for consumer in {consumer for _, consumer, _ in messages}:
            charged[consumer] = charged.get(consumer, 0.0) + (
                self.after_wait_s if consumer in waited else self.after_receive_s
            )
        return charged

    def _fixed(self, side: int, alone: float, gap_s: float | None) -> float:
        if gap_s is None or not self.by_gap:
            return alone
        gaps = [point[0] for point in self.by_gap]
        return float(np.interp(min(gap_s, gaps[-1]), gaps, [point[side] for point in self.by_gap]))

    def send_s(self, nbytes: float, gap_s: float | None = None) -> float:
        """Seconds to send ``nbytes``, ``gap_s`` after the rank's previous message (None: alone)."""
        return self._fixed(1, self.send_fixed_s, gap_s) + nbytes * self.send_per_byte_s

    def receive_s(self, nbytes: float, gap_s: float | None = None) -> float:
        """Seconds to receive ``nbytes``, ``gap_s`` after the rank's previous message (None: alone)."""
        return self._fixed(2, self.receive_fixed_s, gap_s) + nbytes * self.receive_per_byte_s


def messages_graph(
    graph: OpGraph,
    bound: BoundPlan,
    cluster: Cluster,
    own_s: dict[str, float],
    cost: MessageCost,
    gaps: Sequence[tuple[float, float]] | None = None,
    messages: Sequence[tuple[int, int, int]] | None = None,
    waited: "set[int] | None" = None,
) -> OpGraph:
    """``graph`` costed for one plan: each node's own time plus the host time of the messages the plan gives it.

    The plan's messages are the reference model's transfers (FORMATS.md rule 4:
    one per tensor and destination device, of the largest ``bytes`` among its
    edges there). The producer pays the sending, the first of its consumers in
    the destination device's order the receiving. A node that sends (receives)
    also pays :attr:`MessageCost.after_send_s` (``after_receive_s``, or
    ``after_wait_s`` where it waited) once, for the operation that follows its
    messages. Given a run's own times (its ``op_s`` less its ``op_message_s``) and
    its :class:`MessageCost`, the simulator predicts plans other than the one
    that ran, as FastT's loop needs.

    Parameters
    ----------
    graph : OpGraph
    bound : BoundPlan
        The plan to cost the messages of.
    cluster : Cluster
    own_s : dict of str to float
        Node id -> seconds of the operation itself, without messages. Nodes
        without one keep their time, plus their messages'.
    cost : MessageCost
    gaps : sequence of (float, float), optional
        Each message's gap before it on its sending and its receiving rank
        (:func:`message_gaps`): it then costs what ``cost`` gives there;
        without them, a message's cost alone.
    messages : sequence of (int, int, int), optional
        The plan's messages, as :func:`plan_messages` gives them (computed
        when not given): ``gaps`` follow their order.
    waited : set of int, optional
        The nodes that wait for a message before they start (:func:`waiting_nodes`
        of a schedule of the plan); without it, none.

    Returns
    -------
    OpGraph
        Same ids and edges, with the times as measured times of each node's
        device kind (:func:`placer.cost.profile.apply_placed_times`).
    """
    device_of = bound.device_of
    durations = graph.durations(cluster)[np.arange(graph.num_nodes), device_of]
    seconds = np.array([own_s.get(node_id, durations[i]) for i, node_id in enumerate(graph.ids)], dtype=float)
    if messages is None:
        messages = plan_messages(graph, bound)
    for (producer, consumer, nbytes), (send_gap, receive_gap) in zip(messages, gaps or [(None, None)] * len(messages)):
        seconds[producer] += cost.send_s(nbytes, send_gap)
        seconds[consumer] += cost.receive_s(nbytes, receive_gap)
    for node, after_s in cost.after_message_s(messages, waited or set()).items():
        seconds[node] += after_s
    return apply_placed_times(graph, device_of, cluster, dict(zip(graph.ids, seconds.tolist())))


def plan_messages(graph: OpGraph, bound: BoundPlan) -> list[tuple[int, int, int]]:
    """``(producer, first consumer on the destination device, bytes)`` of every message of the plan (see
    :func:`messages_graph`)."""
    device_of = bound.device_of
    position = np.zeros(graph.num_nodes, dtype=np.int64)
    if bound.order is not None:
        for nodes in bound.order:
            position[nodes] = np.arange(len(nodes))
    else:
        position[:] = np.arange(graph.num_nodes)
    # (producer, tensor, destination device) -> [largest bytes, first consumer there]
    messages: dict[tuple[int, int, int], list[int]] = {}
    for s, d, t, b in zip(
        graph.src.tolist(), graph.dst.tolist(), graph.edge_tensor.tolist(), graph.edge_bytes.tolist()
    ):
        if device_of[s] != device_of[d]:
            message = messages.setdefault((s, t, int(device_of[d])), [b, d])
            message[0] = max(message[0], b)
            if position[d] < position[message[1]]:
                message[1] = d
    return [(producer, consumer, nbytes) for (producer, _, _), (nbytes, consumer) in messages.items()]


def message_gaps(
    messages: Sequence[tuple[int, int, int]], bound: BoundPlan, schedule: "SimResult"
) -> list[tuple[float, float]]:
    """``(sending gap, receiving gap)`` of each of :func:`plan_messages`' messages in ``schedule``.

    A message is sent as its producer ends and received as its consumer starts; its
    gap on each side is the time since the previous message its rank sent or
    received, the step taken as repeating (a rank's first message follows its last
    of the step before). A rank with one message has the step as its gap.
    """
    events: dict[int, list[tuple[float, int, int]]] = {}
    for k, (producer, consumer, _) in enumerate(messages):
        events.setdefault(int(bound.device_of[producer]), []).append((float(schedule.finish[producer]), k, 0))
        events.setdefault(int(bound.device_of[consumer]), []).append((float(schedule.start[consumer]), k, 1))
    step = schedule.makespan_s
    gaps = [[step, step] for _ in messages]
    for ranked in events.values():
        ranked.sort()
        for j, (at, k, side) in enumerate(ranked):
            before = ranked[j - 1][0] if j else ranked[-1][0] - step
            gaps[k][side] = at - before if len(ranked) > 1 else step
    return [(send, receive) for send, receive in gaps]


def waiting_nodes(schedule: "SimResult", orders: Sequence[np.ndarray] | None = None) -> set[int]:
    """The nodes that start later than their device could have (after its previous node in ``orders``,
    the schedule's own by default, or the step's start), so waited for a message from another device:
    in a process-per-device run, their rank blocked in a receive."""
    waited = set()
    for order in schedule.device_orders() if orders is None else orders:
        free = np.concatenate([[0.0], schedule.finish[order[:-1]]])
        waited.update(order[schedule.start[order] > free + 1e-12].tolist())
    return waited


def cluster_message_cost(cluster: Cluster) -> MessageCost | None:
    """The host cost of a message between ``cluster``'s processes, where a calibration put one on it.

    :func:`~placer.harness.calibrate.apply_calibration` stores a gloo
    calibration's :class:`MessageCost` as the cluster's ``extra["message_cost"]``
    (and a cluster file keeps it); a preset has none.

    Raises
    ------
    FormatError
        If ``extra["message_cost"]`` is not a message cost, naming the cluster and field.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> cluster = load_cluster("2xcpu")
    >>> cluster_message_cost(cluster) is None
    True
    >>> cluster.extra["message_cost"] = MessageCost(2e-5, 1e-10, 3e-5, 1e-10).to_dict()
    >>> cluster_message_cost(cluster).receive_fixed_s
    3e-05
    """
    doc = cluster.extra.get("message_cost")
    return None if doc is None else MessageCost.from_dict(doc, f"cluster {cluster.name!r}: field 'message_cost'")


def simulate_with_messages(
    bound: BoundPlan,
    cost: MessageCost,
    own_s: dict[str, float] | None = None,
    passes: int = 3,
    messages: Sequence[tuple[int, int, int]] | None = None,
) -> "SimResult":
    """The plan simulated with its messages' host cost (:func:`messages_graph`) on its nodes.

    Where ``cost`` has costs by gap, a message's gap depends on the schedule its
    cost shapes, so the simulation iterates: the first pass charges each message
    as if it followed another at once (the runtime posts every receive as a step
    begins and sends as each producer ends), each later pass the cost at its gap
    in the pass before. It stops after ``passes`` passes, or once the step moves
    by 0.1% or less. Starting from each message alone instead settles on gaps
    that are too long. Likewise, where ``cost`` charges the operation after a
    waited receive (:attr:`MessageCost.after_wait_s`), each pass charges the
    nodes that waited in the pass before (:func:`waiting_nodes`; none in the
    first). ``messages``, where the caller has them, are the plan's
    (:func:`plan_messages`, computed when not given).

    Returns
    -------
    SimResult
        The last pass (its graph carries the charged times).
    """
    if passes < 1:
        raise OptionError(f"option 'passes' must be >= 1, got {passes}")
    if messages is None:
        messages = plan_messages(bound.graph, bound)
    gaps = [(0.0, 0.0)] * len(messages) if cost.by_gap else None
    waited: set[int] = set()
    schedule = None
    for _ in range(passes if cost.by_gap or cost.after_wait_s else 1):
        costed = messages_graph(bound.graph, bound, bound.cluster, own_s or {}, cost, gaps, messages, waited)
        before, schedule = schedule, simulate_bound(BoundPlan(costed, bound.cluster, bound.device_of, bound.order))
        if before is not None and abs(schedule.makespan_s - before.makespan_s) <= 1e-3 * before.makespan_s:
            break
        if cost.by_gap:
            gaps = message_gaps(messages, bound, schedule)
        if cost.after_wait_s:
            waited = waiting_nodes(schedule, bound.order)
    return schedule


def spread_over_gaps(
    fitted: MessageCost, calibrated: MessageCost, bound: BoundPlan, own_s: dict[str, float]
) -> MessageCost:
    """A run's fitted message cost, shaped over gaps as a calibration's: what another plan's messages cost.

    ``fitted`` (:meth:`MessageCost.fit` of a run's messages) is what the run's
    messages cost at the gaps they had; another plan sends at other gaps (a few
    messages milliseconds apart, or hundreds back to back). The calibration's
    costs by gap are scaled, each side by one factor, so that over the gaps of
    the run's messages (its plan, ``bound``, simulated with its ops' own times
    and ``fitted``) they average the run's fixed parts; the per-byte parts are
    the run's. This predicts another plan's run better than the run's cost at
    every gap.

    It also takes the calibration's cost of the operation right after a message
    (:attr:`MessageCost.after_send_s`, ``after_receive_s``, ``after_wait_s``),
    which a run's own op times hold for its plan's messages only: predict
    another plan from those times less it (:func:`without_after_message`).

    Returns ``fitted`` itself where ``calibrated`` has no costs by gap or the
    plan sends no message.
    """
    messages = plan_messages(bound.graph, bound)
    if not calibrated.by_gap or not messages:
        return fitted
    gaps = message_gaps(messages, bound, simulate_with_messages(bound, fitted, own_s, messages=messages))
    # What the calibration's fixed parts average at those gaps (a message of no bytes).
    sending = float(np.mean([calibrated.send_s(0, send_gap) for send_gap, _ in gaps]))
    receiving = float(np.mean([calibrated.receive_s(0, receive_gap) for _, receive_gap in gaps]))
    to_send = fitted.send_fixed_s / sending if sending > 0 else 1.0
    to_receive = fitted.receive_fixed_s / receiving if receiving > 0 else 1.0
    return dataclasses.replace(
        fitted,
        by_gap=tuple((gap, sent * to_send, received * to_receive) for gap, sent, received in calibrated.by_gap),
        after_send_s=calibrated.after_send_s,
        after_receive_s=calibrated.after_receive_s,
        after_wait_s=calibrated.after_wait_s,
    )


def fit_after_message(bound: BoundPlan, own_s: dict[str, float], cost: MessageCost) -> MessageCost:
    """``cost`` with the ``after_*`` charges fitted to what the operations after a run's messages lost.

    Each node's own time in the run (``own_s``, :func:`placer.harness.feedback.own_times`)
    beyond its profiled time (:meth:`BoundPlan.placed_durations`) is fitted by
    least squares, each term at least zero, as ``after_send_s`` where the node
    sends under the plan plus ``after_receive_s`` where it is the first to read a
    message (:func:`plan_messages`); nodes with neither count only where timed.
    ``after_wait_s`` is set to ``after_receive_s``: a run does not tell which
    receives waited. ``cost``'s host costs of the messages themselves are kept.
    A calibration's streams, one message at a time, underestimate this loss;
    :func:`placer.harness.calibrate.measure_probe` fits it to a probe run.

    Raises
    ------
    ValueError
        Where no node that sends or receives was timed.
    """
    graph = bound.graph
    sends = np.zeros(graph.num_nodes, dtype=bool)
    receives = np.zeros(graph.num_nodes, dtype=bool)
    for producer, consumer, _ in plan_messages(graph, bound):
        sends[producer] = receives[consumer] = True
    ran = np.array([own_s.get(node, np.nan) for node in graph.ids])
    timed = ~np.isnan(ran) & (sends | receives)
    if not timed.any():
        raise ValueError("fit_after_message needs a timed node that sends or receives a message")
    roles = np.stack([sends, receives], axis=1)[timed].astype(float)
    (after_send, after_receive), *_ = np.linalg.lstsq(roles, (ran - bound.placed_durations())[timed], rcond=None)
    after_send, after_receive = max(float(after_send), 0.0), max(float(after_receive), 0.0)
    return dataclasses.replace(cost, after_send_s=after_send, after_receive_s=after_receive, after_wait_s=after_receive)


def without_after_message(own_s: dict[str, float], bound: BoundPlan, cost: MessageCost) -> dict[str, float]:
    """A run's operations' own times less what ``cost`` charges the operation after its plan's messages.

    ``own_s`` (:func:`placer.harness.feedback.own_times`) includes what each node
    lost for coming right after a message of the plan that ran (``bound``), while
    :func:`messages_graph` charges another plan's. Each node that sends gives back
    :attr:`MessageCost.after_send_s`, each that receives ``after_receive_s`` (or
    ``after_wait_s`` where it waited in the run), once, never below zero.
    """
    if not (cost.after_send_s or cost.after_receive_s or cost.after_wait_s):
        return own_s
    messages = plan_messages(bound.graph, bound)
    waited: set[int] = set()
    if cost.after_wait_s:
        waited = waiting_nodes(simulate_with_messages(bound, cost.host_only(), own_s, messages=messages), bound.order)
    back = {bound.graph.ids[node]: after_s for node, after_s in cost.after_message_s(messages, waited).items()}
    return {node: max(0.0, seconds - back.get(node, 0.0)) for node, seconds in own_s.items()}
