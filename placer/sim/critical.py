"""The critical path of a simulated step: the chain of operations and transfers that ended it.

Several searches aim their moves at it: Celeritas's refinement and Pesto's
windows move what lies on it, ``auto``'s local search and OS-DPOS pick the
operations to move or split from it; Pesto's windows also read every job's
tail (:func:`schedule_tails`), how far it lies from the step's end. It is a property of a schedule, so it
lives beside the simulator that makes one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .simulator import SimResult

__all__ = ["CriticalLink", "critical_path", "critical_path_nodes", "schedule_tails"]


class CriticalLink(NamedTuple):
    """One step back along a simulated step's critical path: ``node`` started when ``before`` let it.

    ``kind`` is "device" (``before`` ran just before it on its device), "local" (``before`` produced an
    input on the same device), "transfer" (``before`` produced an input on another device; ``transfer``
    indexes :attr:`SimResult.transfers`, -1 otherwise) or "start" (nothing held it back; ``before`` -1).
    """

    node: int
    kind: str
    before: int
    transfer: int


def critical_path(result: SimResult, *, ties: str = "device") -> list[CriticalLink]:
    """The chain of operations and transfers that ends the simulated step, from its last operation back.

    From the operation that ends last, each step goes back to what its start
    waited for: the input that arrived last (an operation on the same device,
    or a transfer from another) or the operation before it on its device,
    whichever ended at the instant it started. Where both did, ``ties`` says
    which is taken: ``"device"`` makes a transfer on the path one that really
    made its reader wait (what moves that shorten transfers want), ``"input"``
    follows the data (what moves that regroup producers and consumers want).
    The walk ends at an operation that nothing held back.

    Parameters
    ----------
    result : SimResult
    ties : {"device", "input"}

    Returns
    -------
    list of CriticalLink
        Latest first; the last link's ``kind`` is "start".

    Raises
    ------
    ValueError
        An unknown ``ties``.

    Examples
    --------
    ``a`` on gpu0 feeds ``b`` on gpu1 (25 MB, 1.01 ms) and ``c`` on gpu0:

    >>> from placer.cluster import load_cluster
    >>> from placer.graph import OpGraph
    >>> from placer.sim.simulator import simulate
    >>> g = OpGraph(["a", "b", "c"], [1e-3, 2e-3, 1e-3], [0, 0], [1, 2], [25_000_000, 8])
    >>> r = simulate(g, load_cluster("2xV100-nvlink"), [0, 1, 0])
    >>> [(g.ids[link.node], link.kind) for link in critical_path(r)]
    [('b', 'transfer'), ('a', 'start')]
    """
    if ties not in ("device", "input"):
        raise ValueError(f"ties must be 'device' or 'input', got {ties!r}")
    graph, n = result.graph, result.graph.num_nodes
    if n == 0:
        return []
    before_on_device = np.full(n, -1, dtype=np.int64)
    for order in result.device_orders():
        before_on_device[order[1:]] = order[:-1]
    ptr, in_edges = graph.in_edges
    transfer_of = result.transfers.rows()
    start, finish, device = result.start.tolist(), result.finish.tolist(), result.device_of.tolist()
    ends = result.transfers.end.tolist()
    src, tensor = graph.src.tolist(), graph.edge_tensor.tolist()
    ptr_l, in_l, before_l = ptr.tolist(), in_edges.tolist(), before_on_device.tolist()
    v = int(np.argmax(result.finish))
    path: list[CriticalLink] = []
    while True:
        arrived, link = -np.inf, None
        for e in in_l[ptr_l[v] : ptr_l[v + 1]]:
            u = src[e]
            if device[u] == device[v]:
                at, candidate = finish[u], CriticalLink(v, "local", u, -1)
            else:
                x = transfer_of[(u, tensor[e], device[v])]
                at, candidate = ends[x], CriticalLink(v, "transfer", u, x)
            if at > arrived:
                arrived, link = at, candidate
        b = before_l[v]
        input_held = link is not None and arrived >= start[v]
        device_held = b >= 0 and finish[b] >= start[v]
        if device_held and (not input_held or (ties == "device" and finish[b] >= arrived)):
            link = CriticalLink(v, "device", b, -1)
        elif not input_held:
            path.append(CriticalLink(v, "start", -1, -1))
            return path
        path.append(link)
        v = link.before


def critical_path_nodes(result: SimResult) -> np.ndarray:
    """The operations on :func:`critical_path` (following the data on ties), earliest first.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.graph import OpGraph
    >>> from placer.sim.simulator import simulate
    >>> g = OpGraph(["a", "b", "c"], [1e-3, 2e-3, 1e-3], [0, 0], [1, 2], [25_000_000, 8])
    >>> critical_path_nodes(simulate(g, load_cluster("2xV100-nvlink"), [0, 1, 0])).tolist()
    [0, 1]
    """
    return np.asarray([link.node for link in reversed(critical_path(result, ties="input"))], dtype=np.int64)


def schedule_tails(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Per operation and per transfer, the longest chain of jobs from its start to the end of the step.

    The chain follows the incumbent schedule's dependencies: an operation
    precedes its consumers on its device, its transfers and the next
    operation on its device; a transfer precedes the consumers it feeds and
    the next transfer on its channel. ``start + tail`` equals the makespan
    exactly for the jobs without slack, and ``makespan - tail`` is a job's
    latest start that keeps the makespan when everything after it runs as
    soon as the order lets it.

    Returns
    -------
    (node_tail, transfer_tail) : ndarray, ndarray
        Seconds.

    Examples
    --------
    >>> from placer.cluster import load_cluster
    >>> from placer.graph import OpGraph
    >>> from placer.sim.simulator import simulate
    >>> g = OpGraph(["a", "b", "c"], [1e-3, 2e-3, 1e-3], [0, 0], [1, 2], [8, 8])
    >>> r = simulate(g, load_cluster("2xV100-nvlink"), [0, 0, 0])
    >>> tails, _ = schedule_tails(r)
    >>> bool(np.allclose(r.start + tails, r.makespan_s))
    True
    """
    g, n = result.graph, result.graph.num_nodes
    xf = result.transfers
    n_x = len(xf)
    dur = (result.finish - result.start).tolist()
    xdur = (xf.end - xf.start).tolist()
    dev = result.device_of
    local = dev[g.src] == dev[g.dst]
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(g.src[local].tolist(), g.dst[local].tolist()):
        succ[u].append(v)
    x_of: list[list[int]] = [[] for _ in range(n)]
    for x, u in enumerate(xf.producer.tolist()):
        x_of[u].append(x)
    rows = xf.rows()
    x_dst: list[list[int]] = [[] for _ in range(n_x)]
    for e in np.flatnonzero(~local).tolist():
        x_dst[rows[(int(g.src[e]), int(g.edge_tensor[e]), int(dev[g.dst[e]]))]].append(int(g.dst[e]))
    next_on_device = np.full(n, -1, dtype=np.int64)
    for seq in result.device_orders():
        next_on_device[seq[:-1]] = seq[1:]
    next_on_channel = np.full(n_x, -1, dtype=np.int64)
    for c in np.unique(xf.channel).tolist():
        on = np.flatnonzero(xf.channel == c)
        on = on[np.lexsort((on, xf.start[on]))]
        next_on_channel[on[:-1]] = on[1:]
    # Jobs latest first; a transfer sits just after its producer, ties by the order operations started.
    rank = result.start_rank.astype(np.float64)
    keys_start = np.concatenate([result.start, xf.start])
    keys_rank = np.concatenate([rank, rank[xf.producer] + 0.5])
    jobs = np.lexsort((-keys_rank, -keys_start)).tolist()
    tail = [0.0] * n
    xtail = [0.0] * n_x
    nxt_d, nxt_c = next_on_device.tolist(), next_on_channel.tolist()
    for j in jobs:
        if j < n:
            after = 0.0
            for v in succ[j]:
                after = max(after, tail[v])
            for x in x_of[j]:
                after = max(after, xtail[x])
            if nxt_d[j] >= 0:
                after = max(after, tail[nxt_d[j]])
            tail[j] = dur[j] + after
        else:
            x = j - n
            after = 0.0
            for v in x_dst[x]:
                after = max(after, tail[v])
            if nxt_c[x] >= 0:
                after = max(after, xtail[nxt_c[x]])
            xtail[x] = xdur[x] + after
    return np.asarray(tail), np.asarray(xtail)
