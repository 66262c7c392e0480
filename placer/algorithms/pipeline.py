"""Pipeline parallelism: GPipe and 1F1B, stages cut by a dynamic programme, micro-batches in the schedule's order.

The step is cut into ``m`` micro-batches (:func:`~placer.transform.microbatch.microbatch_graph`:
gradients accumulated over them, the optimizer once). Its layers, in the
order of their last forward operation on the batch (a layer's forward and
backward operations together, colocation groups kept whole), are cut into
``K`` contiguous *stages*, one per device, each stage's device later in the
cluster's order than the previous stage's (so stages follow the cluster's
hosts). Each micro-batch's copy of an operation runs on its layer's stage;
the stage's whole nodes (parameters, the optimizer) and the accumulation of
its gradients run there too.

Stages are balanced by a dynamic programme over the cut points: for every
stage count ``K``, it minimises the slowest of each stage's time per
micro-batch (its operations' durations on its device under the reference
model, scaled by the micro-batch's share) and each cut's transfer per
micro-batch (the bytes that cross it, both ways, over the channel between
the two devices), subject to the device kinds each layer allows and to a
memory estimate per stage: its parameters and gradients, and the
activations of the micro-batches in flight there (all ``m`` under GPipe, at
most ``K - s`` on stage ``s`` under 1F1B), each micro-batch's taken as its
share of the step's outputs times the share of them a one-device run holds
at its peak. The reference simulator then runs the most promising stage
counts' pipelines and keeps the fastest that fits; where a device
overflows, its budget shrinks by the overshoot and the programme runs again.

Each device runs its nodes in the schedule's order (rule 2):

* ``gpipe``: every micro-batch's forward, then every backward;
* ``1f1b``: stage ``s`` of ``K`` runs ``min(m, K - s)`` forwards, then
  alternates one backward and one forward, then the remaining backwards
  (torch's ``Schedule1F1B``, PipeDream-Flush), so at most ``K - s``
  micro-batches' activations are held there at once.

Replica groups (``replicas=r``, data parallelism over pipelines): the
devices, in the cluster's order, form ``r`` groups of ``G = n // r`` (the
rest idle), and the ``m`` micro-batches ``r`` runs of ``m / r`` consecutive
ones, run ``g`` on group ``g``: each group is a pipeline over its rows of
the batch, cut as group 0's (stage ``s`` of group ``g`` on the device ``g G``
after group 0's stage ``s``), its devices in the schedule's order over its own
micro-batches. Parameters, the optimizer and its state stay once, on group
0's stages; the other groups read each parameter they use from there (one
transfer per step). Each group sums its micro-batches' gradients on its own
stages (:func:`~placer.transform.microbatch.microbatch_graph` with
``groups=r``); once its own work is done, group ``g`` adds the sum of the
groups before it, received from group ``g - 1``, to its own, and the last
group's total goes back to the optimizer: a reduce and a broadcast of each
stage's gradients and weights where data parallelism over pipelines
all-reduces replicas of them. A colocation group that holds state (batch
norm's running statistics, updated by every micro-batch in turn) stays on
group 0, with its other groups' operations.

A micro-batch's *backward* operations are those that follow the step's turn:
the last operation from which every gradient is reached (the loss's
gradient, before it branches into the layers'); the others are its forward. Operations that do not depend on the batch (parameters) come
first, the optimizer's last, and each accumulation with its micro-batch's
backward.

References
----------
Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
Pipeline Parallelism", NeurIPS 2019; Narayanan et al., "PipeDream:
Generalized Pipeline Parallelism for DNN Training", SOSP 2019 (the dynamic
programme over stage cuts); Narayanan et al., "Memory-Efficient
Pipeline-Parallel DNN Training", ICML 2021 (1F1B with flushes);
``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, InvalidPlanError, OptionError
from ..feasibility import diagnose
from ..graph import OpGraph
from ..io import shown_sizes
from ..plan import Plan, check_order_acyclic
from ..sim.simulator import simulate
from ..transform.microbatch import check_microbatches, microbatch_graph
from ..transform.replicate import chunk_add_time, replica_layout
from ..transform.split import batch_dependent, batch_samples
from .baselines import layer_labels
from .common import placement_units, unit_allowed
from .registry import register

__all__ = [
    "gpipe",
    "one_f_one_b",
    "pipeline_plan",
    "schedule_sequence",
    "default_microbatches",
    "default_group_microbatches",
    "check_replicas",
    "SCHEDULES",
    "Stages",
]

#: The schedules this module plans.
SCHEDULES = ("gpipe", "1f1b")
#: Stage counts whose pipelines the simulator runs (the most promising by the programme's estimate).
SIMULATED_CANDIDATES = 3
#: Rounds of shrinking an overflowing device's budget and cutting again.
MEMORY_ROUNDS = 4
#: Budgets, as multiples of each device's memory, tried in turn where no cut fits the memory estimate in the
#: devices' memory: the estimate counts every gradient twice and a share of every output, more than a stage
#: may hold at its peak, and the simulator then shrinks an overflowing device's budget.
RELAXED_BUDGETS = (1.5, 2.0, 3.0)


@dataclass
class Stages:
    """A cut of the layers into stages: stage ``s`` holds units ``bounds[s]:bounds[s + 1]`` on ``devices[s]``."""

    bounds: list[int]
    devices: list[int]
    bottleneck_s: float
    estimate_s: float = 0.0


def schedule_sequence(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[int, str]]:
    """The order in which stage ``stage`` of ``stages`` runs each micro-batch's forward (``"F"``) and backward.

    Examples
    --------
    >>> schedule_sequence("gpipe", 0, 2, 3)
    [(0, 'F'), (1, 'F'), (2, 'F'), (0, 'B'), (1, 'B'), (2, 'B')]
    >>> schedule_sequence("1f1b", 0, 2, 4)
    [(0, 'F'), (1, 'F'), (0, 'B'), (2, 'F'), (1, 'B'), (3, 'F'), (2, 'B'), (3, 'B')]
    >>> schedule_sequence("1f1b", 1, 2, 3)
    [(0, 'F'), (0, 'B'), (1, 'F'), (1, 'B'), (2, 'F'), (2, 'B')]
    """
    m = microbatches
    if schedule == "gpipe":
        return [(k, "F") for k in range(m)] + [(k, "B") for k in range(m)]
    warm = min(m, stages - stage)
    out = [(k, "F") for k in range(warm)]
    for k in range(m):
        out.append((k, "B"))
        if warm + k < m:
            out.append((warm + k, "F"))
    return out


def default_microbatches(graph: OpGraph, cluster: Cluster) -> int:
    """The micro-batch count the pipelines choose when given none: twice the devices, at most the batch's
    samples; one where the step has no batch input to cut.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> default_microbatches(g, load_cluster("4xV100-nvlink")), default_microbatches(g.replace(extra={"batch_size": 6}),
    ...                                                                              load_cluster("4xV100-nvlink"))
    (8, 6)
    """
    if not graph.num_nodes or not batch_dependent(graph).any():
        return 1
    samples = batch_samples(graph)
    return min(2 * cluster.num_devices, samples if samples is not None else 2 * cluster.num_devices)


def _in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under the schedule."""
    return microbatches if schedule == "gpipe" else min(microbatches, stages - stage)


class _Costs:
    """Per unit (in forward order) and device: time per micro-batch, memory, and what crosses each cut."""

    def __init__(
        self,
        graph: OpGraph,
        cluster: Cluster,
        units: list[np.ndarray],
        microbatches: int,
        per_batch: np.ndarray,
        grad_bytes: dict,
    ):
        n_units, n_dev = len(units), cluster.num_devices
        m = microbatches
        dur = graph.durations(cluster)
        unit_of = np.empty(graph.num_nodes, dtype=np.int64)
        for u, members in enumerate(units):
            unit_of[members] = u
        self.unit_of = unit_of
        scale = np.where(per_batch, 1.0 / m, 0.0)
        per_mb = np.zeros((n_units, n_dev))
        np.add.at(per_mb, unit_of, dur * scale[:, None])
        once = np.zeros((n_units, n_dev))
        np.add.at(once, unit_of, dur * (~per_batch)[:, None])
        grads = np.zeros(n_units)
        add_time = np.zeros((n_units, n_dev))
        kinds = [d.kind for d in cluster.devices]
        speeds = np.array([d.speed for d in cluster.devices])
        for (u, _), size in grad_bytes.items():
            grads[unit_of[u]] += size
            if m > 1:
                seconds, times = chunk_add_time(size)
                add_time[unit_of[u]] += (m - 1) * np.array([times.get(k, seconds / s) for k, s in zip(kinds, speeds)])
        self.per_mb = np.vstack([np.zeros(n_dev), np.cumsum(per_mb, axis=0)])
        self.once = np.vstack([np.zeros(n_dev), np.cumsum(once + add_time, axis=0)])
        forbidden = ~unit_allowed(graph, cluster, units)
        self.forbidden = np.vstack([np.zeros(n_dev, dtype=np.int64), np.cumsum(forbidden, axis=0)])
        fixed = np.bincount(unit_of, weights=graph.param_bytes.astype(np.float64), minlength=n_units) + 2 * grads
        outputs = (
            np.bincount(unit_of, weights=(graph.output_bytes + graph.temp_bytes) * per_batch, minlength=n_units) / m
        )
        self.fixed = np.concatenate([[0.0], np.cumsum(fixed)])
        self.activations = np.concatenate([[0.0], np.cumsum(outputs)])
        # Bytes crossing the cut before unit i (1..n_units - 1), both ways, per micro-batch.
        a, b = unit_of[graph.src], unit_of[graph.dst]
        sent = graph.edge_bytes * np.where(per_batch[graph.src], 1.0 / m, 1.0)
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        diff = np.zeros(n_units + 1)
        np.add.at(diff, lo + 1, sent)
        np.add.at(diff, hi + 1, -sent)
        self.crossing = np.cumsum(diff)[: n_units + 1]
        self.latency = cluster.latency
        self.inverse_bandwidth = cluster.inverse_bandwidth


def _cut(
    costs: _Costs, cluster: Cluster, schedule: str, stages: int, m: int, liveness: float, budget: np.ndarray
) -> Stages | None:
    """The cut into ``stages`` stages with the smallest bottleneck (dynamic programme), or None if none fits."""
    n_units, n_dev = costs.per_mb.shape[0] - 1, cluster.num_devices
    inf = np.inf
    # best[j, d]: bottleneck of stages 0..s covering units [0, j) with stage s on device d.
    best = np.full((n_units + 1, n_dev), inf)
    choice: list[np.ndarray] = []
    idx = np.arange(n_units + 1)
    before = idx[:, None] < idx[None, :]  # [i, j]: a stage of units [i, j) is not empty
    fixed = costs.fixed[None, :] - costs.fixed[:, None]
    acts = costs.activations[None, :] - costs.activations[:, None]
    for s in range(stages):
        flight = _in_flight(schedule, s, stages, m)
        new = np.full((n_units + 1, n_dev), inf)
        arg = np.full((n_units + 1, n_dev, 2), -1, dtype=np.int64)
        memory = fixed + flight * liveness * acts
        for d in range(n_dev):
            if s == 0:
                prev = np.full(n_units + 1, inf)
                prev[0] = 0.0
                prev_dev = np.full(n_units + 1, -1)
            else:
                if d == 0:
                    continue
                # Cheapest way to reach cut i with stage s - 1 on an earlier device, counting the cut's transfer.
                options = np.full((d, n_units + 1), inf)
                for q in range(d):
                    link = costs.latency[q, d] + costs.latency[d, q]
                    if np.isinf(link):
                        continue
                    slowest = max(costs.inverse_bandwidth[q, d], costs.inverse_bandwidth[d, q])
                    options[q] = np.maximum(best[:, q], link + costs.crossing * slowest)
                prev_dev = np.argmin(options, axis=0)
                prev = options[prev_dev, idx]
            time = costs.per_mb[None, :, d] - costs.per_mb[:, None, d]
            ok = before & (costs.forbidden[None, :, d] - costs.forbidden[:, None, d] == 0) & (memory <= budget[d])
            value = np.where(ok, np.maximum(prev[:, None], time), inf)
            k = np.argmin(value, axis=0)
            new[:, d] = value[k, idx]
            arg[:, d, 0] = k
            arg[:, d, 1] = prev_dev[k] if s else -1
        best = new
        choice.append(arg)
    d = int(np.argmin(best[n_units]))
    if not np.isfinite(best[n_units, d]):
        return None
    bottleneck = float(best[n_units, d])
    bounds, devices = [n_units], []
    j = n_units
    for s in range(stages - 1, -1, -1):
        devices.append(d)
        i, q = choice[s][j, d]
        bounds.append(int(i))
        j, d = int(i), int(q)
    bounds.reverse()
    devices.reverse()
    times = [float(costs.per_mb[b, dv] - costs.per_mb[a, dv]) for a, b, dv in zip(bounds[:-1], bounds[1:], devices)]
    tails = [float(costs.once[b, dv] - costs.once[a, dv]) for a, b, dv in zip(bounds[:-1], bounds[1:], devices)]
    estimate = sum(times) + (m - 1) * bottleneck + max(tails, default=0.0)
    return Stages(bounds, devices, bottleneck, estimate)


def _backward(graph: OpGraph, producers: list[int]) -> np.ndarray:
    """Per node: whether it belongs to the backward pass, the turn of the step and what follows from it.

    The turn is the last node, in topological order, from which every gradient's producer is reached
    (the loss's gradient, before it branches into the layers'); a step without gradients has no backward.
    """
    n = graph.num_nodes
    back = np.zeros(n, dtype=bool)
    if not producers:
        return back
    bit = {u: 1 << k for k, u in enumerate(sorted(set(producers)))}
    every = (1 << len(bit)) - 1
    reach = [0] * n
    ptr, eids = graph.out_edges
    dst = graph.dst[eids].tolist()
    ptr = ptr.tolist()
    turn = -1
    for v in graph.topological_order[::-1].tolist():
        bits = bit.get(v, 0)
        for w in dst[ptr[v] : ptr[v + 1]]:
            bits |= reach[w]
        reach[v] = bits
        if bits == every and turn < 0:
            turn = v
    back[turn] = True
    for v in graph.topological_order.tolist():
        if back[v]:
            back[dst[ptr[v] : ptr[v + 1]]] = True
    return back


def _pipeline_labels(
    graph: OpGraph, forward: np.ndarray, backward: np.ndarray, topo_pos: np.ndarray, min_layers: int
) -> np.ndarray:
    """A layer label per node: its ``layer``; an unlabelled node (an activation, a residual sum) takes its
    parents' layer (those on the batch, where it has any: not the layer of a weight it reads), the latest of them in forward order for a forward node (a residual sum after a
    block goes with the block) and the earliest for a backward node (the gradient's sum goes with the
    layer it flows into), else its children's earliest. A graph without layer names: slices of the
    topological order (:func:`~placer.algorithms.baselines.layer_labels`)."""
    if all(name is None for name in graph.layer):
        return layer_labels(graph, min_layers=min_layers)
    n = graph.num_nodes
    names: dict[str, int] = {}
    label = np.array([-1 if x is None else names.setdefault(x, len(names)) for x in graph.layer], dtype=np.int64)
    # Where each layer's forward work on the batch ends, by topological position.
    rank = np.full(len(names) + n, -np.inf)
    marked = forward & (label >= 0)
    np.maximum.at(rank, label[marked], topo_pos[marked].astype(np.float64))
    lazy = np.full(len(names) + n, np.inf)  # a layer without forward work: where its first node comes
    np.minimum.at(lazy, label[label >= 0], topo_pos[label >= 0].astype(np.float64))
    rank = np.where(np.isinf(rank), lazy, rank)
    ptr_in, e_in = graph.in_edges
    ptr_out, e_out = graph.out_edges
    src, dst = graph.src, graph.dst
    batch = batch_dependent(graph)
    for v in graph.topological_order.tolist():
        if label[v] < 0:
            feeding = src[e_in[ptr_in[v] : ptr_in[v + 1]]]
            if batch[feeding].any():  # the data, not a weight it reads (a tied embedding's)
                feeding = feeding[batch[feeding]]
            parents = label[feeding]
            parents = parents[parents >= 0]
            if parents.size:
                pick = np.argmin(rank[parents]) if backward[v] else np.argmax(rank[parents])
                label[v] = parents[pick]
                if forward[v] and graph.num_nodes:
                    rank[label[v]] = max(rank[label[v]], topo_pos[v])
    for v in graph.topological_order[::-1].tolist():
        if label[v] < 0:
            children = label[dst[e_out[ptr_out[v] : ptr_out[v + 1]]]]
            children = children[children >= 0]
            if children.size:
                label[v] = children[np.argmin(rank[children])]
    alone = np.flatnonzero(label < 0)
    label[alone] = len(names) + np.arange(alone.size)
    return label


def _forward_units(
    graph: OpGraph, n_dev: int, forward: np.ndarray, backward: np.ndarray, topo_pos: np.ndarray
) -> list[np.ndarray]:
    """Layers (:func:`_pipeline_labels`, colocation kept), in the order of their last forward operation
    on the batch.

    The last, not the first: a topological order may run a loss's preparation of its labels, or a
    layer's constants (a causal mask), long before the layer; what the layer computes from the
    batch ends where its output is ready. Sources do not place a layer. A layer with no forward
    operation on the batch goes where its first node comes.
    """
    forward = forward & (np.bincount(graph.dst, minlength=graph.num_nodes) > 0)
    unit_of, units = placement_units(graph, _pipeline_labels(graph, forward, backward, topo_pos, 4 * n_dev))
    first = np.full(len(units), -np.inf)
    np.maximum.at(first, unit_of[forward], topo_pos[forward].astype(np.float64))
    alone = np.isinf(first)
    first[alone] = [topo_pos[units[u]].min() for u in np.flatnonzero(alone)]
    return [units[u] for u in np.argsort(first, kind="stable")]


def _orders(mb_graph: OpGraph, device_of: np.ndarray, key: np.ndarray, n_dev: int) -> list[np.ndarray]:
    """Each device's nodes sorted by ``key``; where that deadlocks (a node waits on one its device runs
    later), the restriction to each device of one topological order that follows ``key`` where it can."""
    orders = []
    by_key = np.lexsort((np.arange(key.shape[0]), key[:, 1], key[:, 0]))
    for d in range(n_dev):
        orders.append(by_key[device_of[by_key] == d])
    try:
        check_order_acyclic(mb_graph, orders)
        return orders
    except InvalidPlanError:
        pass
    rank = np.empty(key.shape[0], dtype=np.int64)
    rank[by_key] = np.arange(key.shape[0])
    # Kahn's algorithm, the ready node of the lowest rank first.
    n = mb_graph.num_nodes
    indegree = np.bincount(mb_graph.dst, minlength=n).tolist()
    ptr, eids = mb_graph.out_edges
    ptr, succ = ptr.tolist(), mb_graph.dst[eids].tolist()
    ranks = rank.tolist()
    ready = [(ranks[v], v) for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    sequence = []
    while ready:
        _, v = heapq.heappop(ready)
        sequence.append(v)
        for w in succ[ptr[v] : ptr[v + 1]]:
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, (ranks[w], w))
    global_order = np.asarray(sequence, dtype=np.int64)
    return [global_order[device_of[global_order] == d] for d in range(n_dev)]


def _given_bounds(graph: OpGraph, units: list[np.ndarray], stages: str, n_dev: int, name: str) -> list[int]:
    """Unit bounds of the stages that ``stages`` names: each name the first layer of a stage after the first.

    A name matches a layer of that name or under it (``layer3`` matches ``layer3.0.conv1``); its stage
    starts at the first unit, in forward order, with such a layer.
    """
    names = [part.strip() for part in stages.split(",")]
    if not all(names):
        raise OptionError(f"{name}: option stages must be layer names separated by commas, got {stages!r}")
    if len(names) + 1 > n_dev:
        raise OptionError(f"{name}: option stages gives {len(names) + 1} stages, but the cluster has {n_dev} devices")
    layer = graph.layer
    bounds = [0]
    for first in names:
        start = next(
            (
                u
                for u, members in enumerate(units)
                if any(layer[v] == first or (layer[v] or "").startswith(first + ".") for v in members.tolist())
            ),
            None,
        )
        if start is None:
            raise OptionError(f"{name}: option stages names {first!r}, which is no layer of the step")
        if start <= bounds[-1]:
            raise OptionError(
                f"{name}: option stages must name layers in forward order, each after the first stage's start; "
                f"{first!r} starts at or before the stage before it"
            )
        bounds.append(start)
    return [*bounds, len(units)]


def check_replicas(cluster: Cluster, replicas: object, microbatches: int, name: str) -> int:
    """``replicas`` as an int, or OptionError in one line: not an integer from 1 to the cluster's devices, or a
    micro-batch count that does not divide into that many groups.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> check_replicas(load_cluster("4xV100-nvlink"), 2, 8, "1f1b")
    2
    >>> check_replicas(load_cluster("4xV100-nvlink"), 2, 5, "1f1b")
    Traceback (most recent call last):
    ...
    placer.errors.OptionError: 1f1b: 5 micro-batches do not divide into 2 replica groups: give a multiple of 2
    """
    n_dev = cluster.num_devices
    if (
        isinstance(replicas, (bool, np.bool_))
        or not isinstance(replicas, (int, np.integer))
        or not 1 <= replicas <= n_dev
    ):
        raise OptionError(f"{name}: option replicas must be an integer from 1 to the {n_dev} devices, got {replicas!r}")
    r = int(replicas)
    if microbatches % r:
        raise OptionError(
            f"{name}: {microbatches} micro-batches do not divide into {r} replica groups: give a multiple of {r}"
        )
    return r


def default_group_microbatches(graph: OpGraph, cluster: Cluster, replicas: int) -> int:
    """The micro-batch count of ``replicas`` pipeline groups given none: twice each group's devices in each
    group, at most the batch's samples rounded down to a multiple of ``replicas``, at least ``replicas``.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g = training_graph(layers=2)
    >>> default_group_microbatches(g.replace(extra={"batch_size": 32}), load_cluster("8xV100-nvlink"), 2)
    16
    >>> default_group_microbatches(g.replace(extra={"batch_size": 7}), load_cluster("8xV100-nvlink"), 2)
    6
    """
    samples = batch_samples(graph)
    wanted = 2 * cluster.num_devices  # twice each group's devices, in each of the groups
    if samples is not None:
        wanted = min(wanted, samples - samples % replicas)
    return max(replicas, wanted)


def pipeline_plan(
    graph: OpGraph, cluster: Cluster, schedule: str, microbatches: int = 0, stages: str = "", replicas: int = 1
) -> Plan:
    """The fastest fitting ``schedule`` pipeline of ``graph`` on ``cluster`` (see the module).

    Parameters
    ----------
    graph, cluster
    schedule : {"gpipe", "1f1b"}
    microbatches : int
        ``m``; 0 chooses twice the devices, at most the batch's samples (one
        micro-batch where the step has no batch input to cut).
    stages : str
        The cut, given rather than searched: the layers that start each stage
        after the first, separated by commas (``"layer2.1,layer4"``: three
        stages on the cluster's first three devices); a name matches a layer
        of that name or under it. Empty: the dynamic programme cuts.
    replicas : int
        Groups of devices, each a pipeline over ``microbatches / replicas``
        consecutive micro-batches (see the module); 1: one pipeline. With
        ``microbatches`` 0, twice each group's devices in each group.

    Returns
    -------
    Plan
        Placing the micro-batched step (its ``rewritten_graph``); ``extra``
        records ``microbatches``, ``schedule``, ``stages`` (group 0's device
        names) and, with replica groups, ``replicas`` and ``groups`` (each
        group's stage devices).

    Raises
    ------
    OptionError
        More micro-batches than samples; ``stages`` naming a layer the step
        lacks, layers out of forward order, or more stages than a group's
        devices; ``replicas`` out of range, or not dividing the micro-batches.
    InfeasibleError
        No cut into contiguous stages (the given one, with ``stages``) gives
        every layer a device of its kinds, links every pair of devices that
        exchange data, and fits memory.
    """
    name = schedule
    n_dev = cluster.num_devices
    if graph.num_nodes == 0:
        return Plan.from_arrays(
            graph,
            cluster,
            np.zeros(0, dtype=np.int64),
            [np.zeros(0, dtype=np.int64)] * n_dev,
            extra={"microbatches": 1, "schedule": schedule, "stages": []},
        )
    r = check_replicas(cluster, replicas, 0, name)
    if microbatches:
        m = check_microbatches(graph, microbatches, name)
    else:
        m = default_microbatches(graph, cluster) if r == 1 else default_group_microbatches(graph, cluster, r)
    check_replicas(cluster, r, m, name)
    group_size, per_group = n_dev // r, m // r  # devices and micro-batches of each group
    mb = microbatch_graph(graph, m, groups=r) if m > 1 else None
    target = mb.graph if mb is not None else graph
    diagnose(target, cluster)  # place() leaves it to an algorithm that cuts the step
    layout = replica_layout(graph, 2)
    per_batch = layout.per_batch if m > 1 else np.zeros(graph.num_nodes, dtype=bool)
    grad_bytes = {g: b for g, b in layout.grad_bytes.items() if per_batch[g[0]]}
    backward = _backward(graph, [u for u, _ in layout.grad_bytes])
    whole_first = ~batch_dependent(graph)
    topo_pos = np.empty(graph.num_nodes, dtype=np.int64)
    topo_pos[graph.topological_order] = np.arange(graph.num_nodes)
    units = _forward_units(graph, n_dev, ~whole_first & ~backward, backward, topo_pos)
    costs = _Costs(graph, cluster, units, m, per_batch, grad_bytes)
    # The step's peak on one device against its outputs: the share of a micro-batch's outputs held at once.
    solo = simulate(graph, cluster, np.zeros(graph.num_nodes, dtype=np.int64), check=False)
    held = float(solo.peak_memory_bytes[0] - graph.param_bytes.sum())
    outputs = float(((graph.output_bytes + graph.temp_bytes) * per_batch).sum())
    liveness = min(1.0, max(held / outputs, 0.05)) if outputs > 0 else 1.0
    linked = cluster.linked

    def build(cut: Stages) -> tuple[np.ndarray, list[np.ndarray]] | None:
        """Placement and orders of the micro-batched step for ``cut``; None where a transfer has no channel."""
        stage_of_unit = np.zeros(len(units), dtype=np.int64)
        for s, (a, b) in enumerate(zip(cut.bounds[:-1], cut.bounds[1:])):
            stage_of_unit[a:b] = s
        stage = stage_of_unit[costs.unit_of]
        original = mb.original if mb is not None else np.arange(graph.num_nodes)
        micro = mb.microbatch if mb is not None else np.full(graph.num_nodes, -1)
        accumulates = mb.accumulates if mb is not None else np.zeros(graph.num_nodes, dtype=bool)
        node_stage = stage[original]
        group = np.maximum(micro, 0) // per_group  # a whole node: group 0's
        device_of = np.asarray(cut.devices, dtype=np.int64)[node_stage] + group * group_size
        if r > 1:  # a colocation group that holds state (batch norm's running statistics) stays on group 0
            for members in target.colocation_groups.values():
                if (group[members] > 0).any():
                    device_of[members] = device_of[members[np.argmin(group[members])]]
        src_d, dst_d = device_of[target.src], device_of[target.dst]
        if not linked[src_d, dst_d].all():
            return None
        k_stages = len(cut.devices)
        slot = np.zeros((k_stages, per_group, 2), dtype=np.int64)  # [stage, micro-batch of the group, backward]
        for s in range(k_stages):
            for t, (k, phase) in enumerate(schedule_sequence(schedule, s, k_stages, per_group)):
                slot[s, k, int(phase == "B")] = t
        whole = ~layout.per_batch[original]
        phase = (backward[original] | accumulates).astype(np.int64)
        first = np.where(whole_first[original], -1, 2 * per_group + 1)
        scheduled = slot[node_stage, np.maximum(micro, 0) % per_group, phase]
        # The add of a later group's sum to the groups' before it waits for theirs: after its own work.
        joins = accumulates & (micro > 0) & (micro % per_group == 0)
        scheduled = np.where(joins, 2 * per_group, scheduled)
        key = np.stack([np.where(whole & ~accumulates, first, scheduled), 2 * topo_pos[original] + accumulates], axis=1)
        return device_of, _orders(target, device_of, key, n_dev)

    def cuts(budget: np.ndarray) -> list[Stages]:
        """The best cut into each number of stages within ``budget``, where one exists."""
        found = (_cut(costs, cluster, schedule, k, per_group, liveness, budget) for k in range(1, group_size + 1))
        return [each for each in found if each is not None]

    def within_group(budget: np.ndarray) -> np.ndarray:
        """``budget`` on group 0's devices; none on the others, which the cut does not choose."""
        return np.where(np.arange(n_dev) < group_size, budget, -1.0)

    budget = within_group(cluster.memory.astype(np.float64))
    if stages:  # the given cut, stage s on device s; one that overflows is refused, not cut again
        bounds = _given_bounds(graph, units, stages, group_size, name)
        candidates = [Stages(bounds, list(range(len(bounds) - 1)), 0.0)]
    else:
        candidates = cuts(budget)
        for factor in RELAXED_BUDGETS:
            if candidates:
                break
            # The memory estimate may be what rules every cut out: the simulator judges cuts a little beyond it.
            budget = within_group(cluster.memory.astype(np.float64) * factor)
            candidates = cuts(budget)
    if not candidates:
        raise InfeasibleError(
            f"{name}: no cut of the layers into contiguous stages, in the cluster's device order, "
            "gives every layer a device of its kinds, links the stages and fits the memory estimate"
        )
    candidates.sort(key=lambda c: (c.estimate_s, len(c.devices)))
    best: tuple[float, Stages, np.ndarray, list[np.ndarray]] | None = None
    overflow = ""
    for cut in candidates[:SIMULATED_CANDIDATES]:
        shrink = budget.copy()
        for _ in range(MEMORY_ROUNDS):
            built = build(cut)
            if built is None:
                overflow = overflow or f"{name}: a transfer between stages has no channel"
                break
            device_of, orders = built
            result = simulate(target, cluster, device_of, orders, check=False)
            if result.fits:
                if best is None or result.makespan_s < best[0]:
                    best = (result.makespan_s, cut, device_of, orders)
                break
            j = int(np.argmax(result.peak_memory_bytes - result.memory_bytes))
            needs, has = shown_sizes(result.peak_memory_bytes[j], cluster.devices[j].memory_bytes)
            overflow = f"{name}: device {cluster.devices[j].name!r} would need {needs} of {has}"
            # An overflowing device shrinks the budget of its stage (group 0's device in its place).
            room = np.minimum(1.0, result.memory_bytes / np.maximum(result.peak_memory_bytes, 1))
            room = room[: r * group_size].reshape(r, group_size).min(axis=0)
            shrink[:group_size] = np.where(room < 1.0, 0.95 * room * shrink[:group_size], shrink[:group_size])
            again = None if stages else _cut(costs, cluster, schedule, len(cut.devices), per_group, liveness, shrink)
            if again is None:
                break
            cut = again
    if best is None:
        raise InfeasibleError(overflow or f"{name}: no pipeline fits")
    _, cut, device_of, orders = best
    names = [d.name for d in cluster.devices]
    return Plan.from_arrays(
        graph,
        cluster,
        device_of,
        orders,
        placed_graph=target if mb is not None else None,
        extra={
            "microbatches": m,
            "schedule": schedule,
            "stages": [names[d] for d in cut.devices],
            **(
                {"replicas": r, "groups": [[names[d + g * group_size] for d in cut.devices] for g in range(r)]}
                if r > 1
                else {}
            ),
        },
    )


@register("gpipe")
def gpipe(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    microbatches: int = 0,
    stages: str = "",
    replicas: int = 1,
) -> Plan:
    """GPipe: contiguous stages balanced by a dynamic programme, every forward then every backward.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (deterministic)
    microbatches : int
        Micro-batches per step; 0 chooses twice the devices, at most the batch's samples.
    stages : str
        The layers that start each stage after the first, separated by commas
        (stage ``s`` on device ``s``); empty: the dynamic programme cuts
        (:func:`pipeline_plan`).
    replicas : int
        Groups of devices, each a pipeline over its share of the micro-batches
        (data parallelism over pipelines, :func:`pipeline_plan`); 1: one pipeline.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = gpipe(training_graph(layers=4), load_cluster("2xV100-nvlink"), microbatches=4)
    >>> plan.extra["microbatches"], plan.extra["schedule"]
    (4, 'gpipe')

    References
    ----------
    Huang et al., GPipe, NeurIPS 2019.
    """
    return pipeline_plan(graph, cluster, "gpipe", microbatches, stages, replicas)


@register("1f1b")
def one_f_one_b(
    graph: OpGraph,
    cluster: Cluster,
    *,
    seed: int = 0,
    time_limit: float | None = None,
    microbatches: int = 0,
    stages: str = "",
    replicas: int = 1,
) -> Plan:
    """1F1B: contiguous stages balanced by a dynamic programme, one forward and one backward in turn.

    Stage ``s`` of ``K`` holds at most ``K - s`` micro-batches' activations.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (deterministic)
    microbatches : int
        Micro-batches per step; 0 chooses twice the devices, at most the batch's samples.
    stages : str
        The layers that start each stage after the first, separated by commas
        (stage ``s`` on device ``s``); empty: the dynamic programme cuts
        (:func:`pipeline_plan`).
    replicas : int
        Groups of devices, each a pipeline over its share of the micro-batches
        (data parallelism over pipelines, :func:`pipeline_plan`); 1: one pipeline.

    Examples
    --------
    The cut given, as a hand-made ``torch.distributed.pipelining`` pipeline has it:

    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = one_f_one_b(training_graph(layers=4), load_cluster("2xV100-nvlink"), microbatches=4, stages="block2")
    >>> sorted({device for node, device in plan.placement.items() if node.endswith("block1.join")})
    ['gpu0']
    >>> sorted({device for node, device in plan.placement.items() if node.endswith("block2.join")})
    ['gpu1']

    References
    ----------
    Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021;
    torch.distributed.pipelining's ``Schedule1F1B``.
    """
    return pipeline_plan(graph, cluster, "1f1b", microbatches, stages, replicas)
