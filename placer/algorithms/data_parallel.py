"""Data parallelism, FastT's main baseline: a replica per device, 1/n of the batch each, ring all-reduce."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..errors import InfeasibleError, OptionError
from ..graph import OpGraph
from ..io import shown_sizes
from ..paths import top_levels
from ..plan import Plan
from ..sim.simulator import simulate
from ..transform.replicate import (
    COLLECTIVES,
    DataParallelGraph,
    collective_cost,
    collective_stages,
    data_parallel_graph,
    input_transfers,
    replica_layout,
)
from ..transform.split import batch_samples
from .registry import register

__all__ = [
    "data_parallel",
    "sharded_data_parallel",
    "replica_devices",
    "replica_hosts",
    "data_parallel_schedule",
    "data_parallel_lower_bound",
]

#: The ``collective`` option's values: one of :data:`~placer.transform.replicate.COLLECTIVES`, or the
#: fastest of them for the case.
COLLECTIVE_CHOICES = COLLECTIVES + ("best",)


def replica_devices(graph: OpGraph, cluster: Cluster) -> list[int]:
    """Devices that may run every node of the step (device kinds), in cluster order."""
    allowed = graph.allowed(cluster)
    return np.flatnonzero(allowed.all(axis=0)).tolist() if graph.num_nodes else list(range(cluster.num_devices))


def replica_hosts(cluster: Cluster, devices: list[int]) -> list[list[int]]:
    """The replicas (indices into ``devices``) of each host, for a ``direct`` collective.

    A host is a set of devices joined by links of their own, one channel per
    pair (NVLink); devices that reach each other only over a channel shared
    by several pairs (a network, NVSwitch or PCIe egress) are on different
    hosts. Where that leaves hosts of different sizes, every replica is one host's.
    """
    from scipy.sparse import csr_matrix  # deferred: imports scipy
    from scipy.sparse.csgraph import connected_components  # deferred: imports scipy

    r = len(devices)
    own_link = np.zeros((r, r), dtype=bool)
    for a in range(r):
        for b in range(r):
            c = int(cluster.channel_index[devices[a], devices[b]])
            own_link[a, b] = a != b and c >= 0 and len(cluster.channels[c].pairs) == 1
    count, label = connected_components(csr_matrix(own_link), directed=True, connection="weak")
    groups = sorted(np.flatnonzero(label == h).tolist() for h in range(count))
    return groups if len({len(g) for g in groups}) == 1 else [[k] for k in range(r)]


def data_parallel_lower_bound(
    graph: OpGraph, cluster: Cluster, *, shard_optimizer: bool = False, collective: str = "ring"
) -> float:
    """No data-parallel plan of ``graph`` on ``cluster`` is faster than this; far cheaper than building one.

    The longest of: the busiest replica device (its share of the batch, the
    whole optimizer and its all-reduce additions, one at a time), the busiest
    channel of the collective (a channel carries one transfer at a time) after
    the earliest a gradient can be ready, and a replica's own critical path.
    These busy times are those the plan's simulation shows, so the bound is
    tight where the all-reduce dominates, and ``auto`` can skip a plan that
    cannot win without building it.

    Returns ``inf`` where no device may hold a replica or a transfer of the
    collective has no channel. ``shard_optimizer`` bounds
    :func:`sharded_data_parallel`'s plans instead; ``collective="best"`` the
    fastest collective's.

    Examples
    --------
    >>> from placer.algorithms import place
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g, c = training_graph(layers=2), load_cluster("2xV100-nvlink")
    >>> data_parallel_lower_bound(g, c) <= place(g, c, "data_parallel").predicted["makespan_s"]
    True
    """
    names = COLLECTIVES if collective == "best" else (collective,)
    return min(_collective_lower_bounds(graph, cluster, shard_optimizer, names).values())


def _collective_lower_bounds(
    graph: OpGraph, cluster: Cluster, shard_optimizer: bool, collectives: tuple[str, ...]
) -> dict[str, float]:
    """:func:`data_parallel_lower_bound` of each of ``collectives``, sharing the replicas' own work."""
    devices = replica_devices(graph, cluster)
    if not devices:
        return {name: float("inf") for name in collectives}
    r = len(devices)
    layout = replica_layout(graph, r, shard_optimizer=shard_optimizer)
    share = graph.durations(cluster)[:, devices] * layout.factor[:, None]
    fastest = share.min(axis=1)
    finish = top_levels(graph, fastest) + fastest
    # Every transfer of the collective follows some gradient's producer.
    first_gradient = min((finish[u] for bucket in layout.buckets for u, _ in bucket), default=0.0)
    hosts = replica_hosts(cluster, devices)

    def bound(collective: str) -> float:
        busy = share.sum(axis=0)
        channel_busy = np.zeros(len(cluster.channels))
        step_times = []
        for b in range(len(layout.buckets)):
            stages, _ = collective_stages(layout, b, collective, hosts)
            for stage in stages:
                step_times.append(layout.stage_compute(stage))
                for k in range(r):
                    for q, nbytes in input_transfers(stage, k):
                        c = int(cluster.channel_index[devices[q], devices[k]])
                        if c < 0:
                            return float("inf")
                        channel_busy[c] += cluster.channels[c].transfer_s(nbytes)
        if step_times:
            steps = OpGraph(
                [f"stage{i}" for i in range(len(step_times))],
                [t for t, _ in step_times],
                [],
                [],
                [],
                compute_s_by_kind=[by_kind for _, by_kind in step_times],
            )
            busy = busy + steps.durations(cluster)[:, devices].sum(axis=0)
        return float(max(finish.max(initial=0.0), busy.max(), first_gradient + channel_busy.max(initial=0.0)))

    return {name: bound(name) for name in collectives}


def data_parallel_schedule(
    graph: OpGraph, cluster: Cluster, *, shard_optimizer: bool = False, collective: str = "ring"
) -> tuple[DataParallelGraph, np.ndarray, list[np.ndarray]]:
    """The data-parallel graph over every device that may hold a replica, its placement and order.

    Replica ``k`` (with its all-reduce steps) goes to the ``k``-th such device;
    each device runs its nodes in the order the reference model's
    earliest-ready rule gives, which the plan then fixes. ``collective="best"``
    builds the graph with each collective whose lower bound
    (:func:`data_parallel_lower_bound`) could beat the step in hand, and keeps
    the fastest that fits.

    Raises
    ------
    OptionError
        An unknown ``collective``, or a step cut into micro-batches.
    InfeasibleError
        If no device may run every node, the batch has fewer samples than the
        devices (:func:`~placer.transform.split.batch_samples`), a replica does not fit one device,
        or the collective sends between devices that no channel connects.
    """
    name = "sharded_data_parallel" if shard_optimizer else "data_parallel"
    if collective not in COLLECTIVE_CHOICES:
        raise OptionError(
            f"option collective of {name!r} must be one of {', '.join(COLLECTIVE_CHOICES)}, got {collective!r}"
        )
    if int((graph.extra.get("microbatches") or {}).get("count", 1)) > 1:
        raise OptionError(
            f"{name}: the step is cut into {graph.extra['microbatches']['count']} micro-batches; replicas of a "
            "micro-batched step do not run (the runtime runs replicas or micro-batches): plan without microbatches, "
            "or with 1f1b or gpipe and their option replicas (data parallelism over pipelines)"
        )
    devices = replica_devices(graph, cluster)
    if not devices:
        raise InfeasibleError(f"{name}: no device may run every node of the step (device kinds)")
    rows = batch_samples(graph)
    if rows is not None and rows < len(devices):
        raise InfeasibleError(
            f"{name}: the batch has {rows} sample{'s' if rows > 1 else ''}, fewer than "
            f"the {len(devices)} replicas (one per device) to share it"
        )
    hosts = replica_hosts(cluster, devices)
    cost = collective_cost(cluster, devices)
    kinds = [collective]
    if collective == "best":  # the most promising first; one whose lower bound cannot win is not built
        bounds = _collective_lower_bounds(graph, cluster, shard_optimizer, COLLECTIVES)
        kinds = sorted(COLLECTIVES, key=bounds.__getitem__)
    best, unlinked = None, []
    for kind in kinds:
        if best is not None and best[2].fits and bounds[kind] >= best[2].makespan_s:
            continue
        dp = data_parallel_graph(
            graph, len(devices), shard_optimizer=shard_optimizer, collective=kind, hosts=hosts, collective_cost=cost
        )
        device_of = np.asarray(devices, dtype=np.int64)[dp.replica]
        src, dst = device_of[dp.graph.src], device_of[dp.graph.dst]
        missing = np.flatnonzero((src != dst) & (cluster.channel_index[src, dst] < 0))
        if missing.size:  # devices not all linked: the collective's pattern needs a channel there is not
            a, b = (cluster.devices[j].name for j in (src[missing[0]], dst[missing[0]]))
            unlinked.append(f"the {kind} all-reduce sends from {a!r} to {b!r}, which no channel connects")
            continue
        result = simulate(dp.graph, cluster, device_of, check=False)
        if best is None or (result.fits, -result.makespan_s) > (best[2].fits, -best[2].makespan_s):
            best = (dp, device_of, result)
    if best is None:
        raise InfeasibleError(f"{name}: " + "; ".join(unlinked))
    dp, device_of, result = best
    if not result.fits:
        j = int(np.argmax(result.peak_memory_bytes - result.memory_bytes))
        needs, has = shown_sizes(result.peak_memory_bytes[j], cluster.devices[j].memory_bytes)
        raise InfeasibleError(
            f"{name}: a replica on 1/{len(devices)} of the batch does not fit one device: "
            f"{cluster.devices[j].name!r} would need {needs} of {has}"
        )
    return dp, device_of, result.device_orders()


@register("data_parallel")
def data_parallel(
    graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None, collective: str = "ring"
) -> Plan:
    """Data parallelism: every device runs a replica on 1/n of the batch; gradients are all-reduced.

    The plan places the data-parallel graph (:func:`~placer.transform.replicate.data_parallel_graph`,
    strong scaling: the global batch stays fixed), carried as
    ``rewritten_graph``. The all-reduce's transfers use the cluster's channels,
    so its congestion counts. Devices whose kind some node may not use hold no replica.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (deterministic, immediate)
    collective : {"ring", "direct", "best"}
        How the gradients are reduced: NCCL's ring (the default, as PyTorch
        DDP), direct exchanges within each host then between hosts
        (:func:`~placer.transform.replicate.collective_stages`), or whichever
        gives the faster step.

    Returns
    -------
    Plan
        Placement and order of the replicated graph; ``extra["replicas"]`` is their number.

    Raises
    ------
    OptionError
        An unknown ``collective``, or a step cut into micro-batches.
    InfeasibleError
        If no device may run every node, or a replica does not fit one device.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> plan = data_parallel(training_graph(layers=2), load_cluster("2xV100-nvlink"))
    >>> plan.extra["replicas"], len(plan.placement) > 2 * 24
    (2, True)

    References
    ----------
    Yi et al., FastT, CoNEXT 2020, Section 6 (data parallelism as the baseline,
    Table 1 under strong scaling); Li et al., PyTorch Distributed, VLDB 2020.
    """
    return _replica_plan(graph, cluster, shard_optimizer=False, collective=collective)


@register("sharded_data_parallel")
def sharded_data_parallel(
    graph: OpGraph, cluster: Cluster, *, seed: int = 0, time_limit: float | None = None, collective: str = "ring"
) -> Plan:
    """Data parallelism with the optimizer sharded across the replicas (ZeRO stage 1).

    As :func:`data_parallel`, but each bucket of gradients is reduce-scattered,
    every replica updates only its 1/n of each parameter and holds 1/n of the
    optimizer's state, and the updated parameters are all-gathered. The ring
    carries the same bytes; the optimizer's time and state shrink n-fold, which
    matters under strong scaling, where each replica's share of the batch
    shrinks but a replicated optimizer does not.

    Parameters
    ----------
    graph, cluster
    seed, time_limit : ignored (deterministic, immediate)
    collective : {"ring", "direct", "best"}
        As for :func:`data_parallel`.

    Returns
    -------
    Plan
        Placement and order of the replicated graph
        (:func:`~placer.transform.replicate.data_parallel_graph` with
        ``shard_optimizer=True``); ``extra["replicas"]`` is their number.

    Raises
    ------
    OptionError
        An unknown ``collective``, or a step cut into micro-batches.
    InfeasibleError
        If no device may run every node, or a replica does not fit one device.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g, c = training_graph(layers=2), load_cluster("4xV100-nvlink")
    >>> plan = sharded_data_parallel(g, c)
    >>> plan.extra["replicas"], plan.rewritten_graph.extra["data_parallel"]["sharded_optimizer"]
    (4, True)

    References
    ----------
    Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
    Models", SC 2020, Section 5.1 (optimizer state partitioning, P_os). As in DeepSpeed,
    each replica owns a contiguous 1/n of every flattened bucket (PyTorch's
    ``ZeroRedundancyOptimizer`` gives each rank whole parameters instead).
    """
    return _replica_plan(graph, cluster, shard_optimizer=True, collective=collective)


def _replica_plan(graph: OpGraph, cluster: Cluster, *, shard_optimizer: bool, collective: str) -> Plan:
    dp, device_of, orders = data_parallel_schedule(
        graph, cluster, shard_optimizer=shard_optimizer, collective=collective
    )
    return Plan.from_arrays(
        graph, cluster, device_of, orders, placed_graph=dp.graph, extra={"replicas": int(dp.replica.max(initial=0)) + 1}
    )
