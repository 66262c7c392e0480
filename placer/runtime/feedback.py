"""FastT's measurement feedback: measured per-node times become the graph's costs.

FastT (Yi et al., "Optimizing distributed training deployment in heterogeneous
GPU clusters", CoNEXT 2020, Section 4) profiles the running placement and
feeds the measured operation times back into its cost model before it
replans; a new placement is kept only when its measured iteration is faster.
Here a node's measured seconds on a device become its ``compute_s_by_kind``
for that device's kind (the reference model prefers them over the analytic
``compute_s / speed``), through :func:`placer.cost.profile.apply_profile`;
measured transfers set each link type's latency (:func:`measured_cluster`): in
a running step a message costs more than in an idle ping-pong, and unevenly
(on the lent 16-core machine, messages of 32 to 256 KiB a rank waited for took
a mean of 80 to 590 us by size, medians of 32 to 226 us, against 41 to 90 us
calibrated; docs/benchmarks.md "Fidelity").
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Sequence

import numpy as np

from ..cluster import Cluster
from ..cost.profile import Profile, apply_profile
from ..graph import OpGraph
from ..plan import BoundPlan

__all__ = ["measured_graph", "measured_cluster", "MessageCost", "messages_graph"]


def measured_graph(graph: OpGraph, bound: BoundPlan, cluster: Cluster, op_s: dict[str, float]) -> OpGraph:
    """``graph`` with each measured node's seconds as its time on the kind of device it ran on.

    Parameters
    ----------
    graph : OpGraph
    bound : BoundPlan
        The plan that was measured (where each node ran).
    cluster : Cluster
    op_s : dict of str to float
        Graph node id -> measured seconds.

    Returns
    -------
    OpGraph
        Same ids and edges (plans for ``graph`` stay valid for it).
    """
    by_kind: dict[str, dict[str, float]] = {}
    for node_id, seconds in op_s.items():
        i = graph.index.get(node_id)
        if i is not None:
            kind = cluster.devices[bound.device_of[i]].kind
            by_kind.setdefault(kind, {})[node_id] = float(seconds)
    for kind, seconds in by_kind.items():
        graph = apply_profile(graph, Profile(graph.name, graph.digest(), kind, seconds))
    return graph


def measured_cluster(cluster: Cluster, transfers: Sequence[tuple[int, int, int, float]]) -> Cluster:
    """``cluster`` with each link type's latency set to what its messages took in a run.

    The link keeps its bandwidth (a calibration's, from messages of 1 KiB to 64 MiB)
    and takes as latency the mean time a measured transfer took beyond
    ``bytes / bandwidth``. In a running step the per-message cost is what
    changes: it varies several-fold between messages of one size and does not
    grow with size over the few sizes a plan sends, so a line fitted to such
    points says little of the bandwidth. The mean, not the median, because a
    step's critical path adds these costs up (on the recorded runs of
    docs/benchmarks.md "Fidelity": mean error 7.7% with the mean, 11.6% with the
    median, 14.5% with a least-squares line).

    Parameters
    ----------
    cluster : Cluster
        Channels name their link type in ``extra["link"]`` (the presets do).
    transfers : sequence of (int, int, int, float)
        ``(source device, destination device, bytes, seconds)``, as
        :attr:`placer.runtime.distributed.DistributedResult.transfer_s` gives.

    Returns
    -------
    Cluster
        A link without measured transfers keeps its figures; a negative mean
        excess gives a latency of 0.
    """
    excess: dict[str, list[float]] = {}
    for src, dst, nbytes, seconds in transfers:
        c = cluster.channel_index[src, dst]
        channel = cluster.channels[c] if c >= 0 else None
        if channel is not None and channel.extra.get("link") is not None:
            excess.setdefault(channel.extra["link"], []).append(seconds - nbytes / channel.bandwidth_bytes_per_s)
    channels = []
    for ch in cluster.channels:
        times = excess.get(ch.extra.get("link"))
        channels.append(ch if times is None else
                        dataclasses.replace(ch, latency_s=max(0.0, statistics.fmean(times)),
                                            extra={**ch.extra, "latency_from": "measured in a placed run"}))
    return Cluster(cluster.name, cluster.devices, channels, extra=dict(cluster.extra)) if excess else cluster


@dataclasses.dataclass(frozen=True)
class MessageCost:
    """Host seconds one message of ``b`` bytes takes a rank: ``fixed_s + b * per_byte_s`` on each side.

    What a process-per-device run spends on a message besides moving it
    (packing, the send call; posting the receive, unpacking) is time its one
    thread cannot compute. The reference model has no such cost, so a plan
    that sends hundreds of messages runs slower than it says (docs/benchmarks.md,
    "Fidelity"); :func:`messages_graph` charges it to the nodes that send and
    receive, for any plan.
    """

    send_fixed_s: float
    send_per_byte_s: float
    receive_fixed_s: float
    receive_per_byte_s: float

    @classmethod
    def fit(cls, messages: Sequence[tuple[int, int, int, float, float]]) -> "MessageCost":
        """Least-squares lines through a run's messages, never below zero.

        Parameters
        ----------
        messages : sequence of (int, int, int, float, float)
            ``(source, destination, bytes, sending seconds, receiving seconds)``, as
            :attr:`placer.runtime.distributed.DistributedResult.message_s` gives.

        Raises
        ------
        ValueError
            Without messages.
        """
        if not messages:
            raise ValueError("MessageCost.fit needs at least one message")
        nbytes = np.array([m[2] for m in messages], dtype=float)

        def line(seconds: np.ndarray) -> tuple[float, float]:
            if np.ptp(nbytes) == 0:          # one size: no slope to tell
                return max(0.0, float(seconds.mean())), 0.0
            slope, fixed = np.polyfit(nbytes, seconds, 1)
            if slope < 0:
                return max(0.0, float(seconds.mean())), 0.0
            if fixed < 0:
                return 0.0, float(seconds @ nbytes / (nbytes @ nbytes))
            return float(fixed), float(slope)

        return cls(*line(np.array([m[3] for m in messages])), *line(np.array([m[4] for m in messages])))

    def send_s(self, nbytes: float) -> float:
        return self.send_fixed_s + nbytes * self.send_per_byte_s

    def receive_s(self, nbytes: float) -> float:
        return self.receive_fixed_s + nbytes * self.receive_per_byte_s


def messages_graph(graph: OpGraph, bound: BoundPlan, cluster: Cluster, own_s: dict[str, float],
                   cost: MessageCost) -> OpGraph:
    """``graph`` costed for one plan: each node's own time plus the host time of the messages the plan gives it.

    The plan's messages are the reference model's transfers (FORMATS.md rule 4:
    one per tensor and destination device, of the largest ``bytes`` among its
    edges there). Its producer pays the sending, the first of its consumers in
    the destination device's order the receiving. With a run's own times (a
    run's ``op_s`` less its ``op_message_s``) and its :class:`MessageCost`, the
    simulator predicts other plans than the one that ran, as FastT's loop needs.

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

    Returns
    -------
    OpGraph
        Same ids and edges, with the times as measured times of each node's
        device kind (:func:`measured_graph`).
    """
    device_of = bound.device_of
    position = np.zeros(graph.num_nodes, dtype=np.int64)
    if bound.order is not None:
        for nodes in bound.order:
            position[nodes] = np.arange(len(nodes))
    else:
        position[:] = np.arange(graph.num_nodes)
    durations = graph.durations(cluster)[np.arange(graph.num_nodes), device_of]
    seconds = np.array([own_s.get(node_id, durations[i]) for i, node_id in enumerate(graph.ids)], dtype=float)
    # (producer, tensor, destination device) -> [largest bytes, first consumer there]
    messages: dict[tuple[int, int, int], list[int]] = {}
    for s, d, t, b in zip(graph.src.tolist(), graph.dst.tolist(), graph.edge_tensor.tolist(),
                          graph.edge_bytes.tolist()):
        if device_of[s] != device_of[d]:
            message = messages.setdefault((s, t, int(device_of[d])), [b, d])
            message[0] = max(message[0], b)
            if position[d] < position[message[1]]:
                message[1] = d
    for (producer, _, _), (nbytes, consumer) in messages.items():
        seconds[producer] += cost.send_s(nbytes)
        seconds[consumer] += cost.receive_s(nbytes)
    return measured_graph(graph, bound, cluster, dict(zip(graph.ids, seconds.tolist())))
