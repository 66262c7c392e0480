"""Colocation passes: each layer on one device; each operation with its only consumer.

Colocate each layer: keep a layer's forward, backward and update on one device.

A training step's backward pass reads the activations its layer's forward
pass made. Where a placement splits a layer, those activations are copied to
the other device, and until the backward pass reads them they are held on
both; a memory-bound placement that spreads the forward pass over devices can
need more memory in all than one device would. Colocating every layer (the
``layer`` of each node: its module, as capture records it for forward,
backward and optimizer operations alike) leaves copies only where one layer
hands its output to the next. The list schedulers fall back on it when their
own placements overflow memory
(:func:`~placer.algorithms.list_scheduling.schedule_with_memory_retries`).

Colocate sole consumers: Baechi's co-placement (:func:`colocate_sole_consumers`),
an option of its placers.

Contract (:data:`COLOCATION_ENSURES`): a colocation pass changes no node,
edge or cost, only the ``colocation`` labels, and only by joining groups:
the new groups are the connected pieces of "same group before, or tied by
the pass", so every original group lies inside one new group and any
placement of the new graph is one of the original. Registered as
``colocate_layers`` and ``colocate_sole_consumers``
(:func:`~placer.transform.base.apply_transform`).
"""

from __future__ import annotations

import numpy as np

from ..cluster import Cluster
from ..graph import OpGraph, joined_groups
from .base import SAME, Ensures, TransformResult, register_transform

__all__ = [
    "colocate_layers",
    "colocate_sole_consumers",
    "colocate_layers_transform",
    "colocate_sole_consumers_transform",
]


def colocate_layers(graph: OpGraph) -> OpGraph | None:
    """The graph with every layer, and every colocation group it joins, in one colocation group.

    A layer's replicas in a data-parallel graph (``node_extra["replica"]``)
    and the parts of a split operation (``node_extra["part"]``) count as
    layers of their own, so that colocating does not undo the rewrite. An
    operation with ``device_kinds`` keeps out of its layer's group (a CPU-only
    and a GPU-only operation of one layer could run nowhere together).

    The new groups are the connected pieces of the relation "same layer key
    (layer, replica, part), or same original group", built by union-find
    (:func:`~placer.graph.joined_groups`): two nodes of one original group are
    joined, so the group stays whole; nodes, edges and costs are untouched.

    Parameters
    ----------
    graph : OpGraph

    Returns
    -------
    OpGraph or None
        The same nodes and edges with a new ``colocation`` (``"layer<k>"``
        for each group of two or more nodes); None when no two nodes share a
        layer (nothing to colocate).

    Examples
    --------
    >>> g = OpGraph(["fc.fwd", "relu", "fc.bwd", "fc.update"], [1.0] * 4, [0, 1, 2], [1, 2, 3], [4, 4, 4],
    ...             layer=["fc", None, "fc", "fc"], colocation=[None, None, "p", "p"])
    >>> colocate_layers(g).colocation
    ['layer0', None, 'layer0', 'layer0']
    """
    # Replicas of a layer (data parallelism) and parts of a split operation stay apart; an operation
    # held to some device kinds stays out of its layer, which could hold others no device has with it.
    layers = [
        None if layer is None or kinds is not None else (layer, extra.get("replica"), extra.get("part"))
        for layer, kinds, extra in zip(graph.layer, graph.device_kinds, graph.node_extra)
    ]
    named = [layer for layer in layers if layer is not None]
    if len(set(named)) == len(named):
        return None
    n = graph.num_nodes
    label = joined_groups(n, layers, graph.colocation)
    sizes = np.bincount(label, minlength=n)
    names = {int(c): f"layer{k}" for k, c in enumerate(dict.fromkeys(label[sizes[label] > 1].tolist()))}
    return graph.replace(colocation=[names.get(int(c)) for c in label])


def colocate_sole_consumers(graph: OpGraph) -> OpGraph | None:
    """The graph with every operation whose outputs only one operation reads in that operation's group.

    Baechi's co-placement grouping: an operation whose outputs go to a single
    consumer gains nothing from another device but a transfer, so it joins its
    consumer's colocation group, and chains of such operations join the group
    at their end. Baechi's code merges the two operations' whole groups; here
    only operations in no group of their own, and free to run on any device
    kind, follow their consumer, so that two groups never join: each new
    group holds at most one original group and runs where that group may.
    The two rules differ only where an operation of a group has its only
    reader outside the group.

    Parameters
    ----------
    graph : OpGraph

    Returns
    -------
    OpGraph or None
        The same nodes and edges with a new ``colocation``: an original group
        keeps its name, a new one is named ``"coplace:<id>"`` after the
        consumer its members follow; None when no operation follows its
        consumer (nothing to colocate).

    Examples
    --------
    >>> g = OpGraph(["w", "t", "mm", "relu", "loss"], [0.0, 0.0, 1.0, 1.0, 1.0], [0, 1, 2, 2, 3], [1, 2, 3, 4, 4],
    ...             [4] * 5, colocation=["p", None, None, None, None])
    >>> colocate_sole_consumers(g).colocation
    ['p', 'coplace:mm', 'coplace:mm', 'coplace:loss', 'coplace:loss']

    References
    ----------
    B. Jeon et al., "Baechi: fast device placement of machine learning graphs",
    ACM SoCC 2020: the co-placement grouping of its public code.
    """
    n = graph.num_nodes
    pairs = np.unique(np.stack([graph.src, graph.dst], axis=1), axis=0)  # distinct (producer, consumer)
    consumers = np.bincount(pairs[:, 0], minlength=n)
    free = np.array([c is None and k is None for c, k in zip(graph.colocation, graph.device_kinds)], dtype=bool)
    follows = pairs[(consumers[pairs[:, 0]] == 1) & free[pairs[:, 0]]]
    if follows.size == 0:
        return None
    label = joined_groups(n, graph.colocation, pairs=(follows[:, 0], follows[:, 1]))
    # Each new group has one member that follows no one (its original group's members, or the chains' end).
    leader = np.ones(n, dtype=bool)
    leader[follows[:, 0]] = False
    names: dict[int, str] = {}
    for i in np.flatnonzero(leader).tolist():
        name = graph.colocation[i] or f"coplace:{graph.ids[i]}"
        names.setdefault(int(label[i]), name)
    sizes = np.bincount(label, minlength=n)
    return graph.replace(
        colocation=[names[c] if sizes[c] > 1 else own for c, own in zip(label.tolist(), graph.colocation)]
    )


#: Colocating changes no node, edge or cost: only colocation labels, by joining groups (never splitting one).
COLOCATION_ENSURES = Ensures(
    compute=SAME,
    output_bytes=SAME,
    param_bytes=SAME,
    temp_bytes=SAME,
    transfers=SAME,
    note="Only colocation changes: groups join, none is split; kinds are untouched.",
)


@register_transform(
    "colocate_layers", requires="Nothing beyond a valid graph.", ensures=COLOCATION_ENSURES, trials=lambda graph: [{}]
)
def colocate_layers_transform(graph: OpGraph, cluster: Cluster | None) -> TransformResult:
    """Every layer in one colocation group (:func:`colocate_layers`): the same nodes, the map the identity.

    Examples
    --------
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8], layer=["fc", "fc"])
    >>> r = colocate_layers_transform(g, None)
    >>> r.graph.colocation, r.changed
    (['layer0', 'layer0'], True)
    >>> colocate_layers_transform(g.replace(layer=None), None).changed    # nothing to colocate
    False
    """
    return TransformResult.identity(graph, colocate_layers(graph))


@register_transform(
    "colocate_sole_consumers",
    requires="Nothing beyond a valid graph.",
    ensures=COLOCATION_ENSURES,
    trials=lambda graph: [{}],
)
def colocate_sole_consumers_transform(graph: OpGraph, cluster: Cluster | None) -> TransformResult:
    """Every operation with its only consumer (:func:`colocate_sole_consumers`): the map the identity.

    Examples
    --------
    >>> g = OpGraph(["a", "b"], [1.0, 1.0], [0], [1], [8])
    >>> colocate_sole_consumers_transform(g, None).graph.colocation
    ['coplace:b', 'coplace:b']
    """
    return TransformResult.identity(graph, colocate_sole_consumers(graph))
