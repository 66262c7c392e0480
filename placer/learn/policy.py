"""Placeto's policy network in PyTorch: graph embeddings of the current placement -> a device per node.

At each step of an episode the policy looks at one node ``v`` of the
(coarsened) graph and the current placement, and outputs a softmax over the
devices for ``v`` (Placeto, Section 3 and appendix A.7):

1. Node features: its time and the time to send its output or receive its
   inputs relative to the mean node, its top and bottom level relative to
   the critical path, its memory relative to a device, whether it is ``v`` or
   was visited in this pass, and its start and end in the simulated schedule.
2. Message passing over the DAG, ``rounds`` times each way (from parents,
   then from children): ``h <- h0 + f(mean over parents of g(h))``.
3. Relative to ``v``, the nodes fall in three groups (ancestors,
   descendants, the rest); each group's embeddings are averaged through its
   own network.
4. A two-layer head scores each device from ``v``'s embeddings, the three
   group summaries and the device's state; a softmax over the allowed
   devices gives the action's distribution.

The placement enters as a node feature, as in Placeto, but per device: the
embeddings are computed once for each device ``d`` with the feature "this
node is on ``d``", so the same weights score every device. The policy is
thus independent of the number of devices (Placeto's output layer has one
unit per device of a fixed cluster), and one trained policy serves every
cluster. Devices also carry their load, memory use, speed for ``v``, the
bytes ``v`` exchanges with them, and when ``v``'s inputs would arrive there.

Sizes follow the appendix's scale (``d = 8`` per layer, ``|E| = 8``, ``k = 4``
rounds); the defaults are a little wider (16).
"""

from __future__ import annotations

import pickle
import zipfile
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn

from ..cluster import Cluster
from ..errors import FormatError
from ..feasibility import static_footprint
from ..graph import OpGraph
from ..paths import bottom_levels, top_levels

__all__ = ["PolicyConfig", "PlacetoPolicy", "GraphContext", "NODE_FEATURES", "DEVICE_FEATURES", "one_thread"]

NODE_FEATURES = 9  # static node features; 5 dynamic ones follow (on device d, is v, visited, start, finish)
DYNAMIC_FEATURES = 5
DEVICE_FEATURES = 9


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread within: the policy's matrices are small, and the cost of more threads far
    outweighs what they give, most of all on a loaded machine.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the policy network (saved with its weights)."""

    embed: int = 16
    hidden: int = 16
    head_hidden: int = 32
    rounds: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class GraphContext:
    """Everything static the policy needs about a (coarse) graph on a cluster, as tensors.

    Attributes
    ----------
    graph : OpGraph
    num_nodes, num_devices : int
    features : Tensor (N, NODE_FEATURES)
    mean_parents, mean_children : Tensor (N, N)
        Row ``v`` averages over ``v``'s parents (children).
    ancestors : ndarray of bool (N, N)
        ``ancestors[v, u]``: ``u`` reaches ``v``.
    durations : Tensor (N, D)
        Time of each node on each device, over the mean node time.
    edge_bytes : Tensor (N, N)
        Bytes from node ``u`` to node ``v``, over all bytes of the graph's edges.
    memory_share : Tensor (N, D)
        Each node's static footprint over each device's memory.
    """

    def __init__(self, graph: OpGraph, cluster: Cluster):
        self.graph = graph
        n, d = graph.num_nodes, cluster.num_devices
        self.num_nodes, self.num_devices = n, d
        dur = graph.durations(cluster)
        mean_dur = dur.mean(axis=1)
        unit = max(float(mean_dur.mean()), 1e-12)
        pairs = ~np.eye(d, dtype=bool) & np.isfinite(cluster.inverse_bandwidth)
        sec_per_byte = float(cluster.inverse_bandwidth[pairs].mean()) if pairs.any() else 0.0
        lat = float(cluster.latency[pairs].mean()) if pairs.any() else 0.0
        edge_time = graph.edge_bytes * sec_per_byte + lat
        out_time = np.bincount(graph.src, weights=edge_time, minlength=n)
        in_time = np.bincount(graph.dst, weights=edge_time, minlength=n)
        top = top_levels(graph, mean_dur)
        bottom = bottom_levels(graph, mean_dur)
        critical = max(float((top + bottom).max(initial=0.0)), 1e-12)
        memory = cluster.memory.astype(np.float64)
        footprint = static_footprint(graph).astype(np.float64)
        comm_ratio = float(edge_time.sum()) / max(float(mean_dur.sum()), 1e-12)
        static = np.stack(
            [
                np.log1p(mean_dur / unit),
                np.log1p(out_time / unit),
                np.log1p(in_time / unit),
                top / critical,
                bottom / critical,
                np.log1p(10 * footprint / memory.mean()),
                np.full(n, np.log1p(comm_ratio)),
                np.full(n, np.log(n) / 5),
                np.full(n, critical / max(float(mean_dur.sum()), 1e-12) * d / 4),
            ],
            axis=1,
        )
        self.features = torch.as_tensor(static, dtype=torch.float32)
        adjacency = np.zeros((n, n))
        np.add.at(adjacency, (graph.dst, graph.src), 1.0)  # adjacency[v, u]: edges u -> v
        parents = adjacency / np.maximum(adjacency.sum(axis=1, keepdims=True), 1)
        children = adjacency.T / np.maximum(adjacency.T.sum(axis=1, keepdims=True), 1)
        self.mean_parents = torch.as_tensor(parents, dtype=torch.float32)
        self.mean_children = torch.as_tensor(children, dtype=torch.float32)
        anc = np.zeros((n, n), dtype=bool)
        for v in graph.topological_order.tolist():
            for u in graph.predecessors(v).tolist():
                anc[v] |= anc[u]
                anc[v, u] = True
        self.ancestors = anc
        self.durations = torch.as_tensor(dur / unit, dtype=torch.float32)
        self.durations_s = torch.as_tensor(dur, dtype=torch.float32)
        flow = np.zeros((n, n))
        np.add.at(flow, (graph.src, graph.dst), graph.edge_bytes.astype(np.float64))
        self.edge_bytes = torch.as_tensor(flow / max(flow.sum(), 1.0), dtype=torch.float32)
        self.memory_share = torch.as_tensor(footprint[:, None] / memory[None, :], dtype=torch.float32)
        transfer = np.where(flow > 0, flow * sec_per_byte + lat, 0.0)
        self.parent_mask = torch.as_tensor(flow > 0)  # [u, v]: u -> v
        self.transfer_s = torch.as_tensor(transfer, dtype=torch.float32)  # uncongested, seconds
        self.mean_total = float(self.durations.sum() / d)

    def groups(self, v: int) -> torch.Tensor:
        """Masks (3, N) of ``v``'s ancestors, descendants and parallel nodes."""
        anc = self.ancestors[v]
        desc = self.ancestors[:, v]
        parallel = ~(anc | desc)
        parallel[v] = False
        return torch.as_tensor(np.stack([anc, desc, parallel]), dtype=torch.float32)


class PlacetoPolicy(nn.Module):
    """The policy: per-device graph embeddings of the current placement -> device scores for one node.

    Parameters
    ----------
    config : PolicyConfig
    """

    def __init__(self, config: PolicyConfig = PolicyConfig()):
        super().__init__()
        self.config = config
        e, h = config.embed, config.hidden
        self.embed_in = _mlp([NODE_FEATURES + DYNAMIC_FEATURES, h, e])
        self.message_fwd = _mlp([e, h, e])
        self.update_fwd = _mlp([e, h, e])
        self.message_bwd = _mlp([e, h, e])
        self.update_bwd = _mlp([e, h, e])
        self.aggregate = nn.ModuleList([_mlp([2 * e, h, e]) for _ in range(3)])  # ancestors, descendants, parallel
        self.head = _mlp([2 * e + 3 * e + DEVICE_FEATURES, config.head_hidden, config.head_hidden, 1])

    def forward(
        self,
        ctx: GraphContext,
        placement: torch.Tensor,
        v: int,
        visited: torch.Tensor,
        allowed: torch.Tensor,
        start: torch.Tensor,
        finish: torch.Tensor,
        makespan: float,
    ) -> torch.Tensor:
        """Log-probabilities over the devices for node ``v`` (``-inf`` where not allowed).

        Parameters
        ----------
        ctx : GraphContext
        placement : LongTensor (N,)
            Current device of every node.
        v : int
            The node being placed.
        visited : Tensor (N,)
            1 for nodes already placed in this pass.
        allowed : BoolTensor (D,)
        start, finish : Tensor (N,)
            When each node starts and ends under the current placement (simulated), seconds.
        makespan : float
            The current placement's makespan, seconds.
        """
        n, d = ctx.num_nodes, ctx.num_devices
        on = torch.nn.functional.one_hot(placement, d).to(torch.float32)  # (N, D)
        current = torch.zeros(n)
        current[v] = 1.0
        span = max(makespan, 1e-12)
        dynamic = torch.stack([current, visited, start / span, finish / span], dim=-1)  # (N, 4)
        x = torch.cat([ctx.features.expand(d, n, -1), on.T.unsqueeze(-1), dynamic.expand(d, n, -1)], dim=-1)
        h0 = self.embed_in(x)  # (D, N, E)
        fwd = h0
        for _ in range(self.config.rounds):
            fwd = h0 + self.update_fwd(ctx.mean_parents @ self.message_fwd(fwd))
        bwd = h0
        for _ in range(self.config.rounds):
            bwd = h0 + self.update_bwd(ctx.mean_children @ self.message_bwd(bwd))
        z = torch.cat([fwd, bwd], dim=-1)  # (D, N, 2E)
        masks = ctx.groups(v)  # (3, N)
        summaries = []
        for k, net in enumerate(self.aggregate):
            weight = masks[k] / masks[k].sum().clamp(min=1.0)
            summaries.append(torch.einsum("n,dne->de", weight, net(z)))
        device = self._device_features(ctx, on, v, masks[2], finish, span)
        scores = self.head(torch.cat([z[:, v], *summaries, device], dim=-1)).squeeze(-1)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.log_softmax(scores, dim=-1)

    @staticmethod
    def _device_features(
        ctx: GraphContext, on: torch.Tensor, v: int, parallel: torch.Tensor, finish: torch.Tensor, span: float
    ) -> torch.Tensor:
        others = on.clone()
        others[v] = 0.0
        load = (others * ctx.durations).sum(0) / max(ctx.mean_total, 1e-12)
        memory = (others * ctx.memory_share).sum(0) + ctx.memory_share[v]
        inflow = ctx.edge_bytes[:, v]
        outflow = ctx.edge_bytes[v]
        in_share = (inflow @ others) / inflow.sum().clamp(min=1e-12)
        out_share = (outflow @ others) / outflow.sum().clamp(min=1e-12)
        par = parallel @ (others * ctx.durations) / max(ctx.mean_total, 1e-12)
        speed = torch.log(ctx.durations[v] / ctx.durations[v].mean().clamp(min=1e-12)).nan_to_num(0.0)
        # When v's inputs would be ready on each device, and when it would end there (an
        # earliest-finish estimate from the current schedule, transfers uncongested).
        parents = ctx.parent_mask[:, v]
        if parents.any():
            arrival = finish[parents, None] + ctx.transfer_s[parents, v, None] * (1.0 - on[parents])
            ready = arrival.max(dim=0).values
        else:
            ready = torch.zeros(ctx.num_devices)
        end = ready + ctx.durations_s[v]
        return torch.stack([load, memory, in_share, out_share, par, speed, on[v], ready / span, end / span], dim=-1)

    # ------------------------------------------------------------- files
    def save(self, path, **metadata) -> None:
        """Write the weights and config (and ``metadata``, e.g. training settings) with ``torch.save``."""
        torch.save({"config": self.config.to_dict(), "state_dict": self.state_dict(), "metadata": metadata}, path)

    @classmethod
    def load(cls, path) -> "PlacetoPolicy":
        """Read a policy written by :meth:`save` (weights only; no code runs on load).

        Raises FormatError naming ``path`` where it is missing or not such a file.
        """
        try:
            doc = torch.load(path, map_location="cpu", weights_only=True)
            policy = cls(PolicyConfig(**doc["config"]))
            policy.load_state_dict(doc["state_dict"])
        except FileNotFoundError:
            raise FormatError(f"policy file {path}: no such file") from None
        except (OSError, EOFError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as exc:
            raise FormatError(
                f"policy file {path}: not a policy written by placer train ({_why_unreadable(Path(path), exc)})"
            ) from None
        policy.metadata = doc.get("metadata", {})
        return policy


def _why_unreadable(path: Path, exc: Exception) -> str:
    """Why :meth:`PlacetoPolicy.load` could not read ``path``, in a user's words (torch's own message
    advises loading with ``weights_only=False``, which would run code from the file)."""
    if path.is_dir():
        return "a directory"
    if path.stat().st_size == 0:
        return "empty"
    if not zipfile.is_zipfile(path):  # what torch.save writes
        return "not a file torch.save wrote, or one cut short"
    if isinstance(exc, (KeyError, TypeError)):
        return "a torch file without a policy's settings and weights"
    return f"its weights do not load into the network its settings describe ({type(exc).__name__})"
