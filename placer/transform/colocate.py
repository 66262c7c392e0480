"""Colocate each layer: keep a layer's forward, backward and update on one device.

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
"""

from __future__ import annotations

import numpy as np

from ..graph import OpGraph, joined_groups

__all__ = ["colocate_layers"]


def colocate_layers(graph: OpGraph) -> OpGraph | None:
    """The graph with every layer, and every colocation group it joins, in one colocation group.

    A layer's replicas in a data-parallel graph (``node_extra["replica"]``)
    and the parts of a split operation (``node_extra["part"]``) count as
    layers of their own, so that colocating does not undo the rewrite.

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
    # Replicas of a layer (data parallelism) and parts of a split operation stay apart.
    layers = [None if layer is None else (layer, extra.get("replica"), extra.get("part"))
              for layer, extra in zip(graph.layer, graph.node_extra)]
    named = [layer for layer in layers if layer is not None]
    if len(set(named)) == len(named):
        return None
    n = graph.num_nodes
    label = joined_groups(n, layers, graph.colocation)
    sizes = np.bincount(label, minlength=n)
    names = {int(c): f"layer{k}" for k, c in enumerate(dict.fromkeys(label[sizes[label] > 1].tolist()))}
    return graph.replace(colocation=[names.get(int(c)) for c in label])
