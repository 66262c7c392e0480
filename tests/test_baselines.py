"""The baselines' own rules (the contract suite checks what every algorithm must hold)."""

import numpy as np
import pytest

from placer import OpGraph, place
from placer.algorithms.baselines import forward_ordered, layer_labels, linked_parts
from placer.algorithms.common import placement_units
from placer.cluster import load_cluster
from placer.errors import InfeasibleError
from placer.generate import training_graph

from .clusters import line_cluster


def _block_between_two_convolutions() -> OpGraph:
    """conv1 -> a parameter-free block op (relu) -> conv3 -> head, each its own layer, 1 s each.

    The convolutions' weights are sources, and each has an update that reads only its weight (like
    Adam's step count): all of them come first in a topological order, ahead of the block's relu.
    """
    ids = ["w1", "w3", "x", "count1", "count3", "conv1", "relu", "conv3", "loss"]
    layer = ["conv1", "conv3", None, "conv1", "conv3", "conv1", "block", "conv3", "head"]
    edges = [
        ("w1", "count1"),
        ("w3", "count3"),
        ("x", "conv1"),
        ("w1", "conv1"),
        ("conv1", "relu"),
        ("relu", "conv3"),
        ("w3", "conv3"),
        ("conv3", "loss"),
    ]
    index = {name: i for i, name in enumerate(ids)}
    compute = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    return OpGraph(
        ids, compute, [index[a] for a, _ in edges], [index[b] for _, b in edges], [4] * len(edges), layer=layer
    )


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


def test_round_robin_skips_a_device_the_last_one_cannot_send_to():
    # d0 - d1 - d2 linked to neighbours only: n3's turn is d0, which n2 on d2 cannot reach (it was refused).
    chain = OpGraph([f"n{i}" for i in range(6)], [1e-3] * 6, [0, 1, 2, 3, 4], [1, 2, 3, 4, 5], [1 << 20] * 5)
    plan = place(chain, line_cluster(["d0", "d1", "d2"]), "round_robin")  # place() validates it
    assert [plan.placement[f"n{i}"] for i in range(6)] == ["d0", "d1", "d2", "d1", "d2", "d1"]


def test_round_robin_names_the_missing_link_where_no_device_is_linked():
    # d0 -> d1 -> d2 one way: 'c' reads 'a' on d0 and 'b' on d2 (their turns), and no device is reached from both.
    # It was placed on d0 anyway, and refused by place()'s check of the plan.
    graph = OpGraph(["a", "x", "b", "c"], [1e-3] * 4, [0, 1, 0, 2], [1, 2, 3, 3], [8] * 4)
    with pytest.raises(
        InfeasibleError,
        match="round_robin: node 'b' would send from 'd2' to node 'c' on 'd0', but no channel connects these devices",
    ):
        place(graph, line_cluster(["d0", "d1", "d2"], both_ways=False), "round_robin")


def test_metis_puts_parts_that_exchange_data_on_linked_devices():
    # METIS numbers its parts freely: two parts of one training step landed on the ends of a line.
    plan = place(training_graph(layers=6, branches=2, seed=1), line_cluster(["d0", "d1", "d2"]), "metis")
    assert len(set(plan.placement.values())) > 1 and plan.predicted["fits"]


def test_linked_parts_relabels_a_chain_of_parts_onto_a_line():
    # Units 0 -> 1 -> 2 in parts 0, 1, 2; devices 0 and 1 are the ends of the line 0 - 2 - 1.
    chain = OpGraph(["a", "b", "c"], [1.0] * 3, [0, 1], [1, 2], [8, 8])
    linked = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=bool)
    parts = linked_parts(np.arange(3), np.arange(3), chain, linked, np.ones(3))
    assert parts.tolist() == [0, 2, 1]
    everywhere = np.ones((3, 3), dtype=bool)
    assert linked_parts(np.arange(3), np.arange(3), chain, everywhere, np.ones(3)).tolist() == [0, 1, 2]
