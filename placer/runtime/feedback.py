"""FastT's measurement feedback: measured per-node times become the graph's costs.

FastT (Yi et al., "Optimizing distributed training deployment in heterogeneous
GPU clusters", CoNEXT 2020, Section 4) profiles the running placement and
feeds the measured operation times back into its cost model before it
replans; a new placement is kept only when its measured iteration is faster.
Here a node's measured seconds on a device become its ``compute_s_by_kind``
for that device's kind (the reference model prefers them over the analytic
``compute_s / speed``), through :func:`placer.cost.profile.apply_profile`;
measured transfers refit each link type's latency and bandwidth, through
:func:`placer.cost.calibrate.fit_link` and ``apply_calibration``: in a running
step a message costs more than in an idle ping-pong (on the lent 16-core
machine, about 0.13 to 0.36 ms from a producer's end to its consumer's start
against 0.03 to 0.08 ms calibrated, docs/benchmarks.md "Fidelity").
"""

from __future__ import annotations

import statistics
from typing import Sequence

from ..cluster import Cluster
from ..cost.calibrate import Calibration, LinkFit, apply_calibration, fit_link
from ..cost.profile import Profile, apply_profile
from ..errors import PlacerError
from ..graph import OpGraph
from ..plan import BoundPlan

__all__ = ["measured_graph", "measured_cluster"]


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
    """``cluster`` with each link type's latency and bandwidth fitted to measured transfers.

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
        Where a link's transfers cannot be fitted by a line (one size, or times
        that do not grow with size over the sizes seen, as with a few messages
        of similar sizes), it keeps its bandwidth and takes as latency the
        median time its transfers took beyond it: the per-message cost is what
        such a run measures best. A link without transfers keeps its figures.
    """
    samples: dict[str, list[tuple[int, float]]] = {}
    bandwidth: dict[str, float] = {}
    for src, dst, nbytes, seconds in transfers:
        c = cluster.channel_index[src, dst]
        link = cluster.channels[c].extra.get("link") if c >= 0 else None
        if link is not None:
            samples.setdefault(link, []).append((nbytes, seconds))
            bandwidth.setdefault(link, cluster.channels[c].bandwidth_bytes_per_s)
    links = {}
    for link, points in samples.items():
        try:
            links[link] = fit_link([b for b, _ in points], [t for _, t in points], link)
        except PlacerError:
            latency = statistics.median(t - b / bandwidth[link] for b, t in points)
            links[link] = LinkFit(max(0.0, latency), bandwidth[link], r2=0.0, samples=list(points))
    return apply_calibration(cluster, Calibration(links, {"source": "measured in a placed run"})) if links else cluster
