"""FastT's measurement feedback: measured per-node times become the graph's costs.

FastT (Section 4) profiles the running placement and feeds the measured
operation times back into its cost model before it replans; a new placement
is kept only when its measured iteration is faster. Here a node's measured
seconds on a device become its ``compute_s_by_kind`` for that device's kind
(preferred by the reference model over ``compute_s / speed``), through
:func:`placer.cost.profile.apply_profile`. Measured transfers set each link
type's latency (:func:`measured_cluster`), because a message costs more, and
more unevenly, inside a running step than in an idle ping-pong.

Both also go to files, so that a run's measurements outlive it:
:func:`measured_profile` makes the node times a ``placer.profile/1`` profile
(``placer run/tune --profile-output``, applied by ``placer cost --profile``),
and :func:`measured_cluster` gives a ``placer.cluster/1`` cluster
(``--cluster-output``).

References
----------
J. Yi et al., "Optimizing distributed training deployment in heterogeneous
GPU clusters" (FastT), CoNEXT 2020, Section 4.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ..cluster import Cluster
from ..cost.profile import Profile, apply_placed_times
from ..errors import OptionError
from ..graph import OpGraph
from ..plan import BoundPlan
from ..transform.replicate import replica_layout
from ..transform.split import batch_samples, part_rows

__all__ = [
    "measured_graph",
    "measured_cluster",
    "own_times",
    "measured_profile",
    "profile_kind",
    "whole_batch_times",
    "WholeTime",
]


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
    times = whole_batch_times(bound, graph, op_s)
    device_of = np.zeros(graph.num_nodes, dtype=np.int64)
    for node_id, measured in times.items():
        device_of[graph.index[node_id]] = measured.device
    return apply_placed_times(graph, device_of, cluster, {k: t.seconds for k, t in times.items()})


class WholeTime(NamedTuple):
    """A node's measured time for the whole batch, and the device (index) it was measured on."""

    seconds: float
    device: int


def whole_batch_times(bound: BoundPlan, graph: OpGraph, seconds: dict[str, float]) -> dict[str, WholeTime]:
    """Measured times of a plan's nodes as times of ``graph``'s nodes on the whole batch.

    A plan may run copies of ``graph``'s nodes on part of the batch: a
    micro-batch's copy (``node_extra["microbatch_of"]``) on its rows, a
    data-parallel replica's (``"replica_of"``) on its share where the node
    works on the batch (:func:`~placer.transform.replicate.replica_layout`).
    A copy on ``n`` of the batch's ``B`` samples that took ``t`` seconds
    estimates the whole node at ``t * B / n``; a node's estimate is the mean
    of its copies'. Nodes the plan added (accumulations, collectives) and
    parts of split operations stand for no node of ``graph`` and are left out.

    Examples
    --------
    >>> from placer.generate import training_graph
    >>> from placer.cluster import PRESETS
    >>> from placer.algorithms import place
    >>> g, c = training_graph(layers=1), PRESETS["2xV100-nvlink"]()
    >>> plan = place(g, c, "gpipe", microbatches=2)
    >>> times = whole_batch_times(plan.bind(g, c), g, {"mb0/block0.b0.fwd": 1.0, "mb1/block0.b0.fwd": 3.0})
    >>> times["block0.b0.fwd"].seconds
    4.0
    """
    target = bound.graph
    micro = target.extra.get("microbatches") or {}
    total = int(micro.get("total") or 0)
    replicas = int((target.extra.get("data_parallel") or {}).get("replicas", 0))
    per_batch, shares = None, []
    if replicas:
        per_batch = replica_layout(graph, replicas).per_batch
        samples = batch_samples(graph) or replicas
        shares = [(hi - lo) / samples for lo, hi in part_rows(samples, replicas)]
    estimates: dict[str, list[float]] = {}
    device: dict[str, int] = {}
    for node_id, s in seconds.items():
        i = target.index.get(node_id)
        if i is None:
            continue
        extra = target.node_extra[i]
        original, share = node_id, 1.0
        if node_id in graph.index:
            pass
        elif "split_of" in extra:
            continue
        elif "microbatch_of" in extra and total:
            lo, hi = extra["microbatch_rows"]
            original, share = extra["microbatch_of"], (hi - lo) / total
        elif "replica_of" in extra and per_batch is not None:
            original = extra["replica_of"]
            j = graph.index.get(original)
            share = shares[int(extra["replica"])] if j is not None and per_batch[j] else 1.0
        if original not in graph.index:  # an accumulation or a collective's step
            continue
        estimates.setdefault(original, []).append(float(s) / share)
        device.setdefault(original, int(bound.device_of[i]))
    return {k: WholeTime(statistics.fmean(v), device[k]) for k, v in estimates.items()}


def profile_kind(cluster: Cluster, devices: Iterable[int], option: str = "--profile-output") -> str:
    """The one device kind of ``devices`` (indices into ``cluster.devices``): the kind a run's profile times.

    A ``placer.profile/1`` file holds the times of one device kind, so a run over
    devices of several kinds cannot be written as one; :func:`measured_profile`
    asks, and the CLI asks before the run (naming ``option``) so that the run is not lost.

    Raises
    ------
    OptionError
        Where ``devices`` are of several kinds (naming them), or empty.
    """
    kinds = sorted({cluster.devices[d].kind for d in devices})
    if len(kinds) != 1:
        raise OptionError(
            f"{option}: a placer.profile/1 file holds the times of one device kind, and the run's "
            f"devices on cluster {cluster.name!r} are of "
            + (f"{len(kinds)} ({', '.join(map(repr, kinds))})" if kinds else "none")
        )
    return kinds[0]


def measured_profile(bound: BoundPlan, seconds: dict[str, float], graph: OpGraph | None = None, **meta: Any) -> Profile:
    """A run's measured per-node times as a ``placer.profile/1`` profile of the kind of device it ran on.

    The file form of :func:`measured_graph`: applied to ``bound.graph``
    (:func:`placer.cost.profile.apply_profile`, ``placer cost --profile``) it sets the
    same ``compute_s_by_kind`` entries, so that a later plan or ``placer tune`` run starts
    from these times instead of the analytic ones.

    Parameters
    ----------
    bound : BoundPlan
        The plan that was measured.
    seconds : dict of str to float
        Node id -> measured seconds (:func:`own_times` of a run: the node's cost under any plan);
        ids ``graph`` lacks are left out, as :func:`measured_graph` ignores them.
    graph : OpGraph, optional
        The graph the profile is of: the captured graph the plan was bound to, whose
        nodes the plan split then ran as parts (left out: none of them ran whole).
        Default ``bound.graph`` (the rewritten graph where the plan splits operations).
    **meta
        Extra fields of the file (how the times were taken).

    Returns
    -------
    Profile

    Raises
    ------
    OptionError
        Where the measured nodes ran on devices of several kinds (:func:`profile_kind`).
    """
    graph = bound.graph if graph is None else graph
    times = whole_batch_times(bound, graph, seconds)
    kind = profile_kind(bound.cluster, {t.device for t in times.values()})
    return Profile(graph.name, graph.digest(), kind, {k: t.seconds for k, t in times.items()}, dict(meta))


def own_times(op_s: dict[str, float], op_message_s: dict[str, float]) -> dict[str, float]:
    """Each node's measured seconds less the host time of its messages: its cost under any plan.

    ``op_s`` and ``op_message_s`` as :class:`placer.runtime.distributed.DistributedResult` gives them;
    what is left is what :func:`placer.sim.messages.messages_graph` adds a plan's messages to.
    """
    return {k: seconds - op_message_s.get(k, 0.0) for k, seconds in op_s.items()}


def measured_cluster(cluster: Cluster, transfers: Sequence[tuple[int, int, int, float]]) -> Cluster:
    """``cluster`` with each link type's latency set to what its messages took in a run.

    The link keeps its bandwidth (a calibration's, from messages of 1 KiB to
    64 MiB) and takes as latency the mean time a measured transfer took beyond
    ``bytes / bandwidth``. In a running step the per-message cost varies
    several-fold between messages of one size and does not grow with size over
    the few sizes a plan sends, so a line fitted to such points says little of
    the bandwidth. The mean rather than the median, because a step's critical
    path adds these costs up.

    Parameters
    ----------
    cluster : Cluster
        Channels that name a link type in ``extra["link"]`` (the presets do) share its
        measured latency; any other channel takes its own transfers'.
    transfers : sequence of (int, int, int, float)
        ``(source device, destination device, bytes, seconds)``, as
        :attr:`placer.runtime.distributed.DistributedResult.transfer_s` gives.

    Returns
    -------
    Cluster
        Named ``NAME-measured`` (a plan made on it names a cluster of its own, not
        the preset or file it was measured from); a link without measured transfers
        keeps its figures, and a negative mean excess gives a latency of 0. With no
        transfer on its channels, ``cluster`` itself.
    """

    def link_of(ch) -> tuple[str, str]:
        """The channel's link type where it names one (the presets do), else the channel alone."""
        link = ch.extra.get("link")
        return ("link", link) if link is not None else ("channel", ch.name)

    excess: dict[tuple[str, str], list[float]] = {}
    for src, dst, nbytes, seconds in transfers:
        c = cluster.channel_index[src, dst]
        if c >= 0:
            channel = cluster.channels[c]
            excess.setdefault(link_of(channel), []).append(seconds - nbytes / channel.bandwidth_bytes_per_s)
    channels = []
    for ch in cluster.channels:
        times = excess.get(link_of(ch))
        channels.append(
            ch
            if times is None
            else dataclasses.replace(
                ch,
                latency_s=max(0.0, statistics.fmean(times)),
                extra={**ch.extra, "latency_from": "measured in a placed run"},
            )
        )
    if not excess:
        return cluster
    name = cluster.name if cluster.name.endswith("-measured") else f"{cluster.name}-measured"  # once, measured again
    return Cluster(name, cluster.devices, channels, extra=dict(cluster.extra))
