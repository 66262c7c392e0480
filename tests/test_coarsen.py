"""Pesto's batch coarsening (Theorem 3.5): acyclic, complete, costs kept, groups whole, transfers unchanged."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer import OpGraph, simulate
from placer.cluster import Channel, Cluster, Device, load_cluster
from placer.errors import OptionError
from placer.generate import random_dag, training_graph
from placer.transform.coarsen import acyclic_matching, coarsen, contract, heights


def quotient_is_acyclic(graph: OpGraph, group_of: np.ndarray) -> bool:
    g = nx.DiGraph()
    g.add_nodes_from(np.unique(group_of).tolist())
    for a, b in zip(group_of[graph.src].tolist(), group_of[graph.dst].tolist()):
        if a != b:
            g.add_edge(a, b)
    return nx.is_directed_acyclic_graph(g)


def test_heights_follow_definition_3_4():
    g = OpGraph(list("abcde"), [1.0] * 5, [0, 1, 0, 3], [1, 2, 2, 4], [1, 1, 1, 1])
    assert heights(g).tolist() == [1, 2, 3, 1, 2]


def test_figure_6_crossing_pairs_are_never_merged_together():
    # A, B -> C, D fully connected: merging (A, C) and (B, D) at once would make a cycle.
    g = OpGraph(list("ABCD"), [1.0] * 4, [0, 0, 1, 1], [2, 3, 2, 3], [5, 4, 4, 5])
    pairs = acyclic_matching(g)
    assert len(pairs) == 1
    group_of = np.arange(4)
    for a, b in pairs:
        group_of[b] = a
    assert quotient_is_acyclic(g, group_of)


def test_matched_pairs_meet_the_theorem_conditions():
    g = random_dag(80, edge_prob=0.4, seed=11)
    h = heights(g)
    succ = {u: set(g.successors(u).tolist()) for u in range(g.num_nodes)}
    pred = {v: set(g.predecessors(v).tolist()) for v in range(g.num_nodes)}
    pairs = acyclic_matching(g)
    assert pairs
    used = [x for p in pairs for x in p]
    assert len(used) == len(set(used))  # (i) a matching
    for u, v in pairs:
        assert v in succ[u]
        type_s = all(h[w] >= h[v] for w in succ[u])
        type_p = all(h[x] <= h[u] for x in pred[v])
        assert type_s or type_p  # (ii), generalised


def test_heaviest_edge_merges_first():
    # a -> b (heavy) and a -> c (light); a can join only one of them.
    g = OpGraph(list("abc"), [1.0] * 3, [0, 0], [1, 2], [10, 99])
    assert acyclic_matching(g) == [(0, 2)]


def test_chain_reaches_the_target():
    n = 16
    g = OpGraph([f"n{i}" for i in range(n)], np.ones(n), np.arange(n - 1), np.arange(1, n), np.ones(n - 1))
    c = coarsen(g, 4)
    assert c.graph.num_nodes == 4
    assert [m.size for m in c.members] == [4, 4, 4, 4]
    assert c.graph.compute_s.tolist() == [4.0] * 4


def test_bad_target_raises_option_error():
    g = training_graph(layers=2)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(OptionError, match="target"):
            coarsen(g, bad)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 60),
    p=st.floats(0.05, 0.9),
    seed=st.integers(0, 10**6),
    groups=st.integers(0, 4),
    frac=st.floats(0.02, 1.0),
    use_labels=st.booleans(),
)
def test_coarsening_is_acyclic_complete_and_keeps_costs(n, p, seed, groups, frac, use_labels):
    g = random_dag(n, edge_prob=p, seed=seed, colocation_groups=groups)
    rng = np.random.default_rng(seed)
    g = g.replace(
        device_kinds=[
            ("V100",) if rng.random() < 0.1 else ("V100", "A100") if rng.random() < 0.1 else None for _ in range(n)
        ]
    )
    labels = rng.integers(0, 3, n) if use_labels else None
    target = max(1, int(n * frac))
    c = coarsen(g, target, labels=labels)
    cg = c.graph
    assert quotient_is_acyclic(g, c.group_of)
    assert sorted(np.concatenate(c.members).tolist()) == list(range(n))
    for k, mem in enumerate(c.members):
        assert np.all(c.group_of[mem] == k)
        position = np.empty(n, dtype=int)
        position[g.topological_order] = np.arange(n)
        assert np.all(np.diff(position[mem]) > 0)  # members in topological order
        if labels is not None:
            assert np.unique(labels[mem]).size == 1
        kinds = [set(g.device_kinds[i]) for i in mem.tolist() if g.device_kinds[i] is not None]
        if kinds:
            assert set(cg.device_kinds[k]) == set.intersection(*kinds) and cg.device_kinds[k]
    assert np.isclose(cg.compute_s.sum(), g.compute_s.sum())
    assert cg.param_bytes.sum() == g.param_bytes.sum()
    # Every original edge between two coarse nodes is a coarse edge.
    coarse_edges = set(zip(cg.src.tolist(), cg.dst.tolist()))
    for a, b in zip(c.group_of[g.src].tolist(), c.group_of[g.dst].tolist()):
        assert a == b or (a, b) in coarse_edges
    # Colocation groups stay whole: all members of an original group share one coarse group label.
    for members in g.colocation_groups.values():
        labels_seen = {cg.colocation[k] for k in c.group_of[members].tolist()}
        assert len(labels_seen) == 1 and None not in labels_seen


def test_coarse_transfers_are_the_original_ones():
    g = random_dag(40, edge_prob=0.5, seed=5)
    c = coarsen(g, 12)
    cluster = load_cluster("4xGPU-pcie")
    rng = np.random.default_rng(0)
    for _ in range(5):
        coarse_place = rng.integers(0, 4, c.graph.num_nodes)
        fine = simulate(g, cluster, c.expand(coarse_place))
        rough = simulate(c.graph, cluster, coarse_place)
        assert sorted(fine.transfers.nbytes.tolist()) == sorted(rough.transfers.nbytes.tolist())
        assert sorted(c.group_of[fine.transfers.producer].tolist()) == sorted(rough.transfers.producer.tolist())


def test_contract_sums_times_per_kind_with_a_cluster():
    g = OpGraph(["a", "b"], [2.0, 4.0], [0], [1], [1], compute_s_by_kind=[{"A100": 0.5}, None])
    devices = [Device("v", "V100", 1 << 30), Device("a", "A100", 1 << 30, speed=2.0)]
    cluster = Cluster("mixed", devices, [Channel("v-a", 1e9, 0.0, (("v", "a"), ("a", "v")))])
    assert g.durations(cluster).sum(axis=0).tolist() == [6.0, 2.5]
    coarse, _ = contract(g, np.array([0, 0]), cluster=cluster)
    assert coarse.durations(cluster)[0].tolist() == g.durations(cluster).sum(axis=0).tolist()
    coarse, _ = contract(g, np.array([0, 0]))
    assert coarse.compute_s_by_kind == [None] and coarse.compute_s.tolist() == [6.0]


def test_training_graph_coarsens_to_target_quickly():
    g = training_graph(layers=40, branches=3, seed=0)
    c = coarsen(g, 100)
    assert c.graph.num_nodes == 100
    assert quotient_is_acyclic(g, c.group_of)


def test_a_joined_group_takes_a_name_no_group_of_the_graph_has():
    # Groups "a" and "b" share a coarse node; an unrelated group is named "a|b" already.
    graph = OpGraph(
        ["p", "q", "r"],
        [1.0, 1.0, 1.0],
        [0],
        [1],
        [8],
        colocation=["a", "b", "a|b"],
        device_kinds=[("A",), ("A",), ("B",)],
    )
    coarse, _ = contract(graph, np.array([0, 0, 1]))
    assert {k: v.tolist() for k, v in coarse.colocation_groups.items()} == {"a|b~1": [0], "a|b": [1]}
