"""Diagnose problems that no plan can solve, before any algorithm tries.

Each check is cheap and conservative: it raises only when no placement at
all can be valid, and its message says which node, group or device is at fault.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from .cluster import Cluster
from .errors import InfeasibleError
from .graph import OpGraph, static_footprint
from .io import shown_sizes
from .paths import bottom_levels, top_levels
from .sim.bounds import fastest_durations
from .transform.replicate import replica_layout
from .transform.split import batch_samples

__all__ = ["diagnose", "static_footprint", "live_memory_bound", "smallest_microbatch"]

#: Most nodes at which :func:`live_memory_bound` counts what must be held (one bit each per node).
LIVE_BOUND_PROBES = 64


def diagnose(graph: OpGraph, cluster: Cluster, *, microbatched: bool = False) -> None:
    """Raise InfeasibleError if no valid plan can exist.

    Checks: a node allowed on no device of the cluster; a node, or a
    colocation group, that cannot fit any device it may use; parameters that
    exceed the cluster's total memory; the memory any plan holds while one
    node runs (:func:`live_memory_bound`) beyond the cluster's total; a
    connected part of the graph whose parameters exceed every set of devices
    that channels connect.

    Parameters
    ----------
    graph, cluster
    microbatched : bool
        Whether the plans to rule out include those of the step cut into any
        number of micro-batches (:mod:`placer.transform.microbatch`): the
        memory checks then count each operation on the batch at its
        smallest micro-batch (:func:`smallest_microbatch`), so that what
        they refuse fits no placement at any micro-batch count.

    Examples
    --------
    >>> from placer.cluster import Cluster, Device
    >>> g = OpGraph(["x", "f"], [0.0, 1.0], [0], [1], [1000], output_bytes=[1000, 1000], param_bytes=[0, 500],
    ...             op=["placeholder", "aten.mm"], extra={"batch_size": 10})
    >>> small = Cluster("small", [Device("d0", "V100", 800)], [])
    >>> diagnose(g, small)
    Traceback (most recent call last):
    ...
    placer.errors.InfeasibleError: node 'f' needs 1.5 KiB, more than any device it may use (800 bytes)
    >>> diagnose(g, small, microbatched=True)            # 500 B of weights and 100 B of one sample's output
    >>> diagnose(g, Cluster("tiny", [Device("d0", "V100", 550)], []), microbatched=True)
    Traceback (most recent call last):
    ...
    placer.errors.InfeasibleError: node 'f' needs 600 bytes even in micro-batches of one sample, more than any device it may use (550 bytes)
    """
    allowed = graph.allowed(cluster)
    memory = cluster.memory
    nowhere = np.flatnonzero(~allowed.any(axis=1))
    if nowhere.size:
        i = nowhere[0]
        kinds = sorted({d.kind for d in cluster.devices})
        raise InfeasibleError(
            f"node {graph.ids[i]!r} may run only on kinds {list(graph.device_kinds[i])}, "
            f"and cluster {cluster.name!r} has only {kinds}"
        )
    held = smallest_microbatch(graph) if microbatched else graph
    even = "" if not microbatched else _ANY_CUT if batch_samples(graph) is None else _EVEN_CUT
    need = static_footprint(held)
    room = np.where(allowed, memory[None, :], 0).max(axis=1) if graph.num_nodes else np.zeros(0)
    over = np.flatnonzero(need > room)
    if over.size:
        i = over[np.argmax(need[over] - room[over])]
        needs, has = shown_sizes(need[i], room[i])
        raise InfeasibleError(f"node {graph.ids[i]!r} needs {needs}{even}, more than any device it may use ({has})")
    for key, members in graph.colocation_groups.items():
        group_allowed = allowed[members].all(axis=0)
        if not group_allowed.any():
            raise InfeasibleError(f"colocation group {key!r} has no device kind allowed for all its nodes")
        group_need = held.param_bytes[members].sum() + (held.output_bytes[members] + held.temp_bytes[members]).max()
        group_room = memory[group_allowed].max()
        if group_need > group_room:
            needs, has = shown_sizes(group_need, group_room)
            raise InfeasibleError(
                f"colocation group {key!r} needs at least {needs}{even}, more than any device it may use ({has})"
            )
    total_params = int(graph.param_bytes.sum())
    if total_params > int(memory.sum()):
        needs, has = shown_sizes(total_params, memory.sum())
        raise InfeasibleError(f"the parameters alone need {needs}, more than the cluster's {has} in total")
    _check_live_memory(held, cluster, even)
    _check_reachability(graph, cluster)


#: How :func:`diagnose` says that a memory check counts the smallest micro-batch.
_EVEN_CUT = " even in micro-batches of one sample"
_ANY_CUT = " in any number of micro-batches"


def smallest_microbatch(graph: OpGraph) -> OpGraph:
    """``graph`` with each operation on the batch holding what it holds at its smallest micro-batch.

    Cut into ``m`` micro-batches (:func:`~placer.transform.microbatch.microbatch_graph`),
    each copy of a batch-proportional node (the replicas' notion,
    :func:`~placer.transform.replicate.replica_layout`) holds its parameters
    (micro-batch 0's copy) and at least ``floor(bytes / B)`` of its output,
    its workspace and each tensor it sends, for a batch of ``B`` samples
    (its rows are at least one sample; with no sample count recorded, ``m``
    is unbounded and this is zero); every other node (parameters,
    optimizer state, the optimizer) holds what it holds whole. The tensors
    between a micro-batch's copies follow the step's structure (a gradient's
    reader reads its sum over the micro-batches, of the gradient's whole
    size, held from the first micro-batch's gradient on). So a lower bound on memory that holds for every placement of this graph
    (a node's footprint, :func:`live_memory_bound`) holds for every
    placement of the step at every micro-batch count, one included.

    Examples
    --------
    >>> g = OpGraph(["x", "f"], [0.0, 1.0], [0], [1], [1000], output_bytes=[1000, 1003], param_bytes=[0, 500],
    ...             op=["placeholder", "aten.mm"], extra={"batch_size": 10})
    >>> small = smallest_microbatch(g)
    >>> small.output_bytes.tolist(), small.param_bytes.tolist(), small.edge_bytes.tolist()
    ([100, 100], [0, 500], [100])
    """
    if graph.num_nodes == 0:
        return graph
    per_batch = replica_layout(graph, 2).per_batch
    if not per_batch.any():
        return graph
    samples = batch_samples(graph)

    def least(values: np.ndarray, shrinks: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.int64)
        return np.where(shrinks, 0 if samples is None else values // samples, values)

    return graph.replace(
        output_bytes=least(graph.output_bytes, per_batch),
        temp_bytes=least(graph.temp_bytes, per_batch),
        edge_bytes=least(graph.edge_bytes, per_batch[graph.src]),
    )


def live_memory_bound(graph: OpGraph, cluster: Cluster) -> tuple[int, int]:
    """A lower bound on the memory any plan holds at one instant, summed over the devices.

    While a node x runs (for a positive time wherever it may run), the
    reference model (FORMATS.md, rule 6) holds every parameter, x's output
    and workspace, and each tensor that an ancestor of x produced and a
    descendant of x reads: the producer's output until its last transfer
    ends, or else a copy on every device that reads it. In a training step
    the loss is such an x, with every activation the backward pass reads:
    no placement, order or split of the batch shrinks them.

    The bound is evaluated at up to ``LIVE_BOUND_PROBES`` nodes of the
    critical path (fastest durations), those with the most bytes crossing
    their position in a topological order; ancestry is propagated as one
    bit per probe.

    Parameters
    ----------
    graph, cluster

    Returns
    -------
    bound : int
        Bytes (the parameters alone if no node qualifies).
    node : int
        The node where it holds, or -1.

    Examples
    --------
    >>> from placer.cluster import PRESETS
    >>> g = OpGraph(["x", "loss", "grad"], [1.0, 1.0, 1.0], [0, 0, 1], [1, 2, 2], [100, 100, 4],
    ...             output_bytes=[100, 4, 100], param_bytes=[0, 0, 10])
    >>> live_memory_bound(g, PRESETS["2xV100-nvlink"]())
    (114, 1)
    """
    params = int(graph.param_bytes.sum())
    fastest = fastest_durations(graph, cluster)
    probes = _live_bound_probes(graph, fastest)
    if probes.size == 0:
        return params, -1
    bit = [0] * graph.num_nodes
    for i, v in enumerate(probes.tolist()):
        bit[v] = 1 << i
    # below[v]: the probes v strictly descends from; above[v]: those it strictly precedes.
    below, above = [0] * graph.num_nodes, [0] * graph.num_nodes
    src, dst = graph.src.tolist(), graph.dst.tolist()
    topological = graph.topological_order.tolist()
    for ptr_eids, ends, into, outwards in ((graph.in_edges, src, below, False), (graph.out_edges, dst, above, True)):
        ptr, eids = (a.tolist() for a in ptr_eids)
        for v in reversed(topological) if outwards else topological:
            reach = 0
            for k in range(ptr[v], ptr[v + 1]):
                u = ends[eids[k]]
                reach |= into[u] | bit[u]
            into[v] = reach
    crossing = np.array(above, dtype=np.uint64)[graph.src] & np.array(below, dtype=np.uint64)[graph.dst]
    # Per (producer, tensor) the largest edge, per producer the sum, capped by its output.
    order = np.lexsort((graph.edge_tensor, graph.src))
    src_sorted, tensor_sorted = graph.src[order], graph.edge_tensor[order]
    key_starts = np.flatnonzero(np.r_[True, (np.diff(src_sorted) != 0) | (np.diff(tensor_sorted) != 0)])
    producer_of_key = src_sorted[key_starts]
    producer_starts = np.flatnonzero(np.r_[True, np.diff(producer_of_key) != 0])
    cap = graph.output_bytes[producer_of_key[producer_starts]]
    nbytes = graph.edge_bytes[order]
    crossing = crossing[order]
    totals = []
    for i, v in enumerate(probes.tolist()):
        held = np.where((crossing >> np.uint64(i)) & np.uint64(1), nbytes, 0)
        per_producer = np.add.reduceat(np.maximum.reduceat(held, key_starts), producer_starts)
        totals.append(int(np.minimum(per_producer, cap).sum()) + int(graph.output_bytes[v] + graph.temp_bytes[v]))
    best = int(np.argmax(totals))
    return params + totals[best], int(probes[best])


def _live_bound_probes(graph: OpGraph, fastest: np.ndarray) -> np.ndarray:
    """Nodes of the critical path that take time everywhere, most bytes across their topological position first."""
    if graph.num_edges == 0:
        return np.zeros(0, dtype=np.int64)
    weight = np.where(np.isfinite(fastest), fastest, 0.0)
    through = top_levels(graph, weight) + bottom_levels(graph, weight)
    on_path = (through >= through.max() * (1 - 1e-9)) & (weight > 0)
    position = np.empty(graph.num_nodes, dtype=np.int64)
    position[graph.topological_order] = np.arange(graph.num_nodes)
    # Bytes of edges spanning each position (an overcount of what is held there, to rank the probes).
    span = np.zeros(graph.num_nodes + 1)
    first, last = position[graph.src], position[graph.dst]
    np.add.at(span, first + 1, graph.edge_bytes)
    np.add.at(span, last, -graph.edge_bytes)
    across = np.cumsum(span)[position]
    candidates = np.flatnonzero(on_path)
    return candidates[np.argsort(-across[candidates], kind="stable")[:LIVE_BOUND_PROBES]]


def _check_live_memory(graph: OpGraph, cluster: Cluster, even: str = "") -> None:
    total = int(cluster.memory.sum())
    # The bound never exceeds every parameter, output and workspace at once: skip it when those fit.
    if int(graph.param_bytes.sum() + graph.output_bytes.sum() + graph.temp_bytes.max(initial=0)) <= total:
        return
    bound, node = live_memory_bound(graph, cluster)
    if bound > total:
        holds, has = shown_sizes(bound, total)
        raise InfeasibleError(
            f"while node {graph.ids[node]!r} runs, any plan holds at least {holds} over all devices{even} "
            f"(every parameter, and each tensor made before it and read after it), more than the cluster's "
            f"{has} in total"
        )


def _check_reachability(graph: OpGraph, cluster: Cluster) -> None:
    """Refuse a graph whose connected parts cannot fit any set of devices that channels connect.

    Transfers go over one channel, never through a third device, so two
    nodes joined by an edge sit on one device or on two that a channel
    joins: the devices of one weakly connected part of the graph lie in one
    connected part of the channels' graph (a pipeline needs channels only
    between neighbouring stages, so nothing stronger holds in general).
    """
    unreachable = cluster.unreachable_pairs()
    if not unreachable or graph.num_nodes == 0:
        return
    reach = nx.Graph()
    reach.add_nodes_from(range(cluster.num_devices))
    joined = (cluster.channel_index >= 0) | (cluster.channel_index.T >= 0)
    reach.add_edges_from(zip(*np.nonzero(np.triu(joined, 1))))
    room = max(int(cluster.memory[sorted(c)].sum()) for c in nx.connected_components(reach))
    parts = nx.connected_components(nx.Graph(zip(graph.src.tolist(), graph.dst.tolist())))
    for part in parts:
        need = int(graph.param_bytes[sorted(part)].sum())
        if need > room:
            a, b = unreachable[0]
            needs, has = shown_sizes(need, room)
            raise InfeasibleError(
                f"devices {a!r} and {b!r} (and maybe others) have no channel between them; the connected part "
                f"of the graph around node {graph.ids[min(part)]!r} needs {needs} of parameters, more than any "
                f"set of devices that channels connect ({has})"
            )
