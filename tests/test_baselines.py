"""The baselines' own rules (the contract suite checks what every algorithm must hold)."""

import numpy as np

from placer import OpGraph, place
from placer.algorithms.baselines import forward_ordered, layer_labels
from placer.algorithms.common import placement_units
from placer.cluster import load_cluster


def _block_between_two_convolutions() -> OpGraph:
    """conv1 -> a parameter-free block op (relu) -> conv3 -> head, each its own layer, 1 s each.

    The convolutions' weights are sources, and each has an update that reads only its weight (like
    Adam's step count): all of them come first in a topological order, ahead of the block's relu.
    """
    ids = ["w1", "w3", "x", "count1", "count3", "conv1", "relu", "conv3", "loss"]
    layer = ["conv1", "conv3", None, "conv1", "conv3", "conv1", "block", "conv3", "head"]
    edges = [("w1", "count1"), ("w3", "count3"), ("x", "conv1"), ("w1", "conv1"), ("conv1", "relu"),
             ("relu", "conv3"), ("w3", "conv3"), ("conv3", "loss")]
    index = {name: i for i, name in enumerate(ids)}
    compute = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    return OpGraph(ids, compute, [index[a] for a, _ in edges], [index[b] for _, b in edges], [4] * len(edges),
                   layer=layer)


def test_forward_ordered_puts_a_parameter_free_layer_where_the_data_reaches_it():
    g = _block_between_two_convolutions()
    unit_of, units = placement_units(g, layer_labels(g))
    # Numbered by their first node, units holding a weight come first: the block after both convolutions.
    assert [g.layer[int(u[-1])] for u in units] == ["conv1", "conv3", "block", "head"]
    assert [g.layer[int(u[-1])] for u in forward_ordered(g, unit_of, units)] == ["conv1", "block", "conv3", "head"]


def test_expert_splits_the_layers_contiguously_in_forward_order():
    g = _block_between_two_convolutions()
    plan = place(g, load_cluster("2xV100-nvlink"), "expert")
    device = {name: plan.placement[name] for name in ("conv1", "relu", "conv3", "loss")}
    assert device["conv1"] == device["relu"] != device["conv3"] == device["loss"]
    assert len(np.unique(list(device.values()))) == 2
