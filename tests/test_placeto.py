"""Placeto: graph families, Merge-and-Colocate, the policy, REINFORCE training and the algorithm."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from placer.cluster import load_cluster
from placer.errors import OptionError
from placer.generate import random_dag, training_graph
from placer.learn.families import FAMILIES, dataset, family_graph, split_indices
from placer.sim import simulate
from placer.transform.merge import merge_and_colocate


# ------------------------------------------------------------------ families
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_graphs_are_training_steps_with_costs(family):
    g = family_graph(family, 3)
    assert g.name == f"{family}-3"
    assert g.compute_s.sum() > 0 and np.all(np.isfinite(g.compute_s))
    assert all(set(k) == {"A100", "H100"} for k in g.compute_s_by_kind)
    ops = set(g.op)
    assert "aten._foreach_add" in ops and any(o.endswith("_backward") for o in ops)  # backward and update
    # every update is colocated with the variable it writes
    for key, members in g.colocation_groups.items():
        assert sorted(g.op[i] for i in members) == ["aten._foreach_add", "placeholder"], key
    assert family_graph(family, 3).digest() == g.digest()     # reproducible


def test_splits_are_fixed_and_disjoint():
    for family in FAMILIES:
        s = split_indices(family)
        assert len(s["train"]) == len(s["test"]) == 16 and not set(s["train"]) & set(s["test"])
        assert split_indices(family) == s
    names = [g.name for g in dataset("all", "train", count=6)]
    assert [n.split("-")[0] for n in names] == ["image", "rnn", "nmt"] * 2
    with pytest.raises(OptionError, match="family"):
        dataset("vision", "train")
    with pytest.raises(OptionError, match="split"):
        dataset("nmt", "validation")


# ------------------------------------------------------------------ merge
def _check_coarsening(graph, coarse):
    assert coarse.group_of.shape == (graph.num_nodes,)
    cg = coarse.graph
    assert np.isclose(cg.compute_s.sum(), graph.compute_s.sum())
    assert cg.param_bytes.sum() == graph.param_bytes.sum()
    # edges inside a group vanish, edges across groups survive (the coarse graph is a DAG by construction)
    gs, gd = coarse.group_of[graph.src], coarse.group_of[graph.dst]
    assert {(a, b) for a, b in zip(gs.tolist(), gd.tolist()) if a != b} == set(zip(cg.src.tolist(), cg.dst.tolist()))
    # a placement of the coarse graph that keeps its colocation expands to a valid one of the original graph
    device_of = np.zeros(cg.num_nodes, dtype=np.int64)
    for k, (key, members) in enumerate(sorted(cg.colocation_groups.items())):
        device_of[members] = k % 2
    free = np.array([c is None for c in cg.colocation])
    device_of[free] = np.arange(free.sum()) % 2
    simulate(graph, load_cluster("2xV100-nvlink"), coarse.expand(device_of))   # check=True: raises if invalid


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 60), p=st.floats(0.05, 0.9), target=st.integers(1, 30), seed=st.integers(0, 10**6))
def test_merge_keeps_a_dag_and_maps_back(n, p, target, seed):
    graph = random_dag(n, edge_prob=p, seed=seed, colocation_groups=3)
    coarse = merge_and_colocate(graph, target_nodes=target)
    assert coarse.graph.num_nodes >= min(target, n)
    _check_coarsening(graph, coarse)


def test_merge_reaches_target_and_respects_threshold():
    graph = family_graph("nmt", 0)
    coarse = merge_and_colocate(graph, target_nodes=40)
    assert coarse.graph.num_nodes == 40
    _check_coarsening(graph, coarse)
    # with only a threshold, no remaining node is cheaper than it unless no neighbour could take it
    small = merge_and_colocate(graph, cost_threshold=1 << 20)
    assert 40 < small.graph.num_nodes < graph.num_nodes
    assert merge_and_colocate(graph, cost_threshold=0).graph.num_nodes == graph.num_nodes
    with pytest.raises(OptionError, match="target_nodes"):
        merge_and_colocate(graph)
    with pytest.raises(OptionError, match="target_nodes"):
        merge_and_colocate(graph, target_nodes=0)


def test_merge_never_joins_different_device_kinds():
    graph = training_graph(layers=3, branches=2)
    graph = graph.replace(device_kinds=[("V100",) if i % 3 == 0 else None for i in range(graph.num_nodes)])
    coarse = merge_and_colocate(graph, target_nodes=1)
    for g in range(coarse.graph.num_nodes):
        assert len({graph.device_kinds[i] for i in coarse.members(g)}) == 1
