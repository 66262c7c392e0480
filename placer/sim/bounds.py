"""Lower bound on the makespan of any plan (FORMATS.md, "Lower bound")."""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph
from ..paths import critical_path_length
from ..plan import Plan
from ..transform.replicate import replica_layout
from ..transform.split import batch_samples

__all__ = ["lower_bound", "plan_lower_bound", "fastest_durations", "microbatch_lower_bound"]


def fastest_durations(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Each node's time on its fastest allowed device (inf if no device allows it)."""
    dur = np.where(graph.allowed(cluster), graph.durations(cluster), np.inf)
    return dur.min(axis=1) if graph.num_nodes else np.zeros(0)


def lower_bound(graph: OpGraph, cluster: Cluster, *, splits: bool = False) -> float:
    """``max(longest path at fastest times with free transfers, total fastest time / devices)``.

    No plan that runs every operation whole can beat it: the critical path
    must run in sequence, and all work must be shared among the devices.

    With ``splits=True`` it bounds plans that split operations too (OS-DPOS,
    data parallelism): a split shortens the critical path but never the total
    work, so only the work term remains.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["a", "b", "c"], [1.0, 1.0, 1.0], [0], [1], [0])
    >>> lower_bound(g, PRESETS["2xV100-nvlink"]())
    2.0
    """
    fastest = fastest_durations(graph, cluster)
    if fastest.size == 0:
        return 0.0
    work = float(fastest.sum()) / cluster.num_devices
    return work if splits else max(critical_path_length(graph, fastest), work)


def plan_lower_bound(plan: Plan, graph: OpGraph, cluster: Cluster) -> float:
    """The lower bound that holds for ``plan`` of ``graph``: :func:`lower_bound` with ``splits`` where it rewrites it.

    A plan that splits operations or replicates the step shortens the graph's
    critical path, so only the work term bounds it; any other plan gets the
    full bound.

    >>> from placer.cluster import load_cluster
    >>> from placer.generate import training_graph
    >>> g, c = training_graph(layers=2), load_cluster("2xcpu")
    >>> plan_lower_bound(Plan({i: "cpu0" for i in g.ids}), g, c) == lower_bound(g, c)
    True
    """
    return lower_bound(graph, cluster, splits=plan.rewrites_graph)


def microbatch_lower_bound(
    graph: OpGraph, cluster: Cluster, microbatches: int, per_batch: np.ndarray | None = None
) -> float:
    """No plan of ``graph`` cut into ``microbatches`` micro-batches (any placement, order or schedule) beats this.

    ``max(total fastest time / devices, longest path of one micro-batch)``:
    the micro-batched step (:func:`~placer.transform.microbatch.microbatch_graph`)
    shares each batch-proportional node's time among its copies by their
    rows, so its work is the step's (plus the accumulations), and the
    largest micro-batch's copies, ``ceil(B / m)`` of the ``B`` samples
    (``1 / m`` of the batch where the graph records no samples), with the
    nodes that stay whole form a path at least as long as the step's longest
    path at those shares (a gradient's reader waits for its accumulation
    too). Cheap next to building the micro-batched step: ``auto`` skips a
    micro-batch count that cannot beat the plan in hand.

    Parameters
    ----------
    graph, cluster
    microbatches : int
        ``m`` >= 1.
    per_batch : ndarray of bool, optional
        The batch-proportional nodes (``replica_layout(graph, 2).per_batch``), if known.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["x", "f", "g"], [0.0, 4.0, 4.0], [0, 1], [1, 2], [8, 8], op=["placeholder", "f", "g"],
    ...             extra={"batch_size": 4})
    >>> c = PRESETS["2xV100-nvlink"]()
    >>> lower_bound(g, c), microbatch_lower_bound(g, c, 1), microbatch_lower_bound(g, c, 4)
    (8.0, 8.0, 4.0)
    """
    fastest = fastest_durations(graph, cluster)
    if fastest.size == 0:
        return 0.0
    if per_batch is None:
        per_batch = replica_layout(graph, 2).per_batch
    samples = batch_samples(graph)
    share = 1.0 / microbatches if samples is None else -(-samples // microbatches) / samples
    chain = critical_path_length(graph, np.where(per_batch, fastest * min(1.0, share), fastest))
    return max(lower_bound(graph, cluster, splits=True), chain)
