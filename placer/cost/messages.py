"""The host cost of a message: what a process-per-device step spends on sending and receiving.

Each message a plan sends between two CPU processes costs both of them time
their one thread cannot compute: packing and the send call on one side,
posting the receive, a wait and unpacking on the other (tens of microseconds
each over gloo, docs/benchmarks.md "Fidelity"). The reference execution model
(FORMATS.md) has no such cost; :func:`messages_graph` adds it to the nodes of
a plan that send and receive, as a richer mode beside the reference one
(named as such wherever it is reported). Its figures come from a run
(:attr:`placer.runtime.distributed.DistributedResult.message_s`) or from a
calibration before any run (:func:`placer.cost.calibrate.calibrate`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..cluster import Cluster
from ..errors import FormatError
from ..graph import OpGraph
from ..io import Field
from ..plan import BoundPlan
from .profile import apply_placed_times

__all__ = ["MessageCost", "messages_graph"]


@dataclasses.dataclass(frozen=True)
class MessageCost:
    """Host seconds one message of ``b`` bytes takes a rank: ``fixed_s + b * per_byte_s`` on each side."""

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
            :attr:`placer.runtime.distributed.DistributedResult.message_s` and
            :func:`placer.cost.calibrate.measure_gloo` give.

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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "message cost") -> "MessageCost":
        """Read :meth:`to_dict`'s form; FormatError naming ``where`` and the field at fault."""
        if not isinstance(doc, dict):
            raise FormatError(f"{where}: expected an object, got {type(doc).__name__}")
        f = Field(doc, where)
        return cls(*(f.number(name.name, required=True) for name in dataclasses.fields(cls)))

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
        device kind (:func:`placer.cost.profile.apply_placed_times`).
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
    return apply_placed_times(graph, device_of, cluster, dict(zip(graph.ids, seconds.tolist())))
